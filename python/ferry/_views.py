"""Torch views of the tensors ferry loaded: no copies, and each view keeps the memory alive.
Below ferry.torch and ferry._open, which both build on it."""
from typing import Dict, List

import torch

from . import _ferry
from ._dtypes import torch_dtype, torch_shape


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
