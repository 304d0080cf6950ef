"""What a KV store's first fill costs on this file system, without ferry: 2 MiB blocks written from
16 threads with O_DIRECT (fdatasync at the end) into freshly preallocated files (one, or the
blocks round-robin over several, as over slabs), into a sparse file, past a file's end, into a
file per block (vLLM's fs tier), into files written once before (a store whose slots are
overwritten), and with buffered writes into fresh files. On ext4 a write into a
preallocated (unwritten) extent converts it as it completes: ferry's slabs pay that once per
slot, a file-per-block tier (vLLM's fs tier) on every block.

    python bench/kv/first_fill_probe.py --dir /tmp --blocks 512 --rounds 3
"""
import argparse
import concurrent.futures
import mmap
import os
import time

BLOCK = 2 << 20


def write_pass(directory, blocks, files, direct, written_before, data, allocate="fallocate",
               sync=True):
    """GB/s of one pass: `blocks` blocks over `files` fresh files, each sized first by
    `allocate`: "fallocate" (unwritten extents), "truncate" (a sparse file) or "none" (written
    past its end); `sync`: fdatasync of every file at the end (durable, as ferry's puts are; vLLM's
    fs tier never syncs)."""
    per_file = (blocks + files - 1) // files
    flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0)
    paths = [os.path.join(directory, f"first-fill-{i}.dat") for i in range(files)]
    fds = []
    try:
        for path in paths:
            fd = os.open(path, flags, 0o600)
            fds.append(fd)
            if allocate == "fallocate":
                os.posix_fallocate(fd, 0, per_file * BLOCK)
            elif allocate == "truncate":
                os.ftruncate(fd, per_file * BLOCK)
            if written_before:
                for k in range(per_file):
                    os.pwrite(fd, data, k * BLOCK)
            os.fsync(fd)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: os.pwrite(fds[i % files], data, (i // files) * BLOCK),
                          range(blocks)))
        for fd in fds if sync else ():
            os.fdatasync(fd)
        return blocks * BLOCK / (time.perf_counter() - started) / 1e9
    finally:
        for fd in fds:
            os.close(fd)
        for path in paths:
            if os.path.exists(path):
                os.remove(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    data.write(os.urandom(BLOCK))
    cases = [("O_DIRECT, fresh, 1 file", 1, True, False, "fallocate"),
             ("O_DIRECT, fresh, 4 files", 4, True, False, "fallocate"),
             ("O_DIRECT, fresh, 16 files", 16, True, False, "fallocate"),
             ("O_DIRECT, sparse, 1 file", 1, True, False, "truncate"),
             ("O_DIRECT, appended, 1 file", 1, True, False, "none"),
             ("O_DIRECT, a file per block", args.blocks, True, False, "none"),
             ("the same, not synced (fs tier)", args.blocks, True, False, "none", False),
             ("O_DIRECT, written before", 1, True, True, "fallocate"),
             ("buffered, fresh", 1, False, False, "fallocate")]
    print(f"{args.blocks} blocks of 2 MiB from 16 threads, GB/s per round, on {args.dir}")
    for name, files, direct, written, allocate, *sync in cases:
        rates = [write_pass(args.dir, args.blocks, files, direct, written, data, allocate, *sync)
                 for _ in range(args.rounds)]
        print(f"  {name:28s} " + " ".join(f"{r:.2f}" for r in rates), flush=True)


if __name__ == "__main__":
    main()
