"""vLLM's load formats on a GPU, ferry's among them: time from LLM(...) to ready, the weight
loading vLLM logs ("Loading weights took ...", where the format logs it) and the whole model
loading ("Model loading took ...", every format), each format in a fresh process after one
untimed start that fills the kernel caches (--no-warmup: none), warm (files in the page cache)
and cold (their pages dropped with posix_fadvise); ferry's greedy tokens must equal
safetensors'. The checkpoint: Llama-3-8B's shape with random weights (names and shapes from
transformers' LlamaForCausalLM built on the meta device), written once as safetensors shards.

    VLLM_ATTENTION_BACKEND=TRITON_ATTN VLLM_USE_FLASHINFER_SAMPLER=0 \
        python bench/load/vllm_gpu.py --dir /tmp/llama8b [--tp 2] [--formats ferry-own,ferry,safetensors,...] [--states warm|cold] [--log-dir DIR]
        [--budget-s 480]

A format "ferry:MODE" is load format ferry with model_loader_extra_config {"tp_mode": MODE}
(process_group, slices, each_rank_reads_all; plain "ferry" under --tp > 1 is the loader's
default), "ferry:MODE:COMMUNICATOR" also {"tp_communicator": COMMUNICATOR} (auto, torch or vllm),
and "+KEY=VALUE" after either adds that key (e.g. "ferry:group_slices+group_bytes=4294967296").
"ferry-own" is ferry's own load outside vLLM: ferry.torch onto cuda:0, or with --tp > 1 the CLI's
tensor-parallel load onto that many GPUs (--ferry-cli).
--budget-s: a format is skipped (and said so) when the slowest start so far would end past it.

--kv-spec (instead of the load formats): time to first token of a --kv-tokens (+1) prompt (random
token ids) served again from ferry's KV offloading spec (FerryOffloadingConnector, store under
--kv-root) after its blocks left GPU memory (reset_prefix_cache), against recomputing it and
against vLLM's own GPU prefix cache, whose greedy tokens ferry's must equal: see kv_spec_child.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: shared helpers
from common import drop_tree_cache, read_through, warm_page_cache  # noqa: E402

FORMATS = ["ferry-own", "ferry", "safetensors", "fastsafetensors", "runai_streamer",
           "instanttensor"]
PROMPT = list(range(1000, 1032))


def write_checkpoint(folder: str, shard_bytes: int = 5 << 30) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    if os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        return
    os.makedirs(folder, exist_ok=True)
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, torch_dtype="bfloat16", tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in transformers.LlamaForCausalLM(config).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shard, size, weight_map, index = {}, 0, {}, 0

    def flush():
        nonlocal shard, size, index
        if shard:
            index += 1
            name = f"model-{index:05d}.safetensors"
            save_file({k: v.cpu() for k, v in shard.items()}, os.path.join(folder, name),
                      {"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, size = {}, 0

    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
        else:
            tensor = (torch.randn(shape, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        if size + tensor.numel() * 2 > shard_bytes:
            flush()
        shard[name] = tensor
        size += tensor.numel() * 2
    flush()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config.save_pretrained(folder)


def _run_child(command, env, timeout: float) -> subprocess.CompletedProcess:
    """The child in a session of its own: past `timeout` it and the processes it started (vLLM's
    engine core, its workers) are killed, so the next child finds the GPUs free."""
    import signal
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\nkilled after {timeout:.0f} s (--budget-s)"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def own_tensor_parallel(folder: str, tp: int, cli: str) -> None:
    """ferry's own tensor-parallel load of the checkpoint onto cuda:0 .. cuda:tp-1 (the CLI, one
    process, the slices vLLM takes, the GPUs sharing each byte over NCCL): prints one RESULT line
    with the load's seconds as the CLI reports them and the process's wall time."""
    devices = ",".join(f"cuda:{i}" for i in range(tp))
    started = time.perf_counter()
    done = subprocess.run([cli, "load", folder, "--device", devices, "--tensor-parallel"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    print(done.stdout + done.stderr, file=sys.stderr)
    found = re.search(r"^loaded .* in ([0-9.]+) s", done.stdout + done.stderr, re.MULTILINE)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{cli} load --tensor-parallel failed (exit {done.returncode})")
    seconds = float(found.group(1))
    print("RESULT " + json.dumps({"format": "ferry-own", "ready_s": wall, "own_s": seconds,
                                  "tokens": []}), flush=True)


def _loader_config(load_format: str):
    """(vLLM's load format, its model_loader_extra_config) of a format
    "NAME[:MODE[:COMMUNICATOR]][+KEY=VALUE...]"."""
    base, *options = load_format.split("+")
    name, _, mode = base.partition(":")
    mode, _, communicator = mode.partition(":")
    config = {"tp_mode": mode} if mode else {}
    if communicator:
        config["tp_communicator"] = communicator
    for option in options:
        key, _, value = option.partition("=")
        config[key] = int(value) if value.isdigit() else value
    return name, config


def child(folder: str, load_format: str, tp: int, cli: str = "") -> None:
    """One LLM(...) in this process: prints one JSON line with its times and greedy tokens.
    load_format "ferry-own": ferry's own load of the checkpoint outside vLLM (to cuda:0; with
    tp > 1 its tensor-parallel load onto tp GPUs, through the CLI `cli`)."""
    if load_format == "ferry-own" and tp > 1:
        return own_tensor_parallel(folder, tp, cli)
    if load_format == "ferry-own":
        import torch
        import ferry.torch
        started = time.perf_counter()
        tensors, _ = ferry.torch.load_with_stats(folder, "cuda:0")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        print("RESULT " + json.dumps({"format": load_format, "ready_s": seconds,
                                      "own_s": seconds, "tokens": []}), flush=True)
        return
    from vllm import LLM, SamplingParams
    name, config = _loader_config(load_format)
    extra = {"model_loader_extra_config": config} if config else {}
    started = time.perf_counter()
    llm = LLM(model=folder, load_format=name, tensor_parallel_size=tp,
              skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.85,
              max_model_len=4096, **extra)
    ready = time.perf_counter() - started
    out = llm.generate([{"prompt_token_ids": PROMPT}],
                       SamplingParams(temperature=0.0, max_tokens=16, detokenize=False))
    print("RESULT " + json.dumps({"format": load_format, "ready_s": ready,
                                  "tokens": list(out[0].outputs[0].token_ids)}), flush=True)


def _prompt(seed: int, tokens: int) -> list:
    import random
    rng = random.Random(seed)
    return [rng.randrange(1000, 128000) for _ in range(tokens)]


def _timed(llm, prompt, max_tokens: int):
    from vllm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    started = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    return time.perf_counter() - started, out


def _slabs(root: str) -> list:
    import glob
    return sorted(glob.glob(os.path.join(root, "**", "slab-*"), recursive=True))


def kv_spec_child(folder: str, tokens: int, root: str, arm: str, store: dict) -> None:
    """One LLM(...) (engine in this process, VLLM_ENABLE_V1_MULTIPROCESSING=0, so that ferry's
    worker and its counters are reachable). The prompt is `tokens` + 1 long: served from a cache,
    its `tokens` // block_size full blocks come from the cache and one token is computed, the
    same work whichever cache serves it, so the greedy tokens must be equal.
    arm "gpu": vLLM's own prefix cache, no connector: time to first token (max_tokens=1) of two
    fresh prompts (recomputing), then the prompt served from the GPU's prefix cache.
    arm "ferry": ferry's spec; the prompt generated once (its blocks stored), the engine stepped
    until ferry stored them, reset_prefix_cache() (the GPU's copies gone), then time to first
    token with the store's files in the page cache (warm: the first get), again (a later get:
    with page_cache_pin, from the windows registered after the first) and with the files dropped
    from the page cache (cold), the prefix hit (num_cached_tokens) and the blocks ferry loaded
    each time. Both arms first run another prompt of the same length (the kernels compile
    then)."""
    from vllm import LLM
    kwargs = dict(model=folder, load_format="safetensors", skip_tokenizer_init=True,
                  enforce_eager=True, gpu_memory_utilization=0.85, max_model_len=tokens + 256,
                  enable_prefix_caching=True)
    prompt, other = _prompt(1, tokens + 1), _prompt(2, tokens + 1)
    result = {"arm": arm, "tokens_in": tokens + 1}
    if arm == "gpu":
        llm = LLM(**kwargs)
        _timed(llm, other, 1)
        result["ttft_s"] = [_timed(llm, _prompt(seed, tokens + 1), 1)[0] for seed in (3, 4)]
        result["tokens_first"] = list(_timed(llm, prompt, 8)[1].outputs[0].token_ids)
        seconds, out = _timed(llm, prompt, 1)
        result["ttft_hit_s"], result["hit_tokens"] = seconds, out.num_cached_tokens
        result["tokens"] = list(_timed(llm, prompt, 8)[1].outputs[0].token_ids)
        print("RESULT " + json.dumps(result), flush=True)
        return
    import shutil
    import ferry.vllm
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    ferry.vllm.register()  # what the plugin entry point does, before the connector is looked up
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    config = KVTransferConfig(
        kv_connector="FerryOffloadingConnector", kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"spec_name": "FerryOffloadingSpec", "root": root, **store})
    llm = LLM(kv_transfer_config=config, **kwargs)
    worker = get_kv_transfer_group().connector_worker.worker
    block = llm.llm_engine.vllm_config.cache_config.block_size
    _timed(llm, other, 1)
    _, first = _timed(llm, prompt, 8)
    result["tokens_first"] = list(first.outputs[0].token_ids)
    want = 2 * (tokens // block)  # both prompts' full blocks
    seen, still = -1, time.monotonic()
    while worker.counters["stored_blocks"] < want and time.monotonic() - still < 10:
        _timed(llm, [7, 8, 9], 1)  # engine steps collect the finished stores
        time.sleep(0.05)
        if worker.counters["stored_blocks"] != seen:
            seen, still = worker.counters["stored_blocks"], time.monotonic()
    result["blocks_per_prompt"] = tokens // block
    result["stored_blocks"] = worker.counters["stored_blocks"]
    result["store_files_bytes"] = sum(os.path.getsize(f) for f in _slabs(root))
    for state in ("warm", "again", "cold"):
        result[f"reset_{state}"] = llm.reset_prefix_cache()
        if state == "warm":
            read_through(_slabs(root))
        elif state == "again":  # a later get: what the first asked to register is registered
            for _ in range(6000):
                if not worker._store.stats().get("page_cache_windows_pending"):
                    break
                time.sleep(0.01)
        else:
            drop_tree_cache(root)
        loaded, busy = worker.counters["loaded_blocks"], worker.counters["load_seconds"]
        before = worker._store.stats()
        seconds, out = _timed(llm, prompt, 1)
        after = worker._store.stats()
        # Where the store's time went during this get (its statistics' seconds and bytes).
        result[f"store_{state}"] = {k: round(after[k] - before[k], 4) for k in after
                                    if k.endswith(("_seconds", "_bytes", "_copies"))
                                    and isinstance(after[k], (int, float))
                                    and after[k] != before[k]}
        result[f"ttft_{state}_s"] = seconds
        result[f"hit_{state}_tokens"] = out.num_cached_tokens
        result[f"loaded_{state}_blocks"] = worker.counters["loaded_blocks"] - loaded
        result[f"load_job_{state}_s"] = worker.counters["load_seconds"] - busy
    result["reset_again"] = llm.reset_prefix_cache()
    result["tokens"] = list(_timed(llm, prompt, 8)[1].outputs[0].token_ids)
    result["counters"] = {k: (dict(v) if isinstance(v, dict) else v)
                          for k, v in worker.counters.items()}
    print("RESULT " + json.dumps(result), flush=True)


def _kv_arm(args, arm: str, store: str) -> dict:
    # The checkpoint's config says 8192 positions; RoPE runs past them on random weights.
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    done = _run_child([sys.executable, __file__, "--dir", args.dir, "--kv-root", args.kv_root,
                       "--kv-tokens", str(args.kv_tokens), "--kv-store", store,
                       "--child", "kv-" + arm], env, args.budget_s)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-25:]
        print(f"kv spec, {arm}: failed, exit {done.returncode}:\n  " + "\n  ".join(tail))
        sys.exit(1)
    print(f"kv spec, {arm} {store if arm == 'ferry' else ''}: {line[7:]}", flush=True)
    return json.loads(line[7:])


def kv_spec(args) -> None:
    """vLLM's GPU prefix cache once, then ferry's spec with each --kv-store configuration."""
    stores = args.kv_store or ['{"capacity_bytes": 8589934592}']
    gpu = _kv_arm(args, "gpu", stores[0])
    recompute = min(gpu["ttft_s"])
    print(f"KV spec, {gpu['tokens_in']}-token prompt: time to first token")
    print(f"  recompute                 {recompute:7.3f} s")
    hit = gpu["ttft_hit_s"]
    print(f"  vLLM's GPU prefix cache   {hit:7.3f} s  ({hit / recompute:.2f} x recompute; "
          f"prefix hit {gpu['hit_tokens']} tokens)", flush=True)
    failed = False
    for store in stores:
        ferry = _kv_arm(args, "ferry", store)
        print(f"  ferry's spec, store {store}:")
        for state in ("warm", "again", "cold"):
            t = ferry[f"ttft_{state}_s"]
            print(f"    store {state:4s}  {t:7.3f} s  ({t / recompute:.2f} x recompute; prefix hit "
                  f"{ferry[f'hit_{state}_tokens']} tokens, {ferry[f'loaded_{state}_blocks']} "
                  f"blocks loaded by ferry in {ferry[f'load_job_{state}_s']:.3f} s of its jobs)")
            print(f"      the store during it: {ferry[f'store_{state}']}")
            if state == "cold" and ferry[f"store_{state}"].get("page_cache_dma_bytes"):
                print("      (not cold: the page-cache windows registered after the first get pin "
                      "their pages, which dropping the cache leaves)")
        print(f"    stored {ferry['stored_blocks']} blocks, "
              f"{ferry['store_files_bytes'] / 2**30:.2f} GiB of slab files; counters "
              f"{ferry['counters']}")
        first = gpu["tokens_first"] == ferry["tokens_first"]
        served = gpu["tokens"] == ferry["tokens"]
        print(f"    greedy tokens, computed: vLLM arm == ferry arm: {first}")
        print(f"    greedy tokens, served from a cache: vLLM's GPU prefix cache == ferry: {served}",
              flush=True)
        if not (first and served):
            print(f"    computed: vLLM {gpu['tokens_first']}  ferry {ferry['tokens_first']}\n"
                  f"    served:   vLLM {gpu['tokens']}  ferry {ferry['tokens']}")
            failed = True
    if failed:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/llama8b")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--states", default="warm,cold")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--log-dir", help="keep each start's whole log here (FORMAT-STATE-tpN.log, ':' as '-')")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the untimed first start that fills the kernel caches")
    parser.add_argument("--kv-spec", action="store_true")
    parser.add_argument("--kv-root", default="/tmp/ferry-kv-bench")
    parser.add_argument("--kv-tokens", type=int, default=16384)
    parser.add_argument("--kv-store", action="append",
                        help="the spec's store options (JSON): capacity_bytes, page_cache_pin, "
                        "...; repeat it to compare (default: 8 GiB, nothing else)")
    parser.add_argument("--ferry-cli", default=shutil.which("ferry") or "/tmp/build/cli/ferry",
                        help="the ferry CLI of ferry-own's tensor-parallel load (--tp > 1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "write":
        return write_checkpoint(args.dir)
    if args.child and args.child.startswith("kv-"):
        return kv_spec_child(args.dir, args.kv_tokens, args.kv_root, args.child[3:],
                             json.loads(args.kv_store[-1]))
    if args.child:
        return child(args.dir, args.child, args.tp, args.ferry_cli)
    os.environ.setdefault("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    started = time.monotonic()
    # In a process of its own: the GPU memory it takes is gone before vLLM starts.
    subprocess.run([sys.executable, __file__, "--dir", args.dir, "--child", "write"], check=True)
    print(f"checkpoint ready in {time.monotonic() - started:.0f} s", flush=True)
    if args.kv_spec:
        return kv_spec(args)
    slowest = 0.0
    # One GPU: vLLM's engine in the child itself (no second process importing vLLM again); the
    # weight loading is timed from vLLM's log either way.
    env = dict(os.environ)
    if args.tp == 1:
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rows = []
    if args.warmup:
        # The first vLLM start on a machine compiles and caches kernels (Triton's, vLLM's): one
        # untimed start first, so that every timed format finds the same caches.
        began = time.monotonic()
        done = _run_child([sys.executable, __file__, "--dir", args.dir, "--tp", str(args.tp),
                           "--child", "safetensors"], env, args.budget_s)
        slowest = time.monotonic() - began
        print(f"warm-up start (safetensors, not timed): {slowest:.0f} s, exit "
              f"{done.returncode}", flush=True)
    for state in args.states.split(","):
        for fmt in args.formats.split(","):
            if time.monotonic() - started + slowest > args.budget_s:
                print(f"{fmt} ({state}): skipped, the slowest start so far ({slowest:.0f} s) "
                      f"would end past --budget-s {args.budget_s:.0f}", flush=True)
                continue
            began = time.monotonic()
            if state == "cold":
                drop_tree_cache(args.dir)
            else:  # warm: the files read once into the page cache
                warm_page_cache(args.dir)
            done = _run_child([sys.executable, __file__, "--dir", args.dir, "--tp",
                               str(args.tp), "--ferry-cli", args.ferry_cli, "--child", fmt], env,
                              args.budget_s + 60 - (time.monotonic() - started))
            slowest = max(slowest, time.monotonic() - began)
            if args.log_dir:  # vLLM's whole log of the start, for where its time went
                os.makedirs(args.log_dir, exist_ok=True)
                name = re.sub(r"[^A-Za-z0-9_.-]", "-", fmt)  # the device tool returns only plain names
                with open(os.path.join(args.log_dir, f"{name}-{state}-tp{args.tp}.log"), "w") as f:
                    f.write(done.stdout + done.stderr)
            result = next((json.loads(l[7:]) for l in done.stdout.splitlines()
                           if l.startswith("RESULT ")), None)
            if result is None:
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                print(f"{fmt} ({state}): failed, exit {done.returncode}:\n  " + "\n  ".join(tail))
                continue
            # vLLM logs it in the process that loads (the engine core, each rank's worker): the
            # weights (formats built on DefaultModelLoader, and ferry's), and for every format the
            # whole model load (the model built, its weights loaded and processed).
            log = done.stdout + done.stderr
            loading = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) s", log)]
            model = [float(x) for x in re.findall(r"Model loading took [0-9.]+ GiB (?:memory )?and "
                                                  r"([0-9.]+) seconds", log)]
            result["load_s"] = max(loading) if loading else result.get("own_s")
            result["model_load_s"] = max(model) if model else result.get("own_s")
            result["state"] = state
            rows.append(result)
            load = f"{result['load_s']:.2f}" if result["load_s"] is not None else "?"
            whole = (f"{result['model_load_s']:.2f}" if result["model_load_s"] is not None
                     else "?")
            # Load format ferry under TP logs each rank's mode, file bytes read and, for the
            # group's modes, its reader threads a round (the node's ranks share them).
            reads = sorted(re.findall(r"ferry: tp_mode (\w+), rank (\d+) of \d+ read (\d+) bytes"
                                      r"(?:[^\n]*? with (\d+) reader threads a round)?",
                                      done.stdout + done.stderr), key=lambda r: int(r[1]))
            per_rank = (f"  {reads[0][0]}: GB read per rank "
                        + " ".join(f"{int(r[2]) / 1e9:.2f}" for r in reads)) if reads else ""
            if reads and all(r[3] for r in reads):
                per_rank += ", reader threads a round " + " ".join(r[3] for r in reads)
            print(f"{fmt:16s} {state:5s} tp={args.tp}  LLM() to ready {result['ready_s']:7.2f} s  "
                  f"weights {load} s  model loading {whole} s{per_rank}", flush=True)
    by = {(r["format"], r["state"]): r for r in rows}
    failed = False
    for state in args.states.split(","):
        b = by.get(("safetensors", state))
        for fmt in [f for f in args.formats.split(",") if f.startswith("ferry")
                    and f != "ferry-own"]:
            a = by.get((fmt, state))
            if a and b:
                same = a["tokens"] == b["tokens"]
                print(f"greedy tokens {fmt} == safetensors ({state}): {same}")
                if not same:
                    print(f"  {fmt:11s} {a['tokens']}\n  safetensors {b['tokens']}")
                    failed = True
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
