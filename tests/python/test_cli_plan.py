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
