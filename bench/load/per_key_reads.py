"""Per-key reads, as transformers and vLLM take tensors: `with safe_open(...) as f: for k in
f.keys(): f.get_tensor(k)`, ferry against safetensors, warm (everything is read once first).

By default on one file of --tensors tensors of --kib KiB each (1,000 x 256 KiB); with
--checkpoint on an existing file, shard directory or index (e.g. bench/make_checkpoints.py's
llama3-8b), shard by shard as transformers reads them, beside whole-checkpoint loads
(ferry.torch.load_file and safetensors.torch.load_file): the issue's target is per-key
throughput >= 0.8 x ferry.torch.load_file's.

--slices takes rank 0 of 2-way tensor parallelism with get_slice instead: the first half of
dimension 1 for row-parallel weights (o_proj, down_proj; in the generated file every other
tensor), the first half of dimension 0 for the other matrices, 1-D tensors whole; ferry's
bytes read (its handles' stats) are printed against the checkpoint's bytes (target <= 0.55).

On a GPU ferry also runs with its small-read path off ("ferry, engine only": every read a
transfer-engine job, as before that path), to show what it saves.

Every tensor's pages are touched (one byte per 4 KiB summed on its device, collected at the
end), so that a lazily mapped tensor pays for its reads as a copied one does, and both
libraries must give the same sums. Median of --repeat runs; figures only, nothing asserted.

    python3 bench/load/per_key_reads.py [--device cpu|cuda:0] [--tensors 1000] [--kib 256] [--slices]
                                   [--checkpoint PATH] [--repeat 5]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import safetensors
import safetensors.torch
import torch

import ferry
import ferry.torch
from ferry import _open


def touch(t):
    flat = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    return flat[::4096].sum(dtype=torch.int64)


def shards(path):
    """The safetensors files of a file, directory or index, in order."""
    if os.path.isfile(path) and not path.endswith(".json"):
        return [path]
    index = path if path.endswith(".json") else os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        folder = os.path.dirname(index)
        return [os.path.join(folder, f) for f in sorted(set(json.load(open(index))["weight_map"].values()))]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


def tp_rank0(part, name, position):
    """Rank 0 of 2 of a tensor-parallel split of `part` (a get_slice result)."""
    shape = part.get_shape()
    if len(shape) < 2:
        return part[:]
    if any(word in name for word in ("proj", "embed", "lm_head")):  # a transformer's names
        row_parallel = "o_proj" in name or "down_proj" in name
    else:
        row_parallel = position % 2 == 1
    if row_parallel:
        return part[:, : shape[1] // 2]
    return part[: shape[0] // 2]


def iterate(opener, files, device, slices, stats):
    sums = []
    for path in files:
        with opener(path, framework="pt", device=device) as f:
            for position, key in enumerate(f.keys()):
                if slices:
                    sums.append(touch(tp_rank0(f.get_slice(key), key, position)))
                else:
                    sums.append(touch(f.get_tensor(key)))
            if hasattr(f, "stats"):
                for k, v in f.stats().items():
                    stats[k] = stats.get(k, 0) + v
    total = int(torch.stack(sums).sum()) if sums else 0  # one sync, at the end
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return total


def bulk(load, files, device, whole):
    """A whole-checkpoint load: ferry's takes the checkpoint at once, safetensors' shard by shard."""
    sums = []
    for path in ([whole] if whole else files):
        sums += [touch(t) for t in load(path, device=device).values()]
    return int(torch.stack(sums).sum()) if sums else 0


def timed(fn, repeat):
    fn()  # warm the page cache and the code
    times, check = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        check = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), check


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tensors", type=int, default=1000)
    parser.add_argument("--kib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--slices", action="store_true", help="rank 0 of 2-way tensor parallelism")
    parser.add_argument("--checkpoint", help="an existing file, shard directory or index")
    parser.add_argument("--no-bulk", action="store_true", help="skip the whole-checkpoint loads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            path = os.path.join(tmp, "per_key.safetensors")
            cols = args.kib * 1024 // 4 // 64
            generator = torch.Generator().manual_seed(0)
            safetensors.torch.save_file(
                {f"layer.{i}.weight": torch.rand((64, cols), generator=generator) for i in range(args.tensors)}, path)
        files = shards(path)
        file_bytes = sum(os.path.getsize(f) for f in files)
        keys = sum(len(safetensors.safe_open(f, "pt").keys()) for f in files)
        rows = {}
        loaders = [("safetensors", safetensors.safe_open), ("ferry", ferry.safe_open)]
        if args.device.startswith("cuda"):
            loaders.append(("ferry, engine only,", ferry.safe_open))
        small = (_open.SMALL_READ_BYTES, _open.SMALL_TENSOR_BYTES)
        for label, opener in loaders:
            stats = {}
            engine_only = label.startswith("ferry, engine")
            _open.SMALL_READ_BYTES, _open.SMALL_TENSOR_BYTES = (0, 0) if engine_only else small
            rows[label + " per key"] = timed(lambda: iterate(opener, files, args.device, args.slices, stats), args.repeat)
            runs = args.repeat + 1
            if label == "ferry":
                ferry_stats = {k: v // runs for k, v in stats.items()}
        _open.SMALL_READ_BYTES, _open.SMALL_TENSOR_BYTES = small
        if not args.slices and not args.no_bulk:
            rows["ferry.torch.load_file"] = timed(
                lambda: bulk(ferry.torch.load_file, files, args.device, path), args.repeat)
            rows["safetensors load_file"] = timed(
                lambda: bulk(safetensors.torch.load_file, files, args.device, None), args.repeat)
        checks = {label: check for label, (_, check) in rows.items()}
        assert len(set(checks.values())) == 1, f"the loaders read different bytes: {checks}"
        what = "rank 0 of 2 (get_slice)" if args.slices else "get_tensor"
        print(f"{keys} keys, {file_bytes / 1e9:.2f} GB in {len(files)} file(s) "
              f"({os.path.basename(os.path.normpath(path))}), {what} to {args.device}, median of {args.repeat}")
        for label, (seconds, _) in rows.items():
            print(f"  {label:30s} {seconds * 1000:9.1f} ms  {file_bytes / seconds / 1e9:6.2f} GB/s of the file  "
                  f"{seconds * 1e6 / keys:8.1f} us/key")
        ferry_s, st_s = rows["ferry per key"][0], rows["safetensors per key"][0]
        print(f"  ferry / safetensors time (per key): {ferry_s / st_s:.2f}")
        if "ferry.torch.load_file" in rows:
            print(f"  ferry per-key throughput / ferry.torch.load_file's: "
                  f"{rows['ferry.torch.load_file'][0] / ferry_s:.2f} (target >= 0.8 on cuda:0)")
        print(f"  ferry bytes read per run / file bytes: {ferry_stats.get('bytes_read', 0) / file_bytes:.3f}"
              f"{' (target <= 0.55)' if args.slices else ''}; read-ahead hits "
              f"{ferry_stats.get('read_ahead_hits', 0)}, wasted {ferry_stats.get('read_ahead_wasted_bytes', 0)} B")


if __name__ == "__main__":
    main()
