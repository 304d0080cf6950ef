"""What the GPU side of a staged load can reach on this machine: pinned host-to-device copy
bandwidth by copy size and number of streams (the engine issues one stream per reader thread),
how long allocating destination memory takes, and (--contention) how much a 1 GiB pinned copy
slows while host threads copy memory as the staged path's reads do (page cache -> staging).

usage: copy_probe.py [--gib N] [--contention] [--skip-sizes]
"""
import argparse
import statistics
import threading
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


def copy_under_load(threads, runs=5, nbytes=1 << 30, buffer=256 << 20):
    """Pinned H2D GB/s of one `nbytes` copy while `threads` host threads each copy `buffer`
    bytes between two buffers of their own, over and over; and the host threads' GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    stop = threading.Event()
    copied = [0] * threads

    def busy(i):
        a = torch.ones(buffer, dtype=torch.uint8)
        b = torch.empty(buffer, dtype=torch.uint8)
        while not stop.is_set():
            b.copy_(a)  # single-threaded (set_num_threads(1)); releases the GIL
            copied[i] += buffer

    torch.set_num_threads(1)
    workers = [threading.Thread(target=busy, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(0.2 if threads else 0)
    rates = []
    host_started, host_before = time.perf_counter(), sum(copied)
    for i in range(runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i:
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    host_rate = (sum(copied) - host_before) / (time.perf_counter() - host_started) / 1e9
    stop.set()
    for w in workers:
        w.join()
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(rates), host_rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--contention", action="store_true",
                    help="pinned H2D while 0, 4, 8 and 16 host threads copy memory")
    ap.add_argument("--skip-sizes", action="store_true", help="only --contention")
    args = ap.parse_args()
    total = int(args.gib * (1 << 30))
    torch.zeros(1, device="cuda:0")
    if args.contention:
        for n in (0, 4, 8, 16):
            h2d, host = copy_under_load(n)
            print(f"pinned H2D 1 GiB while {n:2} host threads copy memory: {h2d:5.1f} GB/s "
                  f"(the threads copy {host:5.1f} GB/s)")
    piece = 4 << 20
    line = " ".join(f"+{m} B {copy_rate(total, piece, 16, misalign=m):5.1f}" for m in (0, 8, 64, 256))
    print(f"pinned H2D, 4 MiB copies, 16 streams, source this far past a page (GB/s): {line}")
    if args.skip_sizes:
        return
    for gib in (1, 4, 16):
        print(f"allocate {gib} GiB on cuda:0 (torch.empty, cache empty): "
              f"{allocation_seconds(gib << 30) * 1e3:.1f} ms")
    for piece_mib in (0.5, 1, 2, 4, 8, 64):
        piece = int(piece_mib * (1 << 20))
        line = " ".join(f"{s} streams {copy_rate(total, piece, s):5.1f}" for s in (1, 4, 16))
        print(f"pinned H2D, {piece_mib:>4} MiB copies (GB/s): {line}")


if __name__ == "__main__":
    main()
