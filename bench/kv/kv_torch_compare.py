"""ferry.KVStore beside the stores a user would write by hand, on the same blocks: torch.save of
each block's .cpu() copy to its own file and torch.load back, and raw per-file writes of each
block's bytes (the shape of LMCache's local disk backend and vLLM's file offloading handler).
GB/s for put (store) and get (load back into the device). ferry's puts are durable (fdatasync
before the index record); the others are not synced, as those stores do not sync. With
--drop-caches (root) the page cache is dropped before each get, so every get reads the disk.

    python3 bench/kv/kv_torch_compare.py --dir /tmp/kvcmp --device cuda:0 [--block 2M] [--blocks 512]
Timings are printed for reporting only.
"""
import argparse
import os
import shutil
import time

import torch

import ferry


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def drop_caches(enabled):
    if not enabled:
        return "warm"
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "cold"
    except OSError:
        return "warm (could not drop the page cache)"


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--block", type=size, default=2 << 20, help="bytes per block (default 2M)")
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--layers", type=int, default=32, help="pieces per block: K and V per layer")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--drop-caches", action="store_true")
    a = p.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    piece = a.block // (2 * a.layers) // 2  # bf16 elements per piece
    gen = torch.Generator().manual_seed(0)
    # Blocks as vLLM holds them: 2 x layers pages; here one tensor per block, (2*layers, piece).
    blocks = [torch.randn(2 * a.layers, piece, generator=gen).to(device=a.device,
                                                                 dtype=torch.bfloat16)
              for _ in range(a.blocks)]
    block_bytes = blocks[0].numel() * 2
    total = block_bytes * a.blocks / 1e9
    rows = []

    # torch.save / torch.load, one file per block.
    tdir = os.path.join(a.dir, "torch")
    os.makedirs(tdir)
    put = timed(lambda: [torch.save(b.cpu(), os.path.join(tdir, f"{i}.pt"))
                         for i, b in enumerate(blocks)], a.device)
    state = drop_caches(a.drop_caches)
    back = []
    get = timed(lambda: back.extend(torch.load(os.path.join(tdir, f"{i}.pt")).to(a.device)
                                    for i in range(a.blocks)), a.device)
    assert all(torch.equal(x, y) for x, y in zip(blocks, back))
    rows.append(("torch.save / torch.load, file per block", put, get, state))

    # Raw bytes, one file per block (LMCache local disk / vLLM file handler style).
    rdir = os.path.join(a.dir, "raw")
    os.makedirs(rdir)

    def raw_put():
        for i, b in enumerate(blocks):
            with open(os.path.join(rdir, f"{i}.bin"), "wb") as f:
                f.write(b.cpu().view(torch.uint8).numpy().tobytes())

    def raw_get():
        for i, b in enumerate(blocks):
            with open(os.path.join(rdir, f"{i}.bin"), "rb") as f:
                data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
            b2 = torch.empty_like(b)
            b2.view(torch.uint8).view(-1).copy_(data.to(a.device))
            back.append(b2)

    put = timed(raw_put, a.device)
    state = drop_caches(a.drop_caches)
    back.clear()
    get = timed(raw_get, a.device)
    assert all(torch.equal(x, y) for x, y in zip(blocks, back))
    rows.append(("raw bytes, file per block", put, get, state))

    # ferry, per-layer pieces gathered into one write per block, in batches.
    paths = ["staged"] + (["direct"] if a.device.startswith("cuda") else [])
    for path in paths:
        root = os.path.join(a.dir, "ferry-" + path)
        store = ferry.KVStore(root, model="compare", dtype="bf16", block_layout=str(a.layers),
                              capacity_bytes=a.blocks * (block_bytes + 4096),
                              block_bytes=block_bytes, gpu_path=path, allow_compat=True)
        pieces = [list(b.unbind(0)) for b in blocks]
        targets = [torch.empty_like(b) for b in blocks]
        target_pieces = [list(t.unbind(0)) for t in targets]
        routes = set()

        def ferry_put():
            for i in range(0, a.blocks, a.batch):
                keys = range(i, min(i + a.batch, a.blocks))
                for r in store.put(keys, pieces[i:i + a.batch]):
                    assert r.ok, r
                    routes.add(r.route)

        def ferry_get():
            for i in range(0, a.blocks, a.batch):
                keys = range(i, min(i + a.batch, a.blocks))
                for r in store.get(keys, target_pieces[i:i + a.batch]):
                    assert r.ok, r

        try:
            put = timed(ferry_put, a.device)
        except AssertionError as e:
            print(f"ferry {path}: {e}")
            store.close()
            continue
        state = drop_caches(a.drop_caches)
        get = timed(ferry_get, a.device)
        assert all(torch.equal(x, y) for x, y in zip(blocks, targets))
        rows.append((f"ferry.KVStore {path} ({'/'.join(sorted(routes))}, durable)", put, get,
                     state))
        store.close()

    print(f"{a.blocks} blocks of {block_bytes >> 10} KiB ({2 * a.layers} pieces each) on "
          f"{a.device}, {total:.2f} GB:")
    for name, put, get, state in rows:
        print(f"  {name:58s} put {total / put:6.2f} GB/s   get ({state}) {total / get:6.2f} GB/s")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
