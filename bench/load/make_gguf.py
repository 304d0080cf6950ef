"""Writes a GGUF benchmark file with llama.cpp's own writer (the gguf package): Llama-3-8B
shapes, F16 tensors with random bits, so it is exactly the size of the safetensors checkpoint
from make_checkpoints.py and the two load speeds compare directly.

usage: make_gguf.py OUT.gguf
"""
import os
import sys

import numpy as np
from gguf import GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: shared helpers
from model_shapes import llama3_8b  # noqa: E402

POOL = np.random.default_rng(7).integers(0, 1 << 16, size=32 << 20, dtype=np.uint16)


def random_f16(shape, seed):
    n = int(np.prod(shape))
    reps = -(-n // POOL.size)
    data = np.roll(np.tile(POOL, reps)[:n] if reps > 1 else POOL[:n], seed)
    return data.view(np.float16).reshape(shape)


def main(path):
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(32)
    writer.add_context_length(8192)
    writer.add_embedding_length(4096)
    shapes = llama3_8b()
    tensors = {name: random_f16(shape, i) for i, (name, shape) in enumerate(shapes.items())}
    for name, t in tensors.items():
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{path}: {len(tensors)} F16 tensors, {sum(t.nbytes for t in tensors.values()) / 1e9:.2f} GB")


if __name__ == "__main__":
    main(sys.argv[1])
