"""`ferry load --device A,B,...`: one process onto several devices (host memory stands in for GPUs
here; the route is the one GPUs take, with memcpy for NCCL). Each device's hashes equal a
single-device load's; the checkpoint is read once."""
import json

import numpy as np
import xxhash

from conftest import parse_hash_lines, reference, write_safetensors

MODEL = {
    "model.embed_tokens.weight": ("bfloat16", [37, 24]),
    "model.layers.0.self_attn.q_proj.weight": ("bfloat16", [25, 24]),
    "model.layers.0.self_attn.o_proj.weight": ("float32", [24, 25]),
    "model.layers.0.input_layernorm.weight": ("float32", [24]),
    "lm_head.weight": ("float16", [37, 24]),
}


def per_device(stdout):
    """--hash lines of a multi-device load -> {device: [(name, dtype, shape, hex)]}."""
    out = {}
    for line in stdout.splitlines():
        device, rest = line.split("\t", 1)
        out.setdefault(device, []).append(parse_hash_lines(rest)[0])
    return out


def test_replicas_on_three_devices_equal_a_single_load(run_ferry, tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", MODEL)
    single = run_ferry("load", path, "--device", "cpu", "--hash")
    multi = run_ferry("load", path, "--device", "cpu,cpu,cpu", "--hash", "--round-mib", "1")
    assert single.returncode == 0 and multi.returncode == 0, multi.stderr
    ranks = per_device(multi.stdout)
    assert list(ranks) == ["cpu"]  # three ranks, all named cpu: their lines follow each other
    lines = ranks["cpu"]
    want = parse_hash_lines(single.stdout)
    assert lines == want * 3
    assert "read from storage" in multi.stderr and "(1.000 x the checkpoint)" in multi.stderr


def test_tensor_parallel_slices_match_numpy(run_ferry, tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", MODEL)
    ref = reference(path)
    r = run_ferry("load", path, "--device", "cpu,cpu", "--tensor-parallel", "--hash")
    assert r.returncode == 0, r.stderr
    rows = parse_hash_lines("\n".join(l.split("\t", 1)[1] for l in r.stdout.splitlines()))
    got = {}
    for name, dtype, shape, digest in rows:
        got.setdefault(name, []).append((shape, digest))
    import pathlib
    import safetensors
    # Bytes shaped [..., element bytes], so that numpy slices any dtype (bf16 too).
    arrays = {name: np.frombuffer(bytes(info["data"]), np.uint8).reshape(
                  list(info["shape"]) + [-1])
              for name, info in safetensors.deserialize(pathlib.Path(path).read_bytes())}
    for name, (dtype, shape, digest, _) in ref.items():
        a = arrays[name]
        dim = 1 if "o_proj" in name else (-1 if "layernorm" in name else 0)
        parts = [a] * 2 if dim < 0 else np.array_split(a, 2, axis=dim)
        want = [(list(p.shape[:-1]), xxhash.xxh3_64_hexdigest(np.ascontiguousarray(p).tobytes()))
                for p in parts]
        assert got[name] == want, name


def test_json_reports_ranks_links_and_bytes_read_once(run_ferry, tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", MODEL)
    r = run_ferry("load", path, "--device", "cpu,cpu", "--json", "--io", "buffered")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)[0]
    assert stats["bytes_read"] == stats["checkpoint_bytes"] == sum(v[3] for v in reference(path).values())
    assert [x["device"] for x in stats["ranks"]] == ["cpu", "cpu"]
    assert sum(x["link_bytes"] for x in stats["ranks"]) == stats["checkpoint_bytes"]
    assert stats["collective"] == "host memcpy"


def test_bad_device_lists_are_clear_errors(run_ferry, tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", MODEL)
    r = run_ferry("load", path, "--device", "cuda:0,cuda:0")
    assert r.returncode == 1 and "cuda:0 is listed twice" in r.stderr
    r = run_ferry("load", path, "--device", "cpu,cuda:0")
    assert r.returncode == 1 and "cannot be mixed" in r.stderr
    r = run_ferry("load", path, "--device", "cpu", "--tensor-parallel")
    assert r.returncode == 1 and "needs several devices" in r.stderr
    r = run_ferry("load", path, "--device", "cpu,cpu", "--backend", "cufile")
    assert r.returncode == 1 and "staged path" in r.stderr
