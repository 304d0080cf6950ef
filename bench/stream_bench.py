"""Weight streaming benchmark (GPU machine): a Llama-shaped model (random init, bf16; Llama-3-8B
shapes by default) with some decoder layers streamed, beside the resident model.

Modes: resident; ferry from pinned memory (cpu); ferry from the checkpoint on disk (warm: the
file read into the page cache first; cold: caches dropped before every step, needs root); a
naive synchronous copy per layer (pinned .to() before, freed after); accelerate's cpu_offload on
the same layers. For each: decode step time and tokens/s at each batch (one new token per
sequence, no KV cache: a decode step's weight traffic), prefill time of one long sequence, GPU
memory. A step ends when its logits are ready on the compute stream (what a generation loop
waits for before sampling); the copy stream's prefetches for the next step go on meanwhile, as
they would in that loop, so the median step is the steady state.

Beside them the bounds, from rates measured in this run: no step beats its compute (the
resident step) nor its streamed bytes at the source's rate (pinned H2D for cpu; for disk, the
file read with the best of 16, 32 or 64 threads, buffered from the page cache when warm,
O_DIRECT when cold). Each
mode's bound is the larger of the two; "x bound" is bound / measured (1.0 is the hardware).

  python3 stream_bench.py [--layers 32] [--every 2] [--prefetch 2] [--json out.json]
Prints a table last; figures only, no pass/fail."""
import argparse
import gc
import os
import statistics
import sys
import time

import torch

import ferry.torch

from common import write_json


def build(args, device):
    import transformers
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=max(4096, args.prefill))
    # Built on the device in bf16 (random init there takes seconds, and no fp32 copy is made).
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def sync():
    """The end of a step: its outputs ready on the compute stream (not every stream's work)."""
    torch.cuda.current_stream().synchronize()


def timed(fn, runs, before=None):
    """Median seconds of fn over `runs` after a warm-up; `before` runs untimed before each."""
    fn()  # warm-up
    sync()
    times = []
    for _ in range(runs):
        if before:
            before()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pinned_h2d(device, nbytes=1 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    t = timed(lambda: dst.copy_(src, non_blocking=True), 5)
    return nbytes / t


def read_rate(path, direct, threads=16, chunk=4 << 20):
    """Bytes per second reading all of `path` with `threads` threads of `chunk`-byte preads
    (O_DIRECT or through the page cache): the source's own speed, without ferry. A buffered read
    copies ~2-4 GB/s per thread and a device wants many reads in flight: see best_read_rate."""
    import mmap
    import threading
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    chunks = iter(range(0, size, chunk))
    lock = threading.Lock()

    def reader():
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                at = next(chunks, None)
            if at is None:
                return
            os.preadv(fd, [buf], at)

    try:
        start = time.perf_counter()
        workers = [threading.Thread(target=reader) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return size / (time.perf_counter() - start)
    finally:
        os.close(fd)


def best_read_rate(path, direct, cold=False):
    """The best read_rate over 16, 32 and 64 threads (caches dropped before each if `cold`)."""
    best = 0.0
    for threads in (16, 32, 64):
        if cold:
            drop_caches()
        best = max(best, read_rate(path, direct, threads))
    return best


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def measure(model, args, device, label, before_step=None, runs=None):
    runs = runs or args.runs
    out = {"mode": label}
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for batch in args.batches:
            ids = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)

            def step():
                model(input_ids=ids, use_cache=False)
            t = timed(step, runs, before_step)
            out[f"decode_b{batch}_s"] = t
            out[f"decode_b{batch}_tok_s"] = batch / t
        if args.prefill:
            ids = torch.randint(0, vocab, (1, args.prefill), generator=gen).to(device)

            def prefill():
                model(input_ids=ids, use_cache=False)
            out["prefill_s"] = timed(prefill, max(1, runs // 2), before_step)
    out["gpu_bytes"] = torch.cuda.memory_allocated(device)
    print(f"  {label}: " + ", ".join(f"{k}={v:.4g}" for k, v in out.items() if isinstance(v, float)),
          flush=True)
    return out


def copy_stream_throughput(off, device, passes=3):
    """Fills with no compute between them: the copy stream's own rate, events included."""
    stream = off._stream
    current = torch.cuda.current_stream(device).cuda_stream
    n = len(off.layers)
    sync()
    before = stream.stats()["bytes"]
    start = time.perf_counter()
    for _ in range(passes):
        for g in range(n):
            stream.wait(g, current)
            stream.release(g, current)
    stream.synchronize()
    sync()
    elapsed = time.perf_counter() - start
    return (stream.stats()["bytes"] - before) / elapsed


class SyncCopy:
    """The naive way: each streamed layer's weights copied in (pinned, blocking) before it runs
    and dropped after."""

    def __init__(self, layers, device):
        self.handles, self.host = [], {}
        for layer in layers:
            for p in layer.parameters():
                self.host[p] = p.data.to("cpu").pin_memory()
                p.data = torch.empty(0, dtype=p.dtype, device=device)
            self.handles.append(layer.register_forward_pre_hook(self._load))
            self.handles.append(layer.register_forward_hook(self._drop))
        self.device = device

    def _load(self, layer, args):
        for p in layer.parameters():
            p.data = self.host[p].to(self.device)

    def _drop(self, layer, args, out):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)

    def undo(self):
        for h in self.handles:
            h.remove()
        for p, h in self.host.items():
            p.data = h.to(self.device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--every", type=int, default=2, help="stream the last of every N layers")
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="resident,cpu,disk,cold,sync,accelerate")
    ap.add_argument("--dir", default="/tmp/stream-bench")
    ap.add_argument("--json")
    args = ap.parse_args()
    modes = args.modes.split(",")
    device = torch.device("cuda:0")
    torch.set_float32_matmul_precision("high")  # TF32 where fp32 (the model is bf16)

    h2d = pinned_h2d(device)
    model = build(args, device)
    layers = model.model.layers
    chosen = [i for i in range(args.layers) if i % args.every == args.every - 1]
    streamed_bytes = sum(p.numel() * p.element_size() for i in chosen for p in layers[i].parameters())
    print(f"model: {args.layers} layers, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
          f"params; streaming {len(chosen)} layers, {streamed_bytes / 1e9:.2f} GB per step; "
          f"pinned H2D {h2d / 1e9:.1f} GB/s; bound {streamed_bytes / h2d * 1e3:.1f} ms/step", flush=True)
    results = {"h2d_bytes_s": h2d, "streamed_bytes": streamed_bytes, "layers": args.layers,
               "streamed_layers": chosen, "prefetch": args.prefetch, "modes": []}
    if "resident" in modes:
        results["modes"].append(measure(model, args, device, "resident"))

    if "cpu" in modes:
        start = time.perf_counter()
        off = ferry.torch.offload(model, layers=chosen, prefetch=args.prefetch, source="cpu")
        setup = time.perf_counter() - start
        gc.collect()
        torch.cuda.empty_cache()
        r = measure(model, args, device, "ferry cpu")
        r["setup_s"] = setup
        r["copy_stream_bytes_s"] = copy_stream_throughput(off, device)
        r["saved_bytes"] = off.saved_bytes
        print(f"  copy stream alone: {r['copy_stream_bytes_s'] / 1e9:.1f} GB/s "
              f"({r['copy_stream_bytes_s'] / h2d:.2f} x pinned H2D)", flush=True)
        results["modes"].append(r)
        off.undo()

    if "disk" in modes or "cold" in modes:
        os.makedirs(args.dir, exist_ok=True)
        path = os.path.join(args.dir, "streamed.safetensors")
        names = {id(p): n for n, p in model.named_parameters()}
        ferry.torch.save_file({names[id(p)]: p.data for i in chosen for p in layers[i].parameters()}, path)
        off = ferry.torch.offload(model, layers=chosen, prefetch=args.prefetch, source="disk",
                                  checkpoint=path)
        gc.collect()
        torch.cuda.empty_cache()
        if "disk" in modes:
            # ferry writes bypass the page cache: read the file through it once, so that "warm"
            # is warm (ferry then reads it buffered: most of it is cached).
            read_rate(path, direct=False)
            rate = best_read_rate(path, direct=False)
            r = measure(model, args, device, "ferry disk (warm)")
            r["source_bytes_s"] = rate
            print(f"  page-cache read rate (best of 16, 32, 64 threads): {rate / 1e9:.1f} GB/s",
                  flush=True)
            results["modes"].append(r)
        if "cold" in modes and drop_caches():
            rate = best_read_rate(path, direct=True, cold=True)
            r = measure(model, args, device, "ferry disk (cold)", before_step=drop_caches, runs=2)
            r["source_bytes_s"] = rate
            print(f"  O_DIRECT read rate (best of 16, 32, 64 threads): {rate / 1e9:.1f} GB/s",
                  flush=True)
            results["modes"].append(r)
        off.undo()
        os.remove(path)

    if "sync" in modes:
        naive = SyncCopy([layers[i] for i in chosen], device)
        gc.collect()
        torch.cuda.empty_cache()
        results["modes"].append(measure(model, args, device, "naive sync copy", runs=3))
        naive.undo()

    if "accelerate" in modes:
        try:
            from accelerate import cpu_offload
        except ImportError:
            print("  accelerate: not installed", flush=True)
        else:
            for i in chosen:
                cpu_offload(layers[i], execution_device=device)
            gc.collect()
            torch.cuda.empty_cache()
            results["modes"].append(measure(model, args, device, "accelerate cpu_offload", runs=3))

    # Per step: no mode beats the resident compute nor its streamed bytes at its source's rate.
    resident = next((r for r in results["modes"] if r["mode"] == "resident"), None)
    first = f"decode_b{args.batches[0]}"

    def bound(r, key):
        if resident is None or r["mode"] == "resident":
            return float("nan")
        rate = r.get("source_bytes_s", h2d)
        return max(resident[f"{key}_s"], streamed_bytes / rate)

    print("\n| mode | " + " | ".join(f"decode b{b} tok/s" for b in args.batches) +
          f" | prefill s | GPU GB | {first} bound s | x bound | prefill bound s | x bound |")
    print("|---" * (len(args.batches) + 7) + "|")
    for r in results["modes"]:
        cells = [f"{r[f'decode_b{b}_tok_s']:.2f}" for b in args.batches]
        d, p = bound(r, first), bound(r, "prefill") if args.prefill else float("nan")
        if d == d:  # not NaN: the resident row has no bound of its own
            r["decode_bound_s"], r["prefill_bound_s"] = d, p
        print(f"| {r['mode']} | " + " | ".join(cells) +
              f" | {r.get('prefill_s', float('nan')):.3f} | {r['gpu_bytes'] / 1e9:.1f}"
              f" | {d:.3f} | {d / r[f'{first}_s']:.2f} | {p:.3f}"
              f" | {p / r.get('prefill_s', float('nan')):.2f} |")
    print(f"bounds: max(resident step, streamed bytes / source rate); streamed "
          f"{streamed_bytes / 1e9:.2f} GB per step; pinned H2D {h2d / 1e9:.1f} GB/s "
          f"({streamed_bytes / h2d * 1e3:.1f} ms); disk rates on the disk rows above")
    if resident and args.prefill:
        print(f"prefill of {args.prefill} tokens: resident {resident['prefill_s'] * 1e3:.1f} ms; "
              f"with these layers streamed no schedule beats "
              f"{max(resident['prefill_s'], streamed_bytes / h2d) * 1e3:.1f} ms from pinned memory "
              f"({max(resident['prefill_s'], streamed_bytes / h2d) / resident['prefill_s']:.2f} x "
              "resident: the copies alone take that long)")
    write_json(args.json, results)


if __name__ == "__main__":
    sys.exit(main())
