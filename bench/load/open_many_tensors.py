"""Opening a checkpoint of many small tensors: ferry against safetensors.

Writes one file of N tensors (100,000 by default, 16 bytes each) with Hugging Face's writer,
then times, median of --repeat runs: ferry's open (every header parsed and validated), ferry's
open plus a plan and load of every tensor to the cpu, `ferry inspect`, and safetensors'
safe_open + keys(); then the same N tensors as --shards files with an index
(model.safetensors.index.json, as transformers writes it), opened by ferry (the target: a file
or an index of 100,000 tensors opens and plans in under 0.2 s). Prints figures only; nothing
here is asserted.

    python3 bench/load/open_many_tensors.py [--tensors N] [--shards 40] [--repeat 5] [--ferry-bin build/cli/ferry]
"""
import json
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
import safetensors

import ferry


def names(count):
    return [f"model.layers.{i // 10}.weight_{i % 10}" for i in range(count)]


def write(path, tensor_names):
    data = np.zeros(4, dtype=np.float32)
    specs = {name: safetensors.TensorSpec(dtype="float32", shape=[4], data_ptr=data.ctypes.data,
                                          data_len=data.nbytes) for name in tensor_names}
    safetensors.serialize_file(specs, path)


def write_sharded(folder, count, shards):
    """`count` tensors in `shards` files and an index, split in order."""
    os.makedirs(folder)
    all_names, weight_map = names(count), {}
    per_shard = -(-count // shards)
    for s in range(shards):
        part = all_names[s * per_shard:(s + 1) * per_shard]
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write(os.path.join(folder, shard), part)
        weight_map.update({name: shard for name in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": count * 16}, "weight_map": weight_map}, f, indent=2)


def median_seconds(fn, repeat):
    """Median wall and CPU seconds (this process's CPU: on a busy machine the wall time mostly
    measures the other processes)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ferry-bin", default=os.path.join("build", "cli", "ferry"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "many.safetensors")
        write(path, names(args.tensors))
        sharded = os.path.join(tmp, "sharded")
        write_sharded(sharded, args.tensors, args.shards)
        rows = [
            ("ferry Checkpoint.open", lambda: ferry.Checkpoint.open(path)),
            ("ferry open + plan + load (cpu)", lambda: ferry._ferry.load(ferry.Checkpoint.open(path), "cpu")),
            ("ferry.safe_open + keys()", lambda: ferry.safe_open(path, "pt").keys()),
            ("safetensors.safe_open + keys()", lambda: safetensors.safe_open(path, "pt").keys()),
            (f"ferry Checkpoint.open, {args.shards} shards + index",
             lambda: ferry.Checkpoint.open(sharded)),
            (f"ferry open + plan + load, {args.shards} shards",
             lambda: ferry._ferry.load(ferry.Checkpoint.open(sharded), "cpu")),
        ]
        if os.path.exists(args.ferry_bin):
            rows.append(("ferry inspect (process)", lambda: subprocess.run(
                [args.ferry_bin, "inspect", path, "--json"], check=True, capture_output=True)))
        print(f"{args.tensors} tensors, median of {args.repeat} runs")
        print(f"  {'':40s} {'wall ms':>9s} {'cpu ms':>9s}")
        for label, fn in rows:
            wall, cpu = median_seconds(fn, args.repeat)
            cpu_text = f"{cpu * 1000:9.1f}" if "process" not in label else f"{'-':>9s}"
            print(f"  {label:40s} {wall * 1000:9.1f} {cpu_text}")


if __name__ == "__main__":
    main()
