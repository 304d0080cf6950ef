"""Hand-made safetensors files and tensors' bytes, for the drop-in tests (test_dropin.py,
test_dropin_reads.py)."""
import json
import struct

import numpy as np
import torch


def raw_file(path, header: dict, data: bytes, pad: bytes = b""):
    text = json.dumps(header).encode() + pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def entry(dtype, shape, begin, end, **extra):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end], **extra}


def as_bytes(t) -> bytes:
    if isinstance(t, np.ndarray):
        return t.tobytes()
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
