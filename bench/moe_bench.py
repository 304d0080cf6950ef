"""MoE expert streaming benchmark (GPU machine): a Mixtral-shaped model (transformers, random
init, bf16) decodes greedily, batch 1 with a KV cache, so the routing trace is the model's own
router's. Modes: resident; ferry's expert cache (`--slots` of the experts per layer, from pinned
memory; LRU and frequency policies); and loading each step's experts synchronously (pinned
.to() of exactly the experts the router chose, no cache). Prints tokens/s, the cache's hit rate
and bytes per token; figures only.

  python3 moe_bench.py [--layers 8] [--experts 8] [--slots 4] [--tokens 64] [--json out.json]"""
import argparse
import gc
import inspect
import sys
import time

import torch

import ferry.torch
from ferry.offload import find_fused_experts, find_moe_blocks

from common import write_json


def build(args, device):
    import transformers
    config = transformers.MixtralConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=8,
        num_local_experts=args.experts, num_experts_per_tok=args.top_k, vocab_size=32000,
        max_position_embeddings=4096)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = transformers.MixtralForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def decode(model, device, tokens, warmup=8, on_start=None):
    """Greedy decode of `tokens` tokens after `warmup`; returns tokens per second. `on_start`
    is called when the timed tokens begin."""
    ids = torch.tensor([[1, 15043, 29892, 590]], device=device)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = None
        for i in range(warmup + tokens):
            if i == warmup:
                torch.cuda.synchronize()
                if on_start:
                    on_start()
                start = time.perf_counter()
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


class SyncExperts:
    """No cache: every call copies exactly the experts the router chose, pinned and blocking."""

    def __init__(self, model, device):
        self.modules = find_fused_experts(model)
        self.host = {}
        self.bytes = 0
        for m in self.modules:
            params = list(m.parameters(recurse=False))
            self.host[m] = [p.data.to("cpu").pin_memory() for p in params]
            for p in params:
                p.data = torch.empty((0,) + tuple(p.shape[1:]), dtype=p.dtype, device=device)
            inner, signature = m.forward, inspect.signature(m.forward)

            def forward(*a, _m=m, _inner=inner, _sig=signature, **k):
                bound = _sig.bind(*a, **k)
                index = bound.arguments["top_k_index"]
                hit = torch.unique(index).tolist()
                lut = torch.zeros(_m.num_experts, dtype=index.dtype, device=index.device)
                lut[hit] = torch.arange(len(hit), dtype=index.dtype, device=index.device)
                experts = _m.num_experts
                for p, h in zip(_m.parameters(recurse=False), self.host[_m]):
                    p.data = h[hit].to(device)  # gathered on the host, copied synchronously
                    self.bytes += p.data.numel() * p.element_size()
                bound.arguments["top_k_index"] = lut[index]
                _m.num_experts = len(hit)
                try:
                    return _inner(*bound.args, **bound.kwargs)
                finally:
                    _m.num_experts = experts
            m.forward = forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--speculative", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device("cuda:0")
    results = {"args": vars(args), "modes": []}

    def report(mode, tok_s, stats=None, bytes_moved=None):
        r = {"mode": mode, "tok_s": tok_s, "gpu_bytes": torch.cuda.memory_allocated(device)}
        line = f"  {mode}: {tok_s:.2f} tok/s, GPU {r['gpu_bytes'] / 1e9:.2f} GB"
        if stats:
            uses = stats["hits"] + stats["misses"]
            r.update(hit_rate=stats["hits"] / max(uses, 1), bytes_per_token=stats["bytes"] / args.tokens)
            line += f", hit rate {r['hit_rate']:.2f}, {r['bytes_per_token'] / 1e6:.0f} MB/token"
        if bytes_moved is not None:
            r["bytes_per_token"] = bytes_moved / args.tokens
            line += f", {r['bytes_per_token'] / 1e6:.0f} MB/token"
        print(line, flush=True)
        results["modes"].append(r)

    model = build(args, device)
    if not find_fused_experts(model) and not find_moe_blocks(model):
        print("this transformers builds no MoE block ferry serves", file=sys.stderr)
        return 1
    # The process's first decodes pay one-time costs (kernel loads, allocator growth; 8x slower
    # in one run): an untimed pass first, so "resident" is the model's own rate.
    decode(model, device, args.tokens)
    report("resident", decode(model, device, args.tokens))
    for policy in ("lru", "frequency"):
        off = ferry.torch.offload_experts(model, slots=args.slots, policy=policy,
                                          speculative=args.speculative)
        gc.collect()
        torch.cuda.empty_cache()
        before = {}
        tok_s = decode(model, device, args.tokens, on_start=lambda: before.update(off.stats()))
        after = off.stats()
        report(f"ferry cache {args.slots}/{args.experts} {policy}", tok_s,
               {k: after[k] - before[k] for k in ("hits", "misses", "bytes")})
        off.undo()
    # Again, undone: the model is resident as before, its slots and hooks gone.
    gc.collect()
    torch.cuda.empty_cache()
    report("resident, after undo", decode(model, device, args.tokens))
    if find_fused_experts(model):
        naive = SyncExperts(model, device)
        gc.collect()
        torch.cuda.empty_cache()
        tok_s = decode(model, device, args.tokens, warmup=2,
                       on_start=lambda: setattr(naive, "bytes", 0))
        report("sync load per step", tok_s, bytes_moved=naive.bytes)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
