"""Time to a ready transformers model: ferry.transformers.from_pretrained beside transformers'
own from_pretrained, on the Llama-3-8B shape (or the 0.6B one for a quick run, or moe-16x64, a
Qwen3-MoE shape whose experts transformers 5 fuses while loading).

usage: from_pretrained_bench.py ROOT [--model llama3-8b] [--device cuda:0] [--runs 3] [--cold]
                                [--loaders ferry,transformers] [--json OUT]

ROOT/MODEL holds the checkpoint: written first when absent (bench/make_checkpoints.py: random
bf16 tensors, shards and an index as save_pretrained writes them) with a config.json of that
architecture. Each loader runs in its own fresh process (CUDA started before the clock); a run
is timed from the call until the model is on the device and synchronized, and reports seconds,
GB/s of checkpoint bytes and peak host memory growth. The two models' parameters are compared
bit for bit once, in the last loader's process: its last timed model against one load by the
other loader (no third process, no extra load: the 8B shape fits in about 4 minutes on an
H200/H100 with 3 runs each). --cold drops the page cache before each run (root).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import status_bytes, write_json  # noqa: E402

CONFIGS = {  # transformers config fields of the bench/model_shapes.py architectures
    "llama3-8b": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen3-0.6b": ("Qwen3Config", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                       vocab_size=151936, tie_word_embeddings=True)),
    # bench/model_shapes.py's moe_16x64: Qwen3-MoE layers; transformers 5 fuses its 3,072 expert
    # tensors into 32 gate_up_proj/down_proj parameters while loading (ferry reads each expert
    # into its block of them)
    "moe-16x64": ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=16,
                                         num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                         num_experts=64, num_experts_per_tok=8, moe_intermediate_size=768,
                                         vocab_size=151936, tie_word_embeddings=False)),
    # for smoke runs: written by save_pretrained itself (random init, small shards)
    "tiny-llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512)),
}


def prepare(root, model):
    import torch
    import transformers

    target = os.path.join(root, model)
    if not os.path.exists(os.path.join(target, "config.json")):
        kind, fields = CONFIGS[model]
        config = getattr(transformers, kind)(**fields, torch_dtype=torch.bfloat16)
        if model.startswith("tiny"):
            built = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
            built.save_pretrained(target, max_shard_size="100KB", safe_serialization=True)
            return target
        import make_checkpoints

        make_checkpoints.write_model(root, model)
        config.save_pretrained(target)
    return target


def checkpoint_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


def load(loader, path, device):
    import torch
    import transformers

    # transformers 5 renamed torch_dtype to dtype (the old name warns)
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.bfloat16}

    if loader == "ferry":
        import ferry.transformers

        model = ferry.transformers.from_pretrained(transformers.AutoModelForCausalLM, path, device=device,
                                                   torch_dtype=torch.bfloat16)
        assert ferry.transformers.loaded_by(model) == ferry.transformers.FERRY, ferry.transformers.loaded_by(model)
        return model
    try:
        import accelerate  # noqa: F401  (transformers' device_map needs it)
    except ImportError:
        return transformers.AutoModelForCausalLM.from_pretrained(path, **dtype).to(device).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(path, **dtype, device_map=device).eval()


def child(args):
    import torch

    if args.device.startswith("cuda"):
        torch.zeros(1, device=args.device)  # CUDA starts before the clock
    size = checkpoint_bytes(args.path)
    runs = []
    model = None
    for run in range(args.runs):
        if args.cold:
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")
        before = status_bytes("VmRSS")
        start = time.perf_counter()
        model = load(args.child, args.path, args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize(args.device)
        seconds = time.perf_counter() - start
        runs.append({"loader": args.child, "seconds": seconds, "gb_per_s": size / seconds / 1e9,
                     "peak_host_growth_bytes": max(0, status_bytes("VmHWM") - before)})
        if run + 1 < args.runs:  # the last one is kept for the comparison
            model = None
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if args.compare_with:
        runs[-1]["equal_tensors"] = compare(model, load(args.compare_with, args.path, args.device))
    print(json.dumps(runs))


def compare(mine, other):
    """Both loaders' parameters, bit for bit (random checkpoints hold NaN patterns: compare bits)."""
    import torch

    ours, theirs = dict(mine.named_parameters()), dict(other.named_parameters())
    assert ours.keys() == theirs.keys(), "different parameter names"
    for name, tensor in theirs.items():
        a, b = ours[name].detach(), tensor.detach()
        assert a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16)), name
    return len(ours)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--model", default="llama3-8b", choices=list(CONFIGS))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--loaders", default="ferry,transformers")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=["ferry", "transformers"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--compare-with", choices=["ferry", "transformers"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    path = prepare(args.root, args.model)
    results = []
    loaders = args.loaders.split(",")
    for i, loader in enumerate(loaders):
        cmd = [sys.executable, __file__, args.root, "--child", loader, "--path", path, "--device", args.device,
               "--runs", str(args.runs)] + (["--cold"] if args.cold else [])
        if i == len(loaders) - 1 and len(loaders) > 1:
            cmd += ["--compare-with", loaders[0]]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{loader} failed:\n{done.stderr}")
        results += json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{args.model}: {checkpoint_bytes(path) / 1e9:.2f} GB, device {args.device}"
          f"{' (cold cache)' if args.cold else ''}")
    print(f"{'loader':<14} {'best s':>8} {'median s':>9} {'best GB/s':>10} {'peak host growth':>17}")
    for loader in args.loaders.split(","):
        runs = [r for r in results if r["loader"] == loader]
        seconds = sorted(r["seconds"] for r in runs)
        growth = max(r["peak_host_growth_bytes"] for r in runs)
        print(f"{loader:<14} {seconds[0]:>8.2f} {seconds[len(seconds) // 2]:>9.2f} "
              f"{max(r['gb_per_s'] for r in runs):>10.2f} {growth / 2**20:>13.0f} MiB")
    equal = [r["equal_tensors"] for r in results if "equal_tensors" in r]
    if equal:
        print(f"parameters equal bit for bit: {equal[0]} tensors")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
