"""Per-key reads, as transformers and vLLM take tensors: `with safe_open(...) as f: for k in
f.keys(): f.get_tensor(k)`, ferry against safetensors, on one file of --tensors tensors of
--kib KiB each (1,000 x 256 KiB by default), warm (the file is read once first).

Every tensor's pages are touched (one byte per 4 KiB summed), so that a lazily mapped tensor
pays for its reads as a copied one does. Median of --repeat runs; figures only, nothing asserted.

    python3 bench/per_key_reads.py [--device cpu|cuda:0] [--tensors 1000] [--kib 256] [--slices]
"""
import argparse
import os
import statistics
import tempfile
import time

import safetensors
import safetensors.torch
import torch

import ferry


def touch(t):
    flat = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    return int(flat[::4096].sum())


def iterate(opener, path, device, slices):
    total = 0
    with opener(path, framework="pt", device=device) as f:
        for key in f.keys():
            if slices:  # rank 0 of 2 in tensor parallelism: the first half of the rows
                part = f.get_slice(key)
                total += touch(part[: part.get_shape()[0] // 2])
            else:
                total += touch(f.get_tensor(key))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tensors", type=int, default=1000)
    parser.add_argument("--kib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--slices", action="store_true", help="get_slice of half the rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "per_key.safetensors")
        cols = args.kib * 1024 // 4 // 64
        generator = torch.Generator().manual_seed(0)
        safetensors.torch.save_file(
            {f"layer.{i}.weight": torch.rand((64, cols), generator=generator) for i in range(args.tensors)}, path)
        results = {}
        for label, opener in (("safetensors", safetensors.safe_open), ("ferry", ferry.safe_open)):
            iterate(opener, path, args.device, args.slices)  # warm the page cache and the code
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                check = iterate(opener, path, args.device, args.slices)
                times.append(time.perf_counter() - start)
            results[label] = (statistics.median(times), check)
        assert results["ferry"][1] == results["safetensors"][1], "the two read different bytes"
        size = args.tensors * args.kib * 1024 * (0.5 if args.slices else 1)
        print(f"{args.tensors} x {args.kib} KiB to {args.device}{' (half-row slices)' if args.slices else ''},"
              f" median of {args.repeat}")
        for label, (seconds, _) in results.items():
            print(f"  {label:12s} {seconds * 1000:8.1f} ms  {size / seconds / 1e9:6.2f} GB/s  "
                  f"{seconds * 1e6 / args.tensors:7.1f} us/key")
        print(f"  ferry / safetensors time: {results['ferry'][0] / results['safetensors'][0]:.2f}")


if __name__ == "__main__":
    main()
