"""Loads benchmark checkpoints with ferry and with safetensors on one GPU, beside the machine's
limits measured in the same run; prints a table and writes results.json.

usage: run_bench.py --ferry BIN --dir CHECKPOINTS --out OUTDIR [--runs N] [--cold]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from model_shapes import MODELS


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm_page_cache(path):
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(64 << 20):
                    pass


def pinned_h2d_gbps(runs=5, nbytes=1 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    rates = []
    for i in range(runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i:
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def ferry_load(binary, path, runs, extra=()):
    out = subprocess.run([binary, "load", path, "--device", "cuda:0", "--json", "--repeat", str(runs), *extra],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def safetensors_load(path, runs):
    """safetensors.torch.load_file(device='cuda:0') over every shard, in a fresh process."""
    code = f"""
import glob, json, os, time, torch
from safetensors.torch import load_file
p = {path!r}
files = sorted(glob.glob(os.path.join(p, '*.safetensors'))) if os.path.isdir(p) else [p]
torch.zeros(1, device='cuda:0'); torch.cuda.synchronize()
out = []
for _ in range({runs}):
    t = time.perf_counter(); n = 0
    for f in files:
        d = load_file(f, device='cuda:0'); n += sum(x.numel() * x.element_size() for x in d.values())
    torch.cuda.synchronize(); s = time.perf_counter() - t
    out.append({{'seconds': s, 'gigabytes_per_second': n / s / 1e9}}); del d
print(json.dumps(out))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def ferry_python_load(path, runs):
    """ferry.torch.load_file(device='cuda:0') in a fresh process, CUDA started before the clock."""
    code = f"""
import json, time, torch, ferry.torch
torch.zeros(1, device='cuda:0'); torch.cuda.synchronize()
out = []
for _ in range({runs}):
    t = time.perf_counter()
    d, stats = ferry.torch.load({path!r}, device='cuda:0'); torch.cuda.synchronize()
    s = time.perf_counter() - t; n = sum(x.numel() * x.element_size() for x in d.values())
    out.append({{'seconds': s, 'gigabytes_per_second': n / s / 1e9,
                'io_path': stats['files'][0]['io_path']}}); del d
print(json.dumps(out))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def doctor(binary, path, limit_gib):
    out = subprocess.run([binary, "doctor", path, "--json", "--read-limit-gib", str(limit_gib)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--gguf", help="a GGUF file the size of llama3-8b, loaded beside it")
    args = ap.parse_args()

    results = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0),
               "pinned_h2d_gbps": pinned_h2d_gbps(), "models": {}}
    rows = []
    for model in args.models:
        path = os.path.join(args.dir, model)
        size_gb = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 1e9
        r = results["models"][model] = {"bytes_gb": size_gb}
        warm_page_cache(path)
        r["warm_read"] = doctor(args.ferry, path, 64)["path"]["read"]["buffered_gbps"]
        r["ferry_warm"] = ferry_load(args.ferry, path, args.runs)
        r["safetensors_warm"] = safetensors_load(path, 2)
        r["ferry_python_warm"] = ferry_python_load(path, args.runs)
        r["ferry_cufile_warm"] = ferry_load(args.ferry, path, 3, ("--backend", "cufile", "--allow-compat"))
        first = r["ferry_warm"][0]
        rows.append((model, "warm", "ferry (first load)", first["gigabytes_per_second"], 1,
                     first["files"][0]["io_path"], first["peak_host_growth_bytes"] / 2**20))
        rows.append((model, "warm", "ferry (median)", median_of(r["ferry_warm"], "gigabytes_per_second"),
                     len(r["ferry_warm"]), first["files"][0]["io_path"],
                     max(x["peak_host_growth_bytes"] for x in r["ferry_warm"]) / 2**20))
        cf = r["ferry_cufile_warm"]
        rows.append((model, "warm", "ferry --backend cufile", median_of(cf, "gigabytes_per_second"), len(cf),
                     cf[0]["files"][0]["io_path"], max(x["peak_host_growth_bytes"] for x in cf) / 2**20))
        py = r["ferry_python_warm"]
        rows.append((model, "warm", "ferry.torch (first)", py[0]["gigabytes_per_second"], 1,
                     py[0]["io_path"], None))
        rows.append((model, "warm", "ferry.torch (median)", median_of(py, "gigabytes_per_second"), len(py),
                     py[0]["io_path"], None))
        rows.append((model, "warm", "safetensors.load_file",
                     median_of(r["safetensors_warm"], "gigabytes_per_second"), 2, "mmap", None))
        if args.cold:
            drop_page_cache()
            d = doctor(args.ferry, path, 64)["path"]["read"]
            r["cold_odirect_read"] = d.get("odirect_gbps")
            drop_page_cache()
            r["ferry_cold"] = ferry_load(args.ferry, path, 1)
            rows.append((model, "cold", "ferry", r["ferry_cold"][0]["gigabytes_per_second"], 1,
                         r["ferry_cold"][0]["files"][0]["io_path"],
                         r["ferry_cold"][0]["peak_host_growth_bytes"] / 2**20))
            warm_page_cache(path)

    if args.gguf:
        warm_page_cache(os.path.dirname(args.gguf))
        g = results["gguf"] = {"ferry_warm": ferry_load(args.ferry, args.gguf, args.runs),
                               "bytes_gb": os.path.getsize(args.gguf) / 1e9}
        rows.append(("gguf-8b", "warm", "ferry (median)", median_of(g["ferry_warm"], "gigabytes_per_second"),
                     len(g["ferry_warm"]), g["ferry_warm"][0]["files"][0]["io_path"],
                     max(x["peak_host_growth_bytes"] for x in g["ferry_warm"]) / 2**20))

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    limit = results["pinned_h2d_gbps"]
    print(f"\n{results['gpu']}: pinned host->device {limit:.1f} GB/s (torch copy_, 1 GiB, median of 5)")
    for model, r in results["models"].items():
        line = f"{model}: {r['bytes_gb']:.2f} GB, warm parallel read {r['warm_read']:.1f} GB/s"
        if "cold_odirect_read" in r:
            line += f", cold O_DIRECT read {r['cold_odirect_read']:.2f} GB/s"
        print(line)
    print(f"{'model':<11} {'source':<6} {'loader':<22} {'GB/s':>7} {'runs':>4} {'x H2D':>6} {'path':<13} {'host MiB':>8}")
    for model, source, loader, gbps, runs, path, host in rows:
        host_text = f"{host:8.1f}" if host is not None else "       -"
        print(f"{model:<11} {source:<6} {loader:<22} {gbps:7.2f} {runs:4d} {gbps / limit:6.2f} {path:<13} {host_text}")
        if source == "cold":
            ref = results["models"][model]["cold_odirect_read"]
            print(f"{'':<11} {'':<6} {'  x cold O_DIRECT read':<22} {gbps / ref:7.2f}")


if __name__ == "__main__":
    main()
