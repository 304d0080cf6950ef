"""ferry for PyTorch: safetensors.torch's loading API (load_file, load, load_model, safe_open),
plus loaders for inference servers (load_with_stats, iterate_weights, load_into) and weight
streaming (offload)."""
import concurrent.futures
import os
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

import torch

from . import _ferry
from ._dtypes import engine_device, normalize_device, tensor_table, torch_dtype, torch_shape
from ._ferry import SafetensorError
from ._open import check_backend, open_checkpoint, safe_open
from ._save import _storage, shared_tensor_groups as _shared_groups  # as safetensors groups
from ._save import torch_save as save, torch_save_file as save_file, torch_write_file as write_file  # noqa: F401
from ._views import _load_tensors, _tensors
from .offload import ExpertOffload, Offload, offload, offload_experts, plan_offload

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

__all__ = ["ExpertOffload", "iterate_weights", "load", "load_file", "load_into", "load_model",
           "load_with_stats", "Offload", "offload", "offload_experts", "plan_offload", "prepare",
           "safe_open",
           "SafetensorError", "save", "save_file", "slice_plan"]


def load_with_stats(path: PathLike, device: Any = "cpu", names: Optional[Iterable[str]] = None,
                    progress: Optional[Callable[[int, int], None]] = None,
                    **engine) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Loads a checkpoint (a file, a shard directory or an index); returns (tensors, statistics).
    `engine` takes io, backend, allow_compat, staging_bytes, chunk_bytes, threads, slots,
    copy_streams, profile, page_cache_pin and cache_device_memory (as `ferry load` does;
    page_cache_pin="4GiB" keeps files wholly in the page cache registered with the GPU driver for
    copies straight from there, reused by later loads in the process; cache_device_memory=True
    takes GPU memory from a cache that keeps what loads free for later loads, until
    ferry.release_cached_device_memory())."""
    began = time.perf_counter()
    checkpoint = open_checkpoint(path)
    target = normalize_device(device)
    opened = time.perf_counter() - began
    tensors, loaded, marks = _load_tensors(checkpoint, engine_device(target),
                                           list(names) if names is not None else None,
                                           progress=progress, **engine)
    if engine_device(target) != target:
        tensors = {name: t.to(target) for name, t in tensors.items()}
    stats = loaded.stats()
    # Python's side of the timeline, in seconds from this call's start.
    stats["python_timeline"] = ([["opened", opened]] + [[n, opened + t] for n, t in marks] +
                                [["returned", time.perf_counter() - began]])
    return tensors, stats


def prepare(device: Union[str, int] = "cuda", path: Optional[PathLike] = None,
            **engine) -> "_ferry.LoadPreparation":
    """Starts readying, on a thread of its own, the process's first load onto `device` (pinned
    staging, reader threads, copy streams), so that a server that calls it while it builds its
    model loads its weights at the speed of a later load. `engine` takes the settings the load
    will use (threads, chunk_bytes, slots, staging_bytes, copy_streams, page_cache_pin). With the
    checkpoint's `path` and page_cache_pin, its files wholly in the page cache are registered for
    page-cache DMA meanwhile too. The load need not wait for it; `.wait()` returns what was made,
    or raises what failed."""
    checkpoint = open_checkpoint(path) if path is not None else None
    return _ferry.prepare_load(engine_device(normalize_device(device)), checkpoint, **engine)


def load_file(filename: PathLike, device: Union[str, int] = "cpu", *,
              backend: str = "mmap", process_group: Any = None,
              shard: Any = None) -> Dict[str, torch.Tensor]:
    """Like safetensors.torch.load_file; `filename` may also be a shard directory or an index.
    `backend` is accepted as safetensors accepts it ("mmap" or "pread"); ferry reads the same
    way for both (its engine, no mapping).

    With a torch.distributed `process_group` (every rank calls it, each with its own device), the
    group reads every byte once and shares it: each rank gets whole tensors (shard None), its
    tensor-parallel slices ("tensor_parallel": vLLM's sharding of Llama/Qwen/Mistral names), or
    the slices a dict or callable gives (name -> None, dim, or (dim, [length per rank]))."""
    check_backend(backend)
    if process_group is not None or shard is not None:
        from ._distributed import load_sharded
        if process_group is None and not torch.distributed.is_initialized():
            raise ValueError("shard needs a process group (torch.distributed is not initialized)")
        return load_sharded(filename, device, process_group, shard)
    return load_with_stats(filename, device)[0]


def slice_plan(path: PathLike, ranks: int, shard: Any = "tensor_parallel",
               names: Optional[Iterable[str]] = None):
    """Per rank: name -> (dim, begin, end, shape) of what load_file(..., shard=shard) gives it
    (dim -1: the whole tensor)."""
    from ._distributed import slice_plan as plan
    return plan(path, ranks, shard, names)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Like safetensors.torch.load: the tensors of a safetensors file held in `data`, on the cpu,
    each with writable storage of its own. (ferry's former path-taking load is load_with_stats.)"""
    if isinstance(data, (str, os.PathLike)):
        raise TypeError("load takes the bytes of a safetensors file (as safetensors' load does); "
                        "for a path use load_file, or load_with_stats for statistics too")
    data = bytes(data)
    _, _, _, tensors = _ferry.parse_header(data)
    out = {}
    for name, dtype, shape, offset, size in tensors:
        target = torch_dtype(dtype, name)
        storage = torch_shape(dtype, list(shape))
        if size == 0:
            out[name] = torch.empty(storage, dtype=target, device="cpu")
        else:
            raw = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=torch.uint8)
            out[name] = raw.view(target).reshape(storage)
    return out


def _covers_storage(t: torch.Tensor) -> bool:
    address, nbytes = _storage(t)
    return t.data_ptr() == address and t.numel() * t.element_size() == nbytes


def _aliases_to_drop(state: Dict[str, torch.Tensor], preferred: Iterable[str]) -> List[str]:
    """For each group of shared tensors, every name but the one kept (a name covering the whole
    storage, those in `preferred` first, then by name)."""
    preferred = set(preferred)
    dropped = []
    for group in _shared_groups(state):
        complete = sorted(n for n in group if _covers_storage(state[n]))
        if not complete:
            raise RuntimeError(f"Error while trying to find names to remove to load state dict, but "
                               f"found no suitable name to keep amongst: {group}. None is covering "
                               "the entire storage. Refusing to load the model.")
        keep = next((n for n in complete if n in preferred), complete[0])
        dropped += sorted(n for n in group if n != keep)
    return dropped


def load_model(model: torch.nn.Module, filename: PathLike, strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Tuple[Set[str], List[str]]:
    """Like safetensors.torch.load_model: loads `filename` into `model`, where tensors the model
    shares (tied weights) are stored once in the file. Returns (missing, unexpected); with strict,
    either raises RuntimeError as torch's load_state_dict does."""
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = _aliases_to_drop(model.state_dict(), state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for name in dropped:
        if name in missing:
            missing.remove(name)
        else:
            unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


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
        checkpoint = open_checkpoint(path)
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


def _alias_groups(tensors: Dict[str, torch.Tensor]) -> List[List[str]]:
    """Names of `tensors` grouped by the memory they fill: tied parameters (one tensor under
    several names) form one group, in the order first seen."""
    groups: Dict[tuple, List[str]] = {}
    for name, tensor in tensors.items():
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        key = ((str(data.device), data.data_ptr(), data.dtype, tuple(data.shape), data.stride())
               if data.numel() else ("empty", name))
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def load_into(target: Union[torch.nn.Module, Dict[str, torch.Tensor]], path: PathLike,
              strict: bool = True, process_group: Any = None, shard: Any = None,
              **engine) -> dict:
    """Fills existing parameters and buffers in place (no second allocation). `target` is a module
    (its state_dict) or a dict of tensors. Tensors that share memory under several names (tied
    weights) are filled once, from whichever of those names the checkpoint holds, and none of
    them is missing then. Each must match the checkpoint's dtype and shape and be contiguous.
    Returns statistics with 'missing' (target names the checkpoint lacks) and 'unexpected'
    (checkpoint names the target lacks), as load_state_dict reports them; with strict, either
    raises RuntimeError in load_state_dict's words.

    With `process_group` and `shard` (as load_file takes them), `target` holds this rank's
    slices: the group reads each byte once and every rank's slices are copied into place."""
    tensors = target.state_dict(keep_vars=True) if isinstance(target, torch.nn.Module) else target
    if process_group is not None or shard is not None:
        from ._distributed import load_into_sharded
        return load_into_sharded(tensors, path, process_group, shard, strict, **engine)
    checkpoint = open_checkpoint(path)
    table = tensor_table(checkpoint)
    missing: List[str] = []
    fills: List[str] = []  # one name per memory; further names of it in the file are not read
    for group in _alias_groups(tensors):
        present = [n for n in group if n in table]
        if present:
            fills.append(present[0])
        else:
            missing += group
    unexpected = [n for n in table if n not in tensors]
    if strict and (missing or unexpected):
        owner = target.__class__.__name__ if isinstance(target, torch.nn.Module) else "dict"
        error = f"Error(s) in loading state_dict for {owner}:"
        if missing:
            error += "\n\tMissing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". "
        if unexpected:
            error += "\n\tUnexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". "
        raise RuntimeError(f"{os.fspath(path)}: {error}")
    by_device: Dict[str, List[Tuple[str, int, int]]] = {}
    for name in fills:
        dtype, shape, nbytes = table[name]
        want = torch_dtype(dtype, name)
        tensor = tensors[name]
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
