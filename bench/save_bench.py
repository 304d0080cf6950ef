"""Saving a model-shaped set of tensors from GPU (or host) memory: ferry.torch.save_file beside
safetensors' save_file and the raw O_DIRECT write speed of the same directory.

usage: save_bench.py [--device cuda:0] [--dir DIR] [--shape llama3_8b] [--runs 3] [--scale 1.0]
                     [--savers ferry,safetensors,raw] [--json OUT]

Each saver runs in its own fresh process (so peak host memory is its own): the tensors are made
on the device first, then the timed call runs from its start until the file is durable (ferry
syncs before it renames; safetensors' file and the raw file are fsynced inside the timing).
Per run: seconds, GB/s of file bytes, peak host memory growth (VmHWM after, less VmRSS before;
the peak is reset first) and, for ferry, the write path it took. `raw` writes the same number of
bytes from one page-aligned host buffer with O_DIRECT, in 16 MiB pieces from 4 threads (ferry's
default piece size and writer count): the speed the storage gives. --scale shrinks every tensor's
first dimension (a smoke run in the tests uses 0.001 on the CPU).
"""
import argparse
import concurrent.futures
import json
import mmap
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_shapes  # noqa: E402
from common import reset_peak_rss, status_bytes, write_json  # noqa: E402

PIECE = 16 << 20
WRITERS = 4


def make_tensors(shape_name, scale, device):
    import torch

    shapes = getattr(model_shapes, shape_name)()
    g = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        shape = (max(1, int(shape[0] * scale)),) + tuple(shape[1:])
        tensors[name] = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return tensors


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_direct_write(path, total):
    """`total` bytes (rounded up to 4 KiB) of one aligned buffer, O_DIRECT, WRITERS threads."""
    total = (total + 4095) // 4096 * 4096
    buffer = mmap.mmap(-1, PIECE)
    buffer.write(os.urandom(1 << 20) * (PIECE >> 20))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        path_taken = "direct"
    except OSError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        path_taken = "buffered"
    view = memoryview(buffer)

    def write(offset):
        n = min(PIECE, total - offset)
        done = 0
        while done < n:
            done += os.pwrite(fd, view[:n - done] if done == 0 else view[done:n], offset + done)

    try:
        with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(write, range(0, total, PIECE)))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path_taken


def child(args):
    """One saver, --runs times, in this process; prints a JSON list."""
    tensors = make_tensors(args.shape, args.scale, args.device)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    path = os.path.join(args.dir, f"save_bench_{args.child}_{os.getpid()}.safetensors")
    runs = []
    for _ in range(args.runs):
        reset_peak_rss()
        before = status_bytes("VmRSS")
        start = time.perf_counter()
        info = {}
        if args.child == "ferry":
            import ferry.torch

            stats = ferry.torch.write_file(tensors, path, {"format": "pt"})
            info = {"io_path": stats["io_path"], "io_reason": stats["io_reason"],
                    "staging_bytes": stats["staging_bytes"], "fill_seconds": stats["fill_seconds"],
                    "wait_seconds": stats["wait_seconds"], "write_seconds": stats["write_seconds"]}
        elif args.child == "safetensors":
            import safetensors.torch

            safetensors.torch.save_file(tensors, path, {"format": "pt"})
            fsync_path(path)
        else:
            info = {"io_path": raw_direct_write(path, nbytes)}
        seconds = time.perf_counter() - start
        peak = status_bytes("VmHWM")
        size = os.path.getsize(path)
        os.unlink(path)
        runs.append({"saver": args.child, "seconds": seconds, "file_bytes": size, "gb_per_s": size / seconds / 1e9,
                     "peak_host_growth_bytes": max(0, peak - before), **info})
    print(json.dumps(runs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dir", default=".", help="where the files go (the storage measured)")
    ap.add_argument("--shape", default="llama3_8b", help="a function of bench/model_shapes.py")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--savers", default="raw,ferry,safetensors")
    ap.add_argument("--json", help="write all runs here")
    ap.add_argument("--child", choices=["ferry", "safetensors", "raw"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = []
    for saver in args.savers.split(","):
        cmd = [sys.executable, __file__, "--child", saver, "--device", args.device, "--dir", args.dir,
               "--shape", args.shape, "--runs", str(args.runs), "--scale", str(args.scale)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{saver} failed:\n{done.stderr}")
        results += json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'saver':<12} {'best GB/s':>9} {'median s':>9} {'peak host growth':>17}  path")
    for saver in args.savers.split(","):
        runs = [r for r in results if r["saver"] == saver]
        best = max(r["gb_per_s"] for r in runs)
        median = sorted(r["seconds"] for r in runs)[len(runs) // 2]
        growth = max(r["peak_host_growth_bytes"] for r in runs)
        print(f"{saver:<12} {best:>9.2f} {median:>9.3f} {growth / 2**20:>13.0f} MiB  {runs[0].get('io_path', '')}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
