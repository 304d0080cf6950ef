#!/usr/bin/env python3
"""ferry's KV store beside an equivalent of vLLM's filesystem KV tier, same blocks, same disk.

The "fs tier" here is written from its description, not imported: a file per block, O_DIRECT,
16 reader / 16 writer threads, os.pwritev / os.preadv straight between the block's host memory
(page-aligned) and its file. ferry: one KVStore over the same directory's disk, 128 blocks per
call (ferry.KVStore where `import ferry` and torch work, its many-piece blocks given as one
ferry.KVPages per call as an engine's paged cache is; else the C ABI in libferry.so through
ctypes: the same KVStore). Rounds alternate which goes first; medians reported. Both sides' piece
lists (ctypes arrays, tensor views, memoryviews) are made once before anything is timed: built
per call, 128 blocks of 64 pieces cost the C ABI side about 50-100 ms of Python per 256 MiB
(8,192 ctypes structs), which the fs tier's threads hide behind their I/O, so that was measured
instead of the stores.

  python3 bench/kv/kv_vs_fs_tier.py --dir /mnt/nvme/kvbench [--blocks 512] [--block-mib 2]
      [--batch 128] [--inflight 1] [--threads 16] [--rounds 3] [--pieces 1] [--misalign 0]
      [--lib build/libferry.so]

--inflight N runs N of ferry's calls at once, from as many threads (the store is thread-safe), as
the ferry tier inside vLLM runs its jobs (async batches, up to four at once): the fs tier's
threads never wait at a batch's end, a single caller's calls do.

--pieces N splits each block into N equal pieces (ferry gathers them; the fs tier writes them
with one pwritev); --misalign B offsets every block by B bytes from page alignment (torch's CPU
tensors are 64-byte aligned): the fs tier then goes through a per-thread aligned bounce buffer.
"""
import argparse
import ctypes
import mmap
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: shared helpers
from common import drop_file_cache  # noqa: E402

PAGE = 4096


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", required=True, help="a directory on the disk to measure")
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--block-mib", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=128, help="ferry: blocks per call")
    p.add_argument("--inflight", type=int, default=1,
                   help="ferry: calls at once from as many threads (the ferry tier in vLLM runs "
                        "every job as an async batch, up to four at once)")
    p.add_argument("--threads", type=int, default=16, help="fs tier: threads")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pieces", type=int, default=1)
    p.add_argument("--misalign", type=int, default=0)
    p.add_argument("--lib", default=None, help="libferry.so (C ABI) instead of ferry.KVStore")
    return p.parse_args()


class Memory:
    """`blocks` blocks of `size` bytes in one anonymous mapping, each offset by `misalign`."""

    def __init__(self, blocks, size, misalign):
        self.size = size
        self.stride = (size + misalign + PAGE - 1) // PAGE * PAGE
        self.misalign = misalign
        self.map = mmap.mmap(-1, self.stride * blocks)
        self.view = memoryview(self.map)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def block(self, i):
        at = i * self.stride + self.misalign
        return self.view[at:at + self.size]

    def address(self, i):
        return self.base + i * self.stride + self.misalign

    def fill(self, seed):
        pattern = bytes((seed * 131 + k * 7) & 0xFF for k in range(PAGE))
        for i in range(len(self.map) // PAGE):
            self.map[i * PAGE:(i + 1) * PAGE] = pattern[i % 7:] + pattern[:i % 7]

    def release(self):
        self.view.release()
        self.map.close()


class FsTier:
    """A file per block, O_DIRECT, a thread pool; aligned memory straight, else a bounce."""

    def __init__(self, root, threads, pieces):
        self.root = root
        self.pool = ThreadPoolExecutor(threads)
        self.pieces = pieces
        self.bounce = {}
        self.views = {}
        os.makedirs(root, exist_ok=True)

    def path(self, i):
        return os.path.join(self.root, f"{i:08d}.bin")

    def _bounce(self, size):
        import threading
        key = threading.get_ident()
        if key not in self.bounce:
            self.bounce[key] = mmap.mmap(-1, (size + PAGE - 1) // PAGE * PAGE)
        return self.bounce[key]

    def _slices(self, memory, i):
        """Block i's pieces as memoryviews, made once (as ferry's piece lists are)."""
        if (id(memory), i) not in self.views:
            view = memory.block(i)
            n = len(view) // self.pieces
            self.views[(id(memory), i)] = [
                view[k * n:(k + 1) * n if k + 1 < self.pieces else len(view)]
                for k in range(self.pieces)]
        return self.views[(id(memory), i)]

    def prepare(self, memory, count):
        for i in range(count):
            self._slices(memory, i)

    def release(self):
        for views in self.views.values():
            for v in views:
                v.release()
        self.views.clear()

    def _aligned(self, memory, i):
        return memory.address(i) % PAGE == 0 and memory.size % PAGE == 0

    def _put(self, memory, i, sync):
        fd = os.open(self.path(i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            if self._aligned(memory, i):
                os.pwritev(fd, self._slices(memory, i), 0)
            else:
                b = self._bounce(memory.size)
                b[:memory.size] = memory.block(i)
                os.pwritev(fd, [memoryview(b)[:(memory.size + PAGE - 1) // PAGE * PAGE]], 0)
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def _get(self, memory, i):
        fd = os.open(self.path(i), os.O_RDONLY | os.O_DIRECT)
        try:
            if self._aligned(memory, i):
                n = os.preadv(fd, self._slices(memory, i), 0)
            else:
                b = self._bounce(memory.size)
                n = os.preadv(fd, [memoryview(b)[:(memory.size + PAGE - 1) // PAGE * PAGE]], 0)
                memory.block(i)[:] = memoryview(b)[:memory.size]
            if n < memory.size:
                raise IOError(f"{self.path(i)}: short read ({n} of {memory.size})")
        finally:
            os.close(fd)

    def put(self, memory, count, sync):
        list(self.pool.map(lambda i: self._put(memory, i, sync), range(count)))

    def get(self, memory, count):
        list(self.pool.map(lambda i: self._get(memory, i), range(count)))

    def drop(self, count):
        for i in range(count):
            drop_file_cache(self.path(i))


class FerryC:
    """ferry's KVStore through the C ABI (libferry.so), for machines without torch."""

    class Options(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("model", ctypes.c_char_p),
                    ("dtype", ctypes.c_char_p), ("block_layout", ctypes.c_char_p),
                    ("tp_rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                    ("capacity_bytes", ctypes.c_uint64), ("block_bytes", ctypes.c_uint64),
                    ("gpu_path", ctypes.c_int32), ("allow_compat", ctypes.c_int32),
                    ("read_only", ctypes.c_int32), ("slab_count", ctypes.c_uint32),
                    ("checkpoint_every", ctypes.c_uint64),
                    ("page_cache_pin_bytes", ctypes.c_uint64)]

    class Piece(ctypes.Structure):
        _fields_ = [("memory", ctypes.c_void_p), ("length", ctypes.c_uint64),
                    ("device", ctypes.c_char_p)]

    class Block(ctypes.Structure):
        _fields_ = [("pieces", ctypes.c_void_p), ("piece_count", ctypes.c_size_t)]

    class Result(ctypes.Structure):
        _fields_ = [("status", ctypes.c_int32), ("route", ctypes.c_int32)]

    def __init__(self, lib, root, capacity, block_bytes):
        self.lib = ctypes.CDLL(lib)
        self.lib.ferry_last_error.restype = ctypes.c_char_p
        o = self.Options()
        self.lib.ferry_kv_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        o.model, o.dtype, o.block_layout = b"kv_vs_fs_tier", b"bf16", b"bench"
        o.capacity_bytes, o.block_bytes = capacity, block_bytes
        self.store = ctypes.c_void_p()
        self.prepared = {}
        self._check(self.lib.ferry_kv_open(root.encode(), ctypes.byref(o),
                                           ctypes.byref(self.store)))

    def _check(self, status):
        if status != 0:
            raise RuntimeError(f"ferry: {self.lib.ferry_last_error().decode()}")

    def _blocks(self, memory, first, n, pieces):
        """The batch's piece lists as C arrays, built once per batch (see prepare())."""
        at = (id(memory), first, n, pieces)
        if at not in self.prepared:
            piece_arrays = []
            blocks = (self.Block * n)()
            for j in range(n):
                size = memory.size // pieces
                arr = (self.Piece * pieces)()
                for k in range(pieces):
                    length = size if k + 1 < pieces else memory.size - size * k
                    arr[k] = self.Piece(memory.address(first + j) + k * size, length, b"cpu")
                piece_arrays.append(arr)
                blocks[j] = self.Block(ctypes.addressof(arr), pieces)
            self.prepared[at] = (blocks, piece_arrays)
        return self.prepared[at][0]

    def _call(self, fn, keys, memory, first, pieces, put):
        n = len(keys)
        blocks = self._blocks(memory, first, n, pieces)
        key_array = (ctypes.c_uint64 * n)(*keys)
        results = (self.Result * n)()
        args = [self.store, key_array, blocks, ctypes.c_size_t(n)]
        if put:
            args.append(None)
        self._check(fn(*args, results))
        bad = [r.status for r in results if r.status != 0]
        if bad:
            raise RuntimeError(f"ferry: {len(bad)} of {n} blocks failed (status {bad[0]}): "
                               f"{self.lib.ferry_last_error().decode()}")

    def prepare(self, memory, first, n, pieces):
        self._blocks(memory, first, n, pieces)

    def put(self, keys, memory, first, pieces):
        self._call(self.lib.ferry_kv_put, keys, memory, first, pieces, True)

    def get(self, keys, memory, first, pieces):
        self._call(self.lib.ferry_kv_get, keys, memory, first, pieces, False)

    def close(self):
        self.lib.ferry_kv_free(self.store)


class FerryPy:
    """ferry.KVStore with torch tensors over the same memory."""

    def __init__(self, root, capacity, block_bytes):
        import ferry
        import torch
        self.torch = torch
        self.store = ferry.KVStore(root, model="kv_vs_fs_tier", dtype="bf16", block_layout="bench",
                                   capacity_bytes=capacity, block_bytes=block_bytes)
        self.prepared = {}

    def _blocks(self, memory, first, n, pieces):
        """The batch's blocks, made once per batch: where the pieces split a block evenly, one
        ferry.KVPages (piece k of every block is row j of "layer" k, as an engine's paged cache
        is given), else each block's tensor views."""
        at = (id(memory), first, n, pieces)
        if at not in self.prepared:
            import ferry
            whole = self.torch.frombuffer(memory.map, dtype=self.torch.uint8)
            if pieces > 1 and memory.size % pieces == 0:
                piece = memory.size // pieces
                grid = whole.as_strided((n, pieces, piece), (memory.stride, piece, 1),
                                        first * memory.stride + memory.misalign)
                self.prepared[at] = ferry.KVPages([grid[:, k] for k in range(pieces)], range(n))
            else:
                out = []
                for j in range(first, first + n):
                    start = j * memory.stride + memory.misalign
                    t = whole[start:start + memory.size]
                    out.append(list(t.chunk(pieces)) if pieces > 1 else t)
                self.prepared[at] = out
        return self.prepared[at]

    def prepare(self, memory, first, n, pieces):
        self._blocks(memory, first, n, pieces)

    def put(self, keys, memory, first, pieces):
        r = self.store.put(keys, self._blocks(memory, first, len(keys), pieces))
        bad = [x for x in r if not x.ok]
        if bad:
            raise RuntimeError(f"ferry: {len(bad)} blocks failed: {bad[0]}")

    def get(self, keys, memory, first, pieces):
        r = self.store.get(keys, self._blocks(memory, first, len(keys), pieces))
        bad = [x for x in r if not x.ok]
        if bad:
            raise RuntimeError(f"ferry: {len(bad)} blocks failed: {bad[0]}")

    def close(self):
        self.store.close()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    a = parse()
    size = int(a.block_mib * (1 << 20))
    total = size * a.blocks
    root = os.path.abspath(a.dir)
    fs_root, kv_root = os.path.join(root, "fs_tier"), os.path.join(root, "ferry")
    for d in (fs_root, kv_root):
        shutil.rmtree(d, ignore_errors=True)
    source = Memory(a.blocks, size, a.misalign)
    source.fill(1)
    dest = Memory(a.blocks, size, a.misalign)
    tier = FsTier(fs_root, a.threads, a.pieces)
    capacity = total * 2
    if a.lib:
        store, api = FerryC(a.lib, kv_root, capacity, size), "C ABI (" + a.lib + ")"
    else:
        try:
            store, api = FerryPy(kv_root, capacity, size), "ferry.KVStore"
        except ImportError as e:
            sys.exit(f"ferry or torch not importable ({e}); pass --lib build/libferry.so")

    def slabs():
        for dirpath, _, files in os.walk(kv_root):
            for f in files:
                if f.startswith("slab-"):
                    yield os.path.join(dirpath, f)

    figures = {k: [] for k in ("ferry put", "fs put", "fs put+fdatasync", "ferry get cold",
                               "fs get cold", "ferry get warm", "fs get warm")}
    gb = total / 1e9
    # Piece lists are made before anything is timed, both sides alike: an engine's layout is
    # fixed, and building thousands of Python objects per call would be what is measured.
    for s in range(0, a.blocks, a.batch):
        n = min(a.batch, a.blocks - s)
        store.prepare(source, s, n, a.pieces)
        store.prepare(dest, s, n, a.pieces)
    if tier._aligned(source, 0):
        tier.prepare(source, a.blocks)
        tier.prepare(dest, a.blocks)
    for rnd in range(a.rounds):
        keys = [rnd * 1000003 + i + 1 for i in range(a.blocks)]

        def each_batch(call, memory):
            starts = range(0, a.blocks, a.batch)
            one = lambda s: call(keys[s:s + a.batch], memory, s, a.pieces)  # noqa: E731
            if a.inflight <= 1:
                for s in starts:
                    one(s)
                return
            with ThreadPoolExecutor(a.inflight) as calls:
                list(calls.map(one, starts))  # an exception of any call raised here

        def ferry_put():
            each_batch(store.put, source)

        def ferry_get():
            each_batch(store.get, dest)

        order = [0, 1] if rnd % 2 == 0 else [1, 0]
        for who in order:
            if who == 0:
                figures["ferry put"].append(gb / timed(ferry_put))
            else:
                figures["fs put"].append(gb / timed(lambda: tier.put(source, a.blocks, False)))
                figures["fs put+fdatasync"].append(
                    gb / timed(lambda: tier.put(source, a.blocks, True)))
        for f in slabs():
            drop_file_cache(f)
        tier.drop(a.blocks)
        for who in order:
            dest.map[:] = bytes(len(dest.map))
            if who == 0:
                figures["ferry get cold"].append(gb / timed(ferry_get))
            else:
                figures["fs get cold"].append(gb / timed(lambda: tier.get(dest, a.blocks)))
            for i in range(a.blocks):
                if dest.block(i) != source.block(i):
                    sys.exit(f"round trip ({'ferry' if who == 0 else 'fs tier'}): block {i} "
                             "read back differs from the one written")
        for who in order:
            if who == 0:
                figures["ferry get warm"].append(gb / timed(ferry_get))
            else:
                figures["fs get warm"].append(gb / timed(lambda: tier.get(dest, a.blocks)))
    store.close()
    tier.release()
    print(f"{a.blocks} blocks of {size / (1 << 20):g} MiB in {a.pieces} piece(s), host memory "
          f"misaligned by {a.misalign} B; ferry: {api}, {a.batch} blocks per call, {a.inflight} "
          f"at once; fs tier: a file "
          f"per block, O_DIRECT, {a.threads} threads; piece lists made before timing; {root}; "
          f"median of {a.rounds} rounds, GB/s")
    for name, values in figures.items():
        print(f"  {name:18s} {statistics.median(values):6.2f}   "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    ratio = lambda x, y: statistics.median(figures[x]) / statistics.median(figures[y])
    print(f"  ferry / fs tier: put {ratio('ferry put', 'fs put+fdatasync'):.2f} (vs durable), "
          f"{ratio('ferry put', 'fs put'):.2f} (vs unsynced); get cold "
          f"{ratio('ferry get cold', 'fs get cold'):.2f}, warm {ratio('ferry get warm', 'fs get warm'):.2f}")
    source.release()
    dest.release()
    shutil.rmtree(root + "/fs_tier", ignore_errors=True)
    shutil.rmtree(kv_root, ignore_errors=True)


if __name__ == "__main__":
    main()
