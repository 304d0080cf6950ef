"""ferry for PyTorch: the safetensors.torch shapes, plus loaders for inference servers."""
import concurrent.futures
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch

from . import _ferry
from ._save import torch_save as save, torch_save_file as save_file, torch_write_file as write_file  # noqa: F401
from ._dtypes import normalize_device, tensor_table, torch_dtype, torch_shape

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


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


def load(path: PathLike, device: Any = "cpu", names: Optional[Iterable[str]] = None,
         progress: Optional[Callable[[int, int], None]] = None, **engine) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Loads a checkpoint; returns (tensors, statistics). `engine` takes io, backend,
    allow_compat, staging_bytes, chunk_bytes, threads and slots (as `ferry load` does)."""
    checkpoint = _ferry.Checkpoint.open(os.fspath(path))
    loaded = _ferry.load(checkpoint, normalize_device(device), list(names) if names is not None else None,
                         progress=progress, **engine)
    return _tensors(loaded, tensor_table(checkpoint)), loaded.stats()


def load_file(filename: PathLike, device: Any = "cpu") -> Dict[str, torch.Tensor]:
    """Like safetensors.torch.load_file; `filename` may also be a shard directory or an index."""
    return load(filename, device)[0]


def _groups(checkpoint, group_bytes: int) -> List[List[str]]:
    """Tensor names in read order, cut into groups of about group_bytes (never inside a tensor)."""
    groups: List[List[str]] = [[]]
    size = 0
    for name, _, _, nbytes, _, _ in checkpoint.tensors():
        if groups[-1] and size + nbytes > group_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return [g for g in groups if g]


def iterate_weights(paths: Union[PathLike, Iterable[PathLike]], device: Any = "cpu",
                    group_bytes: int = 1 << 30, **engine) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yields (name, tensor) while the load proceeds: the next group of tensors (about
    group_bytes) loads in the background, with the GIL released, while this one is consumed."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    dev = normalize_device(device)
    work = []
    for path in paths:
        checkpoint = _ferry.Checkpoint.open(os.fspath(path))
        table = tensor_table(checkpoint)
        work += [(checkpoint, table, group) for group in _groups(checkpoint, group_bytes)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_ferry.load, work[0][0], dev, work[0][2], **engine) if work else None
        for i, (_, table, group) in enumerate(work):
            loaded = pending.result()
            pending = (pool.submit(_ferry.load, work[i + 1][0], dev, work[i + 1][2], **engine)
                       if i + 1 < len(work) else None)
            tensors = _tensors(loaded, table)
            for name in group:
                yield name, tensors[name]


def load_into(target: Union[torch.nn.Module, Dict[str, torch.Tensor]], path: PathLike,
              strict: bool = True, **engine) -> dict:
    """Fills existing parameters and buffers in place (no second allocation). `target` is a module
    (its state_dict) or a dict of tensors. With strict, every target tensor must be in the
    checkpoint; each must match the checkpoint's dtype and shape and be contiguous. Returns
    statistics with 'missing' and 'unexpected' names."""
    tensors = target.state_dict(keep_vars=True) if isinstance(target, torch.nn.Module) else target
    checkpoint = _ferry.Checkpoint.open(os.fspath(path))
    table = tensor_table(checkpoint)
    missing = sorted(n for n in tensors if n not in table)
    unexpected = sorted(n for n in table if n not in tensors)
    if strict and missing:
        raise KeyError(f"{os.fspath(path)}: no tensor for {', '.join(missing[:5])}"
                       + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    by_device: Dict[str, List[Tuple[str, int, int]]] = {}
    for name, tensor in tensors.items():
        if name not in table:
            continue
        dtype, shape, nbytes = table[name]
        want = torch_dtype(dtype, name)
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        if data.dtype != want or list(data.shape) != torch_shape(dtype, shape):
            raise ValueError(f'tensor "{name}": checkpoint has {dtype} {shape}, target has '
                             f"{data.dtype} {list(data.shape)}")
        if not data.is_contiguous():
            raise ValueError(f'tensor "{name}": target is not contiguous')
        by_device.setdefault(normalize_device(data.device), []).append((name, data.data_ptr(), nbytes))
    stats = {"missing": missing, "unexpected": unexpected, "loads": []}
    for dev, destinations in by_device.items():
        if dev.startswith("cuda"):
            torch.cuda.synchronize(dev)  # no kernel may still be using the targets
        stats["loads"].append(_ferry.load_into(checkpoint, destinations, dev, **engine))
    return stats
