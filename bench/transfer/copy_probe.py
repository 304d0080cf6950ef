"""What the GPU side of a staged load can reach on this machine: pinned host-to-device copy
bandwidth by copy size and number of streams (the engine issues one stream per reader thread),
how long allocating destination memory takes, and copies from sources misaligned by a few bytes.
(Copies beside host memory traffic: bench/transfer/staged_bound, in C++, since Python threads that copy
hold the GIL and delay the timing thread.)

usage: copy_probe.py [--gib N]
"""
import argparse
import statistics
import time

import torch


def copy_rate(total, piece, streams, runs=3, misalign=0):
    """GB/s of `total` bytes copied as `piece`-byte copies spread round-robin over `streams`
    streams, from a pinned ring of 2 x streams pieces, each source `misalign` bytes past a page
    boundary (the destinations stay aligned)."""
    ring = torch.empty(2 * streams * piece + misalign, dtype=torch.uint8).pin_memory()[misalign:]
    dst = torch.empty(total, dtype=torch.uint8, device="cuda:0")
    pool = [torch.cuda.Stream() for _ in range(streams)]
    rates = []
    for _ in range(runs + 1):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i, offset in enumerate(range(0, total, piece)):
            n = min(piece, total - offset)
            s = i % streams
            src = ring[(i % (2 * streams)) * piece:][:n]  # n <= piece: within the ring
            with torch.cuda.stream(pool[s]):
                dst[offset:offset + n].copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(total / (time.perf_counter() - started) / 1e9)
    return statistics.median(rates[1:])


def allocation_seconds(nbytes):
    torch.cuda.synchronize()
    started = time.perf_counter()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    del x
    torch.cuda.empty_cache()
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4)
    args = ap.parse_args()
    total = int(args.gib * (1 << 30))
    torch.zeros(1, device="cuda:0")
    piece = 4 << 20
    line = " ".join(f"+{m} B {copy_rate(total, piece, 16, misalign=m):5.1f}" for m in (0, 8, 64, 256))
    print(f"pinned H2D, 4 MiB copies, 16 streams, source this far past a page (GB/s): {line}")
    for gib in (1, 4, 16):
        print(f"allocate {gib} GiB on cuda:0 (torch.empty, cache empty): "
              f"{allocation_seconds(gib << 30) * 1e3:.1f} ms")
    for piece_mib in (0.5, 1, 2, 4, 8, 64):
        piece = int(piece_mib * (1 << 20))
        line = " ".join(f"{s} streams {copy_rate(total, piece, s):5.1f}" for s in (1, 4, 16))
        print(f"pinned H2D, {piece_mib:>4} MiB copies (GB/s): {line}")


if __name__ == "__main__":
    main()
