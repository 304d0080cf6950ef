"""bench/load/first_load.py end to end on the CPU (issue 27's benchmark): tiny checkpoints written by
safetensors, a fresh process per loader, the first load beside later ones, and one process per
rank with --nproc 2 (gloo). Timing is not checked; the rows, their loads and the bytes are."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "load" / "first_load.py"


def run_bench(tmp_path, ferry_bin, *args):
    out = tmp_path / "first_load.json"
    done = subprocess.run([sys.executable, str(BENCH), "--dir", str(tmp_path / "checkpoints"),
                           "--device", "cpu", "--later", "1", "--ferry-bin", str(ferry_bin),
                           "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "first s" in done.stdout  # the table
    return {(r["case"], r["temp"], r["loader"]): r for r in json.loads(out.read_text())["rows"]}


def test_one_process_per_loader_times_its_first_and_later_loads(tmp_path, ferry_bin):
    rows = run_bench(tmp_path, ferry_bin, "--cases", "moe", "--scale", "0.0002", "--temps", "warm",
                     "--loaders", "ferry,ferry-prepared,ferry-dma-prepared,ferry-cli,safetensors,"
                     "instanttensor")
    for loader in ("ferry", "ferry-prepared", "ferry-dma-prepared", "ferry-cli", "safetensors"):
        row = rows[("moe", "warm", loader)]
        assert row["error"] is None, row["error"]
        assert len(row["runs"]) == 2  # the first load and one later
        assert row["first_seconds"] > 0 and row["later_seconds"] > 0
    ferry_runs = rows[("moe", "warm", "ferry")]["runs"]
    safetensors_runs = rows[("moe", "warm", "safetensors")]["runs"]
    assert ferry_runs[0]["tensors"] == safetensors_runs[0]["tensors"] == 3155  # moe_3k's
    assert ferry_runs[0]["tensor_bytes"] == safetensors_runs[0]["tensor_bytes"]
    assert rows[("moe", "warm", "ferry-cli")]["runs"][0]["tensor_bytes"] == ferry_runs[0]["tensor_bytes"]
    assert rows[("moe", "warm", "instanttensor")]["error"] == "needs CUDA"
    # The prepared loader's set-up was made before its first load, and only then.
    prepared = rows[("moe", "warm", "ferry-prepared")]["runs"]
    assert prepared[0]["prepared"]["slabs"] > 0 and "prepared" not in prepared[1]
    assert prepared[0]["tensor_bytes"] == ferry_runs[0]["tensor_bytes"]
    # "-dma": the preparation was given the checkpoint with page_cache_pin (host memory here:
    # nothing to register, and it says why).
    dma = rows[("moe", "warm", "ferry-dma-prepared")]["runs"]
    assert "does not serve cpu" in dma[0]["prepared"]["page_cache_why_not"]
    assert dma[0]["tensor_bytes"] == ferry_runs[0]["tensor_bytes"]
    # Each ferry load says when it reached each phase: the engine's and Python's timelines.
    for run in ferry_runs:
        names = [name for name, _ in run["engine"]["timeline"]]
        assert names[:3] == ["planned", "allocated", "submitted"] and names[-1] == "done"
        assert {"first_worker", "staging_ready", "first_read", "copies_done"} <= set(names)
        times = [t for _, t in run["engine"]["timeline"]]
        assert times == sorted(times)
        python = dict(run["engine"]["python_timeline"])
        assert python["load_started"] <= python["tensors_built"] <= python["load_waited"]


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_a_process_per_rank_loads_replicas_and_slices(tmp_path, ferry_bin):
    rows = run_bench(tmp_path, ferry_bin, "--cases", "llama", "--scale", "0.0005", "--temps", "warm",
                     "--nproc", "2", "--loaders", "ferry,ferry-tp,ferry-tp-prepared")
    replicas, slices = rows[("llama", "warm", "ferry")], rows[("llama", "warm", "ferry-tp")]
    prepared = rows[("llama", "warm", "ferry-tp-prepared")]
    assert prepared["error"] is None, prepared["error"]
    assert prepared["runs"][0]["prepared"]["slabs"] > 0
    assert prepared["runs"][0]["tensor_bytes"] == slices["runs"][0]["tensor_bytes"]
    for row in (replicas, slices):
        assert row["error"] is None, row["error"]
        assert len(row["runs"]) == 2 and row["nproc"] == 2
    # Each replica holds every tensor; the ranks' slices together hold each byte once, but for the
    # tensors tensor parallelism keeps whole (norms).
    whole = replicas["runs"][0]["tensor_bytes"]
    assert whole == replicas["file_tensor_bytes"]
    assert replicas["runs"][0]["all_ranks_tensor_bytes"] == 2 * whole
    assert whole <= slices["runs"][0]["all_ranks_tensor_bytes"] < 2 * whole
    assert slices["runs"][0]["tensor_bytes"] < whole
    # The group load's timeline, and its round 0 reads' own.
    for row in (replicas, slices):
        for run in row["runs"]:
            names = [name for name, _ in run["engine"]["group_timeline"]]
            assert names[:4] == ["planned", "allocated", "rounds 0 and 1 started", "plans agreed"]
            assert {"round 0 read", "exchanges waited", "tensors built"} <= set(names)
            assert "first_read" in [name for name, _ in run["engine"]["round0_timeline"]]
