"""Load format "ferry" under tensor parallelism in the real vllm (skipped without it): two
processes in vLLM's TP group over gloo on the CPU (vllm_tp_worker.py), vLLM's Llama and Qwen2
built with TP=2; in every tp_mode each rank's parameters equal those "safetensors" gives, bit for
bit, and the bytes each rank reads are as the mode says: process_group reads each byte once
between the ranks (group_slices too, each rank receiving only its slices), slices only this
rank's slices, each_rank_reads_all everything. Where vLLM shards otherwise than ferry's rule (one
KV head for two ranks: vLLM copies it to both), "slices" and "group_slices" stop with an error,
never wrong weights, and "auto" loads again through process_group (every rank, saying so), its
weights equal; "auto" on a checkpoint out of the page cache loads through process_group at once.
No tp_mode is auto; no tp_mode with an engine option is process_group."""
import json
import os
import socket
import subprocess
import sys

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
pytest.importorskip("vllm")

import vllm_helpers  # noqa: E402,F401  (VLLM_TARGET_DEVICE=cpu)
import torch  # noqa: E402
import transformers  # noqa: E402

import ferry  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(folders, ranks=2):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_tp_worker.py"), str(r),
                               str(ranks), str(port)] + [str(f) for f in folders],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(ranks)]
    results, logs = [], []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        assert p.returncode == 0 and line, text[-4000:]
        results.append(json.loads(line[7:]))
        logs.append(text)
    return results, logs


def tensor_bytes(folder) -> int:
    return sum(t[3] for t in ferry.Checkpoint.open(ferry_path(folder)).tensors())


def ferry_path(folder):
    index = folder / "model.safetensors.index.json"
    return str(index if index.exists() else folder / "model.safetensors")


def test_tensor_parallel_modes(tmp_path):
    torch.manual_seed(3)
    llama = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=128)
    qwen = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=128,
                                    tie_word_embeddings=True)
    # One KV head for two ranks: vLLM copies it to both, ferry's rule would split it.
    one_kv = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=1, max_position_embeddings=128)
    folders = [tmp_path / "llama", tmp_path / "qwen2", tmp_path / "one_kv"]
    transformers.LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(folders[0])
    transformers.Qwen2ForCausalLM(qwen).to(torch.bfloat16).save_pretrained(
        folders[1], max_shard_size="40KB")
    transformers.LlamaForCausalLM(one_kv).to(torch.bfloat16).save_pretrained(folders[2])

    results, logs = run_ranks(folders)
    # vLLM's log says what each rank did (ferry's lines go where vLLM's go).
    for rank, text in enumerate(logs):
        assert f"ferry: tp_mode process_group, rank {rank} of 2 read " in text, text[-3000:]
        assert "(collectives on torch's communicator)" in text, text[-3000:]
        assert "tp_communicator auto: torch's communicator on the group's device group, as " \
            "vLLM runs without one here (VLLM_DISABLE_PYNCCL" in text, text[-3000:]
        assert "Loading weights took" in text
    for folder in folders:
        total = tensor_bytes(folder)
        rows = [r[str(folder)] for r in results]
        # TP=2 indeed: rank 0's qkv_proj holds half of the query heads.
        assert rows[0]["shapes"]["model.layers.0.self_attn.qkv_proj.weight"][0] == 64
        for mode in ("process_group", "each_rank_reads_all"):
            for rank, row in enumerate(rows):
                assert row[mode].get("equal") is True, (folder.name, mode, rank, row[mode])
                assert row[mode]["tp_mode"] == mode
        # Each byte once between the ranks (a rank reads at most an aligned block more).
        read = [row["process_group"]["bytes_read"] for row in rows]
        assert sum(read) >= total and all(r < total for r in read), (read, total)
        if folder.name != "one_kv":
            for rank, row in enumerate(rows):
                assert row["group_slices"].get("equal") is True, (folder.name, rank, row)
                assert row["group_slices"]["tp_mode"] == "group_slices"
            read = [row["group_slices"]["bytes_read"] for row in rows]
            assert sum(read) >= total and all(r < total for r in read), (read, total)
        # The group's ranks share this machine's reader threads (vLLM's local world: 2 ranks);
        # threads given in the options stay as given.
        for row in rows:
            for mode in ("process_group", "group_slices", "auto", "default"):
                if "error" in row[mode]:  # group_slices where vLLM shards otherwise (one_kv)
                    continue
                why = row[mode]["settings_source"] or ""
                assert "this rank's share of" in why and "(2 ranks, " in why, (mode, why)
            assert "share" not in (row["default_with_threads"]["settings_source"] or "")
        assert all(row["each_rank_reads_all"]["bytes_read"] == total for row in rows)
        # auto (the default, with engine options too, and on a checkpoint out of the page
        # cache): group_slices, each byte read once between the ranks.
        defaults = ("auto", "default", "default_with_threads", "auto_cold")
        if folder.name == "one_kv":
            for row in rows:
                for mode in ("slices", "group_slices"):
                    assert "error" in row[mode], row[mode]
                    assert "k_proj" in row[mode]["error"] or "qkv_proj" in row[mode]["error"]
                    assert f"tp_mode \"{mode}\"" in row[mode]["error"]
                    assert "tp_mode \"process_group\"" in row[mode]["error"]
                # The group's slices, found not to fit, then the load through the group.
                for mode in defaults:
                    assert row[mode].get("equal") is True, row[mode]
                    assert row[mode]["tp_mode"] == "process_group"
                    assert 0 < row[mode]["slices_bytes_read"] < total
        else:
            for rank, row in enumerate(rows):
                for mode in ("slices",) + defaults:
                    assert row[mode].get("equal") is True, (folder.name, rank, mode, row[mode])
                    assert row[mode]["tp_mode"] == ("slices" if mode == "slices"
                                                    else "group_slices")
                    assert row[mode]["bytes_read"] < total
                for mode in defaults:
                    assert row[mode]["slices_bytes_read"] is None
                # Nothing on vLLM's device group: with NCCL, torch would start a communicator
                # there whose buffers stay on the GPU (vLLM's KV cache the smaller for them).
                # (The group's modes use vLLM's own communicator where it has one: not here.)
                for mode in ("slices", "each_rank_reads_all"):
                    assert row[mode]["device_group_calls"] == [], (folder.name, mode, row[mode])
            read = [row["auto"]["bytes_read"] for row in rows]
            assert sum(read) >= total, (read, total)
        # The group's load runs on vLLM's own NCCL communicator where it has one (auto, the
        # default) or when told to (vllm); on the CPU there is none: auto takes torch's
        # communicator of the device group (the log says why), vllm is an error saying so.
        for row in rows:
            for mode in ("process_group", "torch_communicator"):
                assert row[mode].get("equal") is True, row[mode]
                assert row[mode]["tp_communicator"] == "torch", row[mode]
                assert "broadcast" in row[mode]["device_group_calls"] or \
                    "all_gather" in row[mode]["device_group_calls"], row[mode]
            error = row["vllm_communicator"].get("error", "")
            assert "tp_communicator \"vllm\"" in error and "VLLM_DISABLE_PYNCCL" in error, error
            assert "tp_communicator \"torch\"" in error, error
            error = row["no_such_communicator"].get("error", "")
            assert "'mpi' is not one of ['auto', 'torch', 'vllm']" in error, error
        # The cold rows did start from a checkpoint out of the page cache (tmpfs keeps it).
        for row in rows:
            assert 0 <= row["auto_cold"]["cached_after_eviction"] <= 1, row["auto_cold"]
    for text in logs:  # the one-KV-head model's loads under auto, the defaults and auto_cold
        assert text.count("tp_mode auto: vLLM shards this model otherwise") == 4, text[-3000:]


def test_auto_takes_vllms_communicator_only_where_it_can_carry_the_load():
    """tp_communicator auto's rule: vLLM's NCCL communicator where vLLM holds an enabled one on
    the load's GPU (GPU machine: docs/vllm.md), and why not otherwise (then torch's)."""
    from types import SimpleNamespace

    from ferry.vllm.tp import vllm_communicator_missing
    on_gpu0 = SimpleNamespace(disabled=False, device=torch.device("cuda", 0))
    assert vllm_communicator_missing(on_gpu0, "cuda:0") == ""
    assert "VLLM_DISABLE_PYNCCL" in vllm_communicator_missing(None, "cuda:0")
    assert "VLLM_DISABLE_PYNCCL" in vllm_communicator_missing(
        SimpleNamespace(disabled=True, device=torch.device("cuda", 0)), "cuda:0")
    assert vllm_communicator_missing(on_gpu0, "cpu") == "the load is onto cpu"
    assert "on cuda:0, the load onto cuda:1" in vllm_communicator_missing(on_gpu0, "cuda:1")
