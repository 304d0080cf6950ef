"""Torch views of the tensors ferry loaded: no copies, and each view keeps the memory alive.
Below ferry.torch and ferry._open, which both build on it."""
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _ferry
from ._dtypes import tensor_table, torch_dtype, torch_shape


def _as_tensor(loaded: "_ferry.Loaded", name: str, dtype: str, shape: List[int]) -> torch.Tensor:
    """A torch view of a loaded tensor's bytes: no copy, and it keeps the memory alive."""
    raw = torch.from_dlpack(loaded.bytes(name))
    target = torch_dtype(dtype, name)
    return raw.view(target).reshape(torch_shape(dtype, shape))


def _tensors(loaded: "_ferry.Loaded", table) -> Dict[str, torch.Tensor]:
    # Typed views need one torch call per tensor instead of three (measured: a 3,219-tensor MoE
    # checkpoint lost a fifth of its load time to building views).
    return {name: torch.from_dlpack(view) if view is not None else _as_tensor(loaded, name, *table[name][:2])
            for name, view in loaded.views()}


def _load_tensors(checkpoint: "_ferry.Checkpoint", device: str, names: Optional[List[str]] = None,
                  progress: Any = None, **engine) -> Tuple[Dict[str, torch.Tensor], "_ferry.Loaded", list]:
    """(tensors, the Loaded result, Python's timeline) of one engine load on `device` (an engine
    device). The tensors are built while the reads run (the engine holds no GIL meanwhile):
    torch takes ~10 us per tensor, tens of milliseconds for thousands. None is handed out before
    every byte landed."""
    began = time.perf_counter()
    pending = _ferry.start_load(checkpoint, device, names, progress=progress, **engine)
    started = time.perf_counter()
    try:
        tensors = _tensors(pending, tensor_table(checkpoint))
    finally:
        built = time.perf_counter()
        loaded = pending.wait()  # the bytes land (or the load fails) before any tensor is seen
    timeline = [["load_started", started - began], ["tensors_built", built - began],
                ["load_waited", time.perf_counter() - began]]
    return tensors, loaded, timeline
