"""vLLM's load formats on a GPU, ferry's among them: time from LLM(...) to ready and the weight
loading vLLM logs ("Loading weights took ..."), each format in a fresh process, warm (files in
the page cache) and cold (their pages dropped with posix_fadvise); ferry's greedy tokens must equal
safetensors'. The checkpoint: Llama-3-8B's shape with random weights (names and shapes from
transformers' LlamaForCausalLM built on the meta device), written once as safetensors shards.

    VLLM_ATTENTION_BACKEND=TRITON_ATTN VLLM_USE_FLASHINFER_SAMPLER=0 \
        python bench/vllm_gpu.py --dir /tmp/llama8b [--tp 2] [--formats ferry-own,ferry,safetensors,...] [--states warm|cold]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

FORMATS = ["ferry-own", "ferry", "safetensors", "fastsafetensors", "runai_streamer",
           "instanttensor"]
PROMPT = list(range(1000, 1032))


def write_checkpoint(folder: str, shard_bytes: int = 5 << 30) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    if os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        return
    os.makedirs(folder, exist_ok=True)
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, torch_dtype="bfloat16", tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in transformers.LlamaForCausalLM(config).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shard, size, weight_map, index = {}, 0, {}, 0

    def flush():
        nonlocal shard, size, index
        if shard:
            index += 1
            name = f"model-{index:05d}.safetensors"
            save_file({k: v.cpu() for k, v in shard.items()}, os.path.join(folder, name),
                      {"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, size = {}, 0

    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
        else:
            tensor = (torch.randn(shape, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        if size + tensor.numel() * 2 > shard_bytes:
            flush()
        shard[name] = tensor
        size += tensor.numel() * 2
    flush()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config.save_pretrained(folder)


def drop_cache(folder: str) -> None:
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(folder: str, load_format: str, tp: int) -> None:
    """One LLM(...) in this process: prints one JSON line with its times and greedy tokens.
    load_format "ferry-own": ferry's own load of the checkpoint to cuda:0, outside vLLM."""
    if load_format == "ferry-own":
        import torch
        import ferry.torch
        started = time.perf_counter()
        tensors, _ = ferry.torch.load_with_stats(folder, "cuda:0")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        print("RESULT " + json.dumps({"format": load_format, "ready_s": seconds,
                                      "own_s": seconds, "tokens": []}), flush=True)
        return
    from vllm import LLM, SamplingParams
    started = time.perf_counter()
    llm = LLM(model=folder, load_format=load_format, tensor_parallel_size=tp,
              skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.85,
              max_model_len=4096)
    ready = time.perf_counter() - started
    out = llm.generate([{"prompt_token_ids": PROMPT}],
                       SamplingParams(temperature=0.0, max_tokens=16, detokenize=False))
    print("RESULT " + json.dumps({"format": load_format, "ready_s": ready,
                                  "tokens": list(out[0].outputs[0].token_ids)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/llama8b")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--states", default="warm,cold")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "write":
        return write_checkpoint(args.dir)
    if args.child:
        return child(args.dir, args.child, args.tp)
    os.environ.setdefault("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    # In a process of its own: the GPU memory it takes is gone before vLLM starts.
    subprocess.run([sys.executable, __file__, "--dir", args.dir, "--child", "write"], check=True)
    rows = []
    for state in args.states.split(","):
        for fmt in args.formats.split(","):
            if state == "cold":
                drop_cache(args.dir)
            else:  # warm: the files read once into the page cache
                for name in os.listdir(args.dir):
                    with open(os.path.join(args.dir, name), "rb") as f:
                        while f.read(64 << 20):
                            pass
            done = subprocess.run([sys.executable, __file__, "--dir", args.dir, "--tp",
                                   str(args.tp), "--child", fmt], capture_output=True, text=True)
            result = next((json.loads(l[7:]) for l in done.stdout.splitlines()
                           if l.startswith("RESULT ")), None)
            if result is None:
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                print(f"{fmt} ({state}): failed, exit {done.returncode}:\n  " + "\n  ".join(tail))
                continue
            # vLLM logs it in the process that loads (the engine core, each rank's worker).
            loading = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) s",
                                                     done.stdout + done.stderr)]
            result["load_s"] = max(loading) if loading else result.get("own_s")
            result["state"] = state
            rows.append(result)
            load = f"{result['load_s']:.2f}" if result["load_s"] is not None else "?"
            print(f"{fmt:16s} {state:5s} tp={args.tp}  LLM() to ready {result['ready_s']:7.2f} s  "
                  f"weights {load} s", flush=True)
    by = {(r["format"], r["state"]): r for r in rows}
    for state in args.states.split(","):
        a, b = by.get(("ferry", state)), by.get(("safetensors", state))
        if a and b:
            same = a["tokens"] == b["tokens"]
            print(f"greedy tokens ferry == safetensors ({state}): {same}")
            if not same:
                print(f"  ferry       {a['tokens']}\n  safetensors {b['tokens']}")
                sys.exit(1)


if __name__ == "__main__":
    main()
