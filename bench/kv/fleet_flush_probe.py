"""What a fleet writer's second flush costs the others on a disk: N writer processes, each with
T threads writing 2 MiB blocks O_DIRECT over its own file (written once before, so every write
is an overwrite, as a filled store's), an fdatasync per batch of B blocks, and then, by mode:

  none     nothing more (kv bench's raw writes)
  append   a 4 KiB record appended to the writer's own journal file, fdatasync'd (what a KV
           store's put does: the append commits the file's new size through the file system's
           journal)
  inplace  the same record written over a journal file written ahead, fdatasync'd (no metadata
           change)

Aggregate GB/s of each mode, the modes taking turns each round. It answers whether the fleet's
gap to one writer (docs/kv_fleet.md) is its journal's flushes on this storage.

    python3 bench/kv/fleet_flush_probe.py --dir /tmp/probe [--writers 4] [--threads 4]
        [--batch 128] [--passes 2] [--rounds 3]
"""
import argparse
import mmap
import os
import shutil
import tempfile
import threading
import time
from multiprocessing import Barrier, Process, Queue

BLOCK = 2 << 20
RECORD = 4096
MODES = ("none", "append", "inplace")


def writer(w, mode, args, barrier, results):
    slab, journal = os.path.join(args.dir, f"slab{w}"), os.path.join(args.dir, f"journal{w}")
    batches = 4
    fd = os.open(slab, os.O_RDWR | os.O_CREAT, 0o600)
    direct = os.open(slab, os.O_RDWR | os.O_DIRECT)
    jfd = os.open(journal, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if mode == "inplace":
            os.pwrite(jfd, bytes(args.passes * batches * RECORD), 0)
            os.fsync(jfd)
        buffers = [mmap.mmap(-1, BLOCK) for _ in range(args.threads)]  # page-aligned
        for b in buffers:
            b.write(b"x" * BLOCK)
        blocks = args.batch * batches
        if os.fstat(fd).st_size < blocks * BLOCK:  # written once: the timed writes overwrite
            for i in range(blocks):
                os.pwrite(direct, buffers[0], i * BLOCK)
            os.fsync(fd)
        barrier.wait()
        start, at = time.perf_counter(), 0
        for _ in range(args.passes):
            for b in range(batches):
                ids = range(b * args.batch, (b + 1) * args.batch)

                def write(t):
                    for i in ids[t::args.threads]:
                        os.pwrite(direct, buffers[t], i * BLOCK)
                threads = [threading.Thread(target=write, args=(t,)) for t in range(args.threads)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                os.fdatasync(fd)
                if mode != "none":
                    os.pwrite(jfd, b"r" * RECORD, at)
                    at += RECORD
                    os.fdatasync(jfd)
        results.put((start, time.perf_counter(), blocks * args.passes * BLOCK))
    finally:
        for f in (fd, direct, jfd):
            os.close(f)


def run(mode, args):
    barrier, results = Barrier(args.writers), Queue()
    procs = [Process(target=writer, args=(w, mode, args, barrier, results))
             for w in range(args.writers)]
    for p in procs:
        p.start()
    done = [results.get() for _ in procs]
    for p in procs:
        p.join()
    first, last = min(d[0] for d in done), max(d[1] for d in done)
    return sum(d[2] for d in done) / (last - first) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="a scratch directory on the storage")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="each writer's")
    parser.add_argument("--batch", type=int, default=128, help="blocks per fdatasync")
    parser.add_argument("--passes", type=int, default=2, help="over each writer's 4 batches")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    args.dir = tempfile.mkdtemp(dir=args.dir, prefix="fleet-flush-")
    try:
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            rates = {m: run(m, args) for m in order}
            print(f"round {r}: " + ", ".join(f"{m} {rates[m]:.2f}" for m in MODES) + " GB/s",
                  flush=True)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
