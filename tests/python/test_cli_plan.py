"""`ferry plan`: which blocks of a checkpoint to stream for a GPU memory budget, the step time
from the planner's simulation, and clear errors for budgets nothing fits and missing inputs."""
import numpy as np
import safetensors.numpy


def checkpoint(tmp_path):
    tensors = {f"model.layers.{i}.mlp.weight": np.zeros((256, 256), np.float32) for i in range(4)}
    tensors["model.embed_tokens.weight"] = np.zeros((128, 256), np.float32)
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    return path  # four blocks of 256 KiB, 128 KiB elsewhere


def test_plan_for_a_budget(run_ferry, tmp_path):
    path = checkpoint(tmp_path)
    gib = 2 ** 30
    # 896 KiB: 128 KiB + (4 - k) blocks + 1 slot  <=  896 KiB  ->  k = 2 with one slot.
    r = run_ferry("plan", path, "--gpu-gib", 896 * 1024 / gib, "--prefetch", 1,
                  "--link-gbps", 1, "--block-ms", 1)
    assert r.returncode == 0, r.stderr
    assert "4 blocks" in r.stdout
    assert "stream 2 blocks: 1,3" in r.stdout
    assert "copies hide behind compute" in r.stdout
    # Copies slower than compute: the planner says by how much a step stalls.
    r = run_ferry("plan", path, "--gpu-gib", 896 * 1024 / gib, "--prefetch", 1,
                  "--link-gbps", 0.01, "--block-ms", 1)
    assert r.returncode == 0, r.stderr
    assert "stalls" in r.stdout
    r = run_ferry("plan", path, "--gpu-gib", 1, "--link-gbps", 1)
    assert "without streaming" in r.stdout


def test_plan_errors(run_ferry, tmp_path):
    path = checkpoint(tmp_path)
    r = run_ferry("plan", path, "--gpu-gib", 0.0001, "--link-gbps", 1)
    assert r.returncode == 1
    assert "less than the" in r.stderr and "4 of 4 blocks streamed" in r.stderr
    r = run_ferry("plan", path, "--gpu-gib", 0.0009, "--link-gbps", 1, "--prefetch", 0)
    assert r.returncode == 1 and "prefetch" in r.stderr
    flat = tmp_path / "flat.safetensors"
    safetensors.numpy.save_file({"w": np.zeros(4, np.float32)}, str(flat))
    r = run_ferry("plan", flat, "--gpu-gib", 1, "--link-gbps", 1)
    assert r.returncode == 1 and "no tensors named as decoder blocks" in r.stderr


def one_byte_tensors(path, names):
    """A safetensors file of one-byte tensors, header written directly (fast for many names)."""
    import json
    import struct
    header = {n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(len(names)))
    return path


def test_block_indices_too_long_or_too_large_are_named(run_ferry, tmp_path):
    # A run of 200,000 digits overflowed the stack of the regex that parsed names (SIGSEGV).
    digits = one_byte_tensors(tmp_path / "digits.safetensors", ["layers." + "1" * 200000 + ".w", "layers.1.w"])
    r = run_ferry("plan", digits, "--gpu-gib", 1, "--link-gbps", 10)
    assert r.returncode == 1, r.stderr
    assert "block index 1111" in r.stderr and "larger than ferry can count" in r.stderr
    assert 'tensor "layers.1111' in r.stderr and "(200009 bytes)" in r.stderr
    big = one_byte_tensors(tmp_path / "big.safetensors", ["model.layers.99999999999999999999999.w", "model.layers.1.w"])
    r = run_ferry("plan", big, "--gpu-gib", 1, "--link-gbps", 10)
    assert r.returncode == 1, r.stderr
    assert 'tensor "model.layers.99999999999999999999999.w": block index' in r.stderr
    assert "stoul" not in r.stderr
    # The largest index that fits, and names that only look like blocks, still plan.
    fits = one_byte_tensors(tmp_path / "fits.safetensors",
                            ["h.18446744073709551615.w", "x.blk.3.w", "layers.4", "layers..w", "nolayers.5.w"])
    r = run_ferry("plan", fits, "--gpu-gib", 1, "--link-gbps", 10)
    assert r.returncode == 0, r.stderr
    assert "2 blocks, 2 bytes in blocks + 3 bytes resident elsewhere" in r.stdout


def test_many_blocks_plan_in_one_pass(run_ferry, tmp_path):
    # 50,000 blocks: every k simulated took minutes (quadratic); the timeout fails that.
    n = 50000
    path = one_byte_tensors(tmp_path / "many.safetensors", [f"layers.{i}.w" for i in range(n)])
    r = run_ferry("plan", path, "--gpu-gib", 0, "--link-gbps", 10, timeout=60)
    assert r.returncode == 1
    assert f"less than the 2 bytes the weights need even with {n} of {n} blocks streamed" in r.stderr
    # Half of them streamed: (n - k) resident + 2 slots <= n / 2 + 2 bytes.
    r = run_ferry("plan", path, "--gpu-gib", (n // 2 + 2.5) / 2 ** 30, "--link-gbps", 10, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"stream {n // 2} blocks: 1,3,5," in r.stdout


def test_prefetch_beyond_the_blocks_is_named(run_ferry, tmp_path):
    path = one_byte_tensors(tmp_path / "eight.safetensors", [f"layers.{i}.w" for i in range(8)])
    r = run_ferry("plan", path, "--gpu-gib", 0, "--link-gbps", 10, "--prefetch", 9)
    assert r.returncode == 1
    assert "prefetch distance of 9 for 8 blocks" in r.stderr, r.stderr
    assert "budget" not in r.stderr
