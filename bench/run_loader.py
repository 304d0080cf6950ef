"""Runs one loader of bench/loaders.py on one checkpoint, several times, in this fresh process;
prints a JSON list with one object per run.

usage: run_loader.py LOADER CHECKPOINT [--runs N] [--cold] [--device cuda:0]

Per run: seconds (CUDA already started; from the call to the last byte on the GPU), GB/s of
tensor bytes, peak host memory growth (VmHWM after, less VmRSS before; the peak is reset first),
GPU memory used beyond the tensors' bytes (device-wide free memory before and after), and the
path the loader took. --cold drops the page cache before each run (needs root).
"""
import argparse
import json
import sys
import time

import torch

from common import drop_page_cache, reset_peak_rss, status_bytes, synchronize
from loaders import LOADERS


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


def gpu_free_bytes(device):
    return torch.cuda.mem_get_info(device)[0] if device.startswith("cuda") else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loader", choices=list(LOADERS))
    ap.add_argument("checkpoint")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    load = LOADERS[args.loader]
    torch.zeros(1, device=args.device)
    synchronize(args.device)
    runs = []
    for _ in range(args.runs):
        if args.cold:
            drop_page_cache()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        free_before = gpu_free_bytes(args.device)
        reset_peak_rss()
        rss_before = status_bytes("VmRSS")
        started = time.perf_counter()
        tensors, path = load(args.checkpoint, args.device)
        synchronize(args.device)
        seconds = time.perf_counter() - started
        peak = status_bytes("VmHWM")
        nbytes = tensor_bytes(tensors)
        used = free_before - gpu_free_bytes(args.device) if args.device.startswith("cuda") else nbytes
        runs.append({"seconds": seconds, "gigabytes_per_second": nbytes / seconds / 1e9,
                     "tensor_bytes": nbytes, "tensor_count": len(tensors),
                     "peak_host_growth_bytes": max(0, peak - rss_before),
                     "gpu_beyond_tensors_bytes": used - nbytes, "path": path})
        del tensors
    json.dump(runs, sys.stdout)


if __name__ == "__main__":
    main()
