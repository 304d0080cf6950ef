"""What layer and expert offloading share: the device, slot memory, the host arena, and the
checkpoint's entries for source="disk"."""
import ctypes
from typing import Any, Dict, List

import torch

from .._dtypes import torch_dtype, torch_shape


def compute_stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch.cuda.current_stream(device).cuda_stream


def resolve_device(model: torch.nn.Module, device: Any) -> torch.device:
    """`device`, or where the model's first parameter is if that is a GPU, else cuda:0 where
    there is one, else cpu; "cuda" without an index is the current device."""
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None and first.device.type == "cuda" else (
            "cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def engine_device(device: torch.device) -> str:
    """ferry's spelling of a resolved device."""
    return f"cuda:{device.index}" if device.type == "cuda" else "cpu"


def move_others(model: torch.nn.Module, device: torch.device, kept: set) -> None:
    """Every parameter not in `kept` (by id) and every buffer: resident on `device`."""
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) not in kept and p.device != device:
                p.data = p.data.to(device)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.device != device:
                module._buffers[name] = b.to(device)


def fill_arena(address: int, data: torch.Tensor) -> None:
    """Copies a tensor's bytes into ferry's pinned host arena at `address`."""
    n = data.numel() * data.element_size()
    arena = torch.frombuffer((ctypes.c_uint8 * n).from_address(address), dtype=torch.uint8)
    arena.copy_(data.detach().contiguous().reshape(-1).view(torch.uint8))


def aligned_bytes(n: int, device: torch.device) -> torch.Tensor:
    """n bytes at a 256-byte aligned address (CUDA allocations are; host ones may not be)."""
    raw = torch.empty(n + 255, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256
    return raw[skip:skip + n]


def nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def checkpoint_table(checkpoint) -> Dict[str, tuple]:
    return {n: (dtype, list(shape), size, file, offset)
            for n, dtype, shape, size, file, offset in checkpoint.tensors()}


def checked_entry(checkpoint, table, name: str, p: torch.Tensor) -> tuple:
    """(bytes, file, offset) of `name`, which must have p's dtype and shape."""
    if name not in table:
        raise ValueError(f'offload: the checkpoint {checkpoint.path} has no tensor "{name}"')
    dtype, shape, size, file, offset = table[name]
    if torch_dtype(dtype, name) != p.dtype or torch_shape(dtype, shape) != list(p.shape):
        raise ValueError(f'offload: tensor "{name}" is {dtype} {shape} in the checkpoint '
                         f"{checkpoint.path} but {p.dtype} {list(p.shape)} in the model")
    return size, file, offset


def disk_groups(checkpoint, names: List[List[str]], params: List[List[torch.nn.Parameter]]):
    table = checkpoint_table(checkpoint)
    groups = []
    for block_names, block_params in zip(names, params):
        group = []
        for name, p in zip(block_names, block_params):
            size, file, offset = checked_entry(checkpoint, table, name, p)
            group.append((size, 0, file, offset))
        groups.append(group)
    return groups
