"""Writes benchmark checkpoints with Hugging Face's safetensors writer (needs torch).

usage: make_checkpoints.py DIR [MODEL ...]   (bench/model_shapes.py names them; default MODELS)
Each model goes to DIR/MODEL/: one model.safetensors, or N shards plus
model.safetensors.index.json, split in order the way transformers' save_pretrained does.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

from model_shapes import ALL, MODELS

POOL_BYTES = 64 << 20


def random_tensor(shape, seed, pool):
    """bf16 tensor of random bytes: the pool, read from a per-tensor offset, wrapping around."""
    n = math.prod(shape) * 2
    out = torch.empty(n, dtype=torch.uint8)
    position = (seed * 4099) % POOL_BYTES
    filled = 0
    while filled < n:
        take = min(n - filled, POOL_BYTES - position)
        out[filled:filled + take] = pool[position:position + take]
        filled += take
        position = 0
    return out.view(torch.bfloat16).view(shape)


def write_model(root, name, shapes=None, shards=None):
    """Writes DIR/NAME; `shapes` and `shards` default to model_shapes.ALL[name]'s."""
    if shapes is None:
        shapes_fn, shards = ALL[name]
        shapes = shapes_fn()
    target = os.path.join(root, name)
    os.makedirs(target, exist_ok=True)
    pool = torch.randint(0, 256, (POOL_BYTES,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    names = list(shapes)
    total = sum(math.prod(s) * 2 for s in shapes.values())
    per_shard = total / shards
    groups, current, size = [], [], 0
    for n in names:
        current.append(n)
        size += math.prod(shapes[n]) * 2
        if size >= per_shard * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(current)
            current = []
    groups.append(current)
    weight_map = {}
    for i, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: random_tensor(shapes[n], names.index(n), pool) for n in group}
        save_file(tensors, os.path.join(target, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
        del tensors
    if shards > 1:
        with open(os.path.join(target, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{name}: {len(names)} tensors, {total / 1e9:.2f} GB in {len(groups)} file(s) at {target}")
    return target


if __name__ == "__main__":
    root = sys.argv[1]
    for model in sys.argv[2:] or list(MODELS):
        write_model(root, model)
