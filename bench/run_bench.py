"""The benchmark suite: every loader of bench/loaders.py and ferry's command, on each checkpoint
and source, beside the machine's limits measured in the same run. Writes a results file (JSON)
that bench/report.py turns into BENCHMARKS.md and the chart.

usage: run_bench.py --ferry BIN --dir CHECKPOINTS --out FILE.json [--sources warm tmpfs cold]
                    [--models ...] [--sizes] [--runs N]

Sources: warm (page cache holds the files), tmpfs (files copied to /dev/shm), cold (page cache
dropped before each run; needs root). Limits: pinned host-to-device copy (torch, 1 GiB), and
the raw read of the same files (ferry doctor: parallel pread when warm or tmpfs, O_DIRECT cold).
A loader that fails is kept in the results with its error, not dropped.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

from common import drop_page_cache, pinned_h2d_gbps, warm_page_cache, write_json  # noqa: F401
from loaders import LOADERS
from model_shapes import MODELS, SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
# Runs per loader: ferry's own rows get more, for a stable median; slow peers fewer.
PEER_RUNS = {"safetensors load_file": 3, "safetensors safe_open": 2, "fastsafetensors nogds": 2,
             "fastsafetensors gds": 1, "runai-model-streamer": 2, "torch.cuda.gds": 1}


def checkpoint_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def run_json(cmd):
    """Runs cmd; returns (parsed stdout, None) or (None, the reason it failed)."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
        return None, (lines[-1] if lines else f"exit status {out.returncode}")[:300]
    return json.loads(out.stdout), None


def ferry_cli(binary, path, runs, cold, extra=()):
    """ferry load, one process per run when cold (each run drops the page cache first)."""
    rows = []
    for _ in range(runs if cold else 1):
        if cold:
            drop_page_cache()
        got, error = run_json([binary, "load", path, "--device", "cuda:0", "--json",
                               "--repeat", "1" if cold else str(runs), *extra])
        if error:
            return {"error": error}
        for r in got:
            rows.append({**r, "path": ",".join(sorted({f["io_path"] for f in r["files"]})),
                         "gpu_beyond_tensors_bytes": r["allocated_bytes"] - r["tensor_bytes"]})
    return {"runs": rows}


def python_loader(name, path, runs, cold):
    cmd = [sys.executable, os.path.join(HERE, "run_loader.py"), name, path, "--runs", str(runs)]
    got, error = run_json(cmd + (["--cold"] if cold else []))
    return {"error": error} if error else {"runs": got}


def raw_read_gbps(binary, path, cold):
    """The read limit: O_DIRECT from a dropped cache when cold, parallel pread otherwise."""
    if cold:
        drop_page_cache()
    limit_gib = checkpoint_bytes(path) / 2**30 + 1
    got, error = run_json([binary, "doctor", path, "--json", "--read-limit-gib", f"{limit_gib:.1f}"])
    if error:
        return None
    reads = got["path"]["read"]
    return reads.get("odirect_gbps") if cold else reads["buffered_gbps"]


def run_case(args, model, source, path):
    cold = source == "cold"
    if not cold:
        warm_page_cache(path)
    case = {"model": model, "source": source, "bytes": checkpoint_bytes(path),
            "read_limit_gbps": raw_read_gbps(args.ferry, path, cold), "loaders": {}}
    runs = 2 if cold else args.runs
    loaders = case["loaders"]
    loaders["ferry"] = ferry_cli(args.ferry, path, runs, cold)
    loaders["ferry.torch"] = python_loader("ferry.torch", path, runs, cold)
    for name in LOADERS:
        if name != "ferry.torch":
            loaders[name] = python_loader(name, path, 1 if cold else PEER_RUNS[name], cold)
    loaders["ferry --backend cufile"] = ferry_cli(args.ferry, path, 1, cold,
                                                  ("--backend", "cufile", "--allow-compat"))
    for name, result in loaders.items():
        print(f"  {model} {source} {name}: " + (
            f"{statistics.median(r['gigabytes_per_second'] for r in result['runs']):.2f} GB/s"
            if "runs" in result else "failed: " + result["error"]), flush=True)
    return case


def size_sweep(args):
    """ferry's load time against checkpoint size, warm; each checkpoint is deleted after use."""
    rows = []
    for name in SIZES:
        subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoints.py"), args.dir, name],
                       check=True)
        path = os.path.join(args.dir, name)
        warm_page_cache(path)
        result = ferry_cli(args.ferry, path, 3, False)
        shutil.rmtree(path)
        if "error" in result:
            rows.append({"name": name, "error": result["error"]})
            continue
        seconds = statistics.median(r["seconds"] for r in result["runs"])
        rows.append({"name": name, "bytes": result["runs"][0]["tensor_bytes"], "seconds": seconds,
                     "gigabytes_per_second": result["runs"][0]["tensor_bytes"] / seconds / 1e9})
        print(f"  {name}: {rows[-1]['seconds']:.3f} s, {rows[-1]['gigabytes_per_second']:.1f} GB/s",
              flush=True)
    return rows


def machine():
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    return {"gpu": torch.cuda.get_device_name(0), "cores": os.cpu_count(), "memory_bytes": mem,
            "torch": torch.__version__, "python": sys.version.split()[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sources", nargs="*", default=["warm", "tmpfs", "cold"])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--sizes", action="store_true", help="also the load-time-against-size sweep")
    args = ap.parse_args()
    torch.zeros(1, device="cuda:0")
    results = {"date": time.strftime("%Y-%m-%d"), "machine": machine(),
               "pinned_h2d_gbps": pinned_h2d_gbps(), "cases": [], "sizes": []}
    print(f"pinned host->device: {results['pinned_h2d_gbps']:.1f} GB/s", flush=True)
    for source in args.sources:
        for model in args.models:
            path = os.path.join(args.dir, model)
            case = None
            if source == "tmpfs":
                shm = os.path.join("/dev/shm/ferry-bench", model)
                shutil.rmtree(shm, ignore_errors=True)
                shutil.copytree(path, shm)
                try:
                    case = run_case(args, model, source, shm)
                finally:
                    shutil.rmtree(shm)
            else:
                case = run_case(args, model, source, path)
            case["pinned_h2d_gbps"] = results["pinned_h2d_gbps"]
            results["cases"].append(case)
            write_json(args.out, results)
    if args.sizes:
        results["sizes"] = size_sweep(args)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
