"""The saver behind ferry.torch.save_file/save and ferry.numpy.save_file/save.

Tensors are checked the way safetensors checks them (same exception types and messages), then
their memory is handed to ferry's writer as addresses: no copy into a file image in RAM. The
file is identical to safetensors' for the same tensors and metadata (header, order, padding);
the one thing safetensors leaves to chance, the order of two or more metadata keys (a Rust hash
map), ferry writes in the dict's order. CUDA tensors stream device -> pinned staging -> file.
"""
import os
import sys
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple, Union

from . import _ferry

try:
    from ._ferry import SafetensorError
except ImportError:  # an extension built before the drop-in loading API
    SafetensorError = ValueError  # type: ignore[misc,assignment]

if TYPE_CHECKING:  # annotations only: ferry.numpy saves without torch
    import torch

PathLike = Union[str, "os.PathLike[str]"]

# safetensors' spelling of the dtype names it accepts (its TensorSpec), -> the header's name
_DTYPE_NAMES = {
    "bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "float32": "F32",
    "float64": "F64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4", "complex64": "C64",
}

_SHARED_HELP = "https://huggingface.co/docs/safetensors/torch_shared_tensors"


def _header_dtype(name: str) -> str:
    dtype = _DTYPE_NAMES.get(name)
    if dtype is None:
        raise SafetensorError(f'Unknown dtype "{name}". Supported dtypes: {", ".join(_DTYPE_NAMES)}')
    return dtype


def _check_names_and_metadata(names, metadata) -> Optional[List[Tuple[str, str]]]:
    """safetensors' argument checks (pyo3's TypeErrors), names first, then metadata."""
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"argument 'tensor_dict': '{type(name).__name__}' object is not an instance of 'str'")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"argument 'metadata': '{type(metadata).__name__}' object is not an instance of 'dict'")
    for key, value in metadata.items():
        for item in (key, value):
            if not isinstance(item, str):
                raise TypeError(f"argument 'metadata': '{type(item).__name__}' object is not an instance of 'str'")
    return list(metadata.items())


# ---- torch -----------------------------------------------------------------------------------

def _storage(tensor) -> Tuple[int, int]:
    """(address, bytes) of the storage under `tensor`; (0, 0) where it has none (meta)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except AttributeError:  # torch < 2.0
        try:
            storage = tensor.storage()
            return storage.data_ptr(), storage.size() * storage.element_size()
        except NotImplementedError:
            return 0, 0
    except NotImplementedError:
        return 0, 0


def _end(tensor) -> int:
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + tensor.element_size()
    return tensor.data_ptr()


def shared_tensor_groups(tensors: Dict[str, Any]) -> List[Set[str]]:
    """Names whose tensors overlap in memory, grouped as safetensors groups them: by storage,
    then by overlapping byte ranges within a storage."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = defaultdict(set)
    for name, tensor in tensors.items():
        if tensor.device.type == "meta":
            continue
        address, size = _storage(tensor)
        if address != 0 and size != 0:
            by_storage[(tensor.device, address, size)].add(name)
    groups: List[Set[str]] = []
    for names in sorted(by_storage.values(), key=sorted):
        if len(names) < 2:
            groups.append(names)
            continue
        areas = sorted((tensors[n].data_ptr(), _end(tensors[n]), n) for n in names)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _check_torch(tensors) -> None:
    import torch

    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(tensor)}")
        if tensor.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed.")
    failing = [names for names in shared_tensor_groups(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences"
            f" when loading them again: {failing}.\nA potential way to correctly save your model is to use"
            f" `save_model`.\nMore information at {_SHARED_HELP}")
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means"
                " you are trying to save tensors which are reference of each other in which case it's recommended"
                " to save only the full tensors, and reslice at load time, or simply call `.contiguous()` on"
                " your tensor to pack it before saving.")


def _torch_entries(tensors) -> Tuple[list, list]:
    """(entries for _ferry, objects to keep alive until the write returns)."""
    import torch

    entries, keep = [], []
    synced = set()
    for name, tensor in tensors.items():
        dtype = _header_dtype(str(tensor.dtype).split(".")[-1])
        shape = list(tensor.shape)
        if dtype == "F4" and shape:
            shape[-1] *= 2  # torch's storage shape holds two values per element
        if tensor.device.type == "meta":
            raise ValueError(f"Key `{name}` is on the meta device: it has no data to save")
        if tensor.device.type == "cuda":
            device = f"cuda:{tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()}"
            if device not in synced:  # kernels still writing the tensors finish first
                torch.cuda.synchronize(device)
                synced.add(device)
        elif tensor.device.type == "cpu":
            device = "cpu"
        else:
            tensor = tensor.to("cpu")  # other accelerators: through host memory, as safetensors
            device = "cpu"
        if sys.byteorder == "big":
            raise SafetensorError("ferry writes little-endian tensors on little-endian machines only")
        nbytes = tensor.nelement() * tensor.element_size()
        keep.append(tensor)
        entries.append((name, dtype, shape, tensor.data_ptr() if nbytes else 0, nbytes, device))
    return entries, keep


def torch_write_file(tensors: "Dict[str, torch.Tensor]", filename: PathLike,
                     metadata: Optional[Dict[str, str]] = None, **engine) -> dict:
    """save_file, returning the write's statistics (io_path and why, staging, copy/wait/write
    seconds). `engine`: direct (O_DIRECT where allowed, default True), staging_bytes (128 MiB),
    piece_bytes (16 MiB per write), writer_threads (4)."""
    _check_torch(tensors)
    pairs = _check_names_and_metadata(tensors.keys(), metadata)
    entries, keep = _torch_entries(tensors)
    stats = _ferry.save_file(os.fspath(filename), entries, pairs, **engine)
    del keep
    return stats


def torch_save(tensors: "Dict[str, torch.Tensor]", metadata: Optional[Dict[str, str]] = None) -> bytes:
    _check_torch(tensors)
    pairs = _check_names_and_metadata(tensors.keys(), metadata)
    entries, keep = _torch_entries(tensors)
    data = _ferry.save_bytes(entries, pairs)
    del keep
    return data


def torch_save_file(tensors: "Dict[str, torch.Tensor]", filename: PathLike,
                    metadata: Optional[Dict[str, str]] = None) -> None:
    """Like safetensors.torch.save_file: `tensors` into `filename`, byte for byte as safetensors
    writes it; CUDA tensors stream to the file through bounded pinned staging."""
    torch_write_file(tensors, filename, metadata)


# ---- numpy -----------------------------------------------------------------------------------

def _numpy_entries(tensors) -> Tuple[list, list]:
    import numpy

    entries, keep = [], []
    for name, array in tensors.items():
        if not isinstance(array, numpy.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected numpy.ndarray but received {type(array)}")
        if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
            array = array.byteswap().view(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:
            # safetensors writes such an array's raw memory, which is not its values.
            raise ValueError(
                f"You are trying to save a non contiguous array: `{name}` which is not allowed:"
                " call numpy.ascontiguousarray on it before saving.")
        dtype = _header_dtype(array.dtype.name)
        keep.append(array)
        entries.append((name, dtype, list(array.shape), array.ctypes.data if array.nbytes else 0,
                        array.nbytes, "cpu"))
    return entries, keep


def numpy_write_file(tensor_dict, filename: PathLike, metadata: Optional[Dict[str, str]] = None, **engine) -> dict:
    """numpy's save_file with statistics; `engine` as for torch_write_file."""
    pairs = _check_names_and_metadata(tensor_dict.keys(), metadata)
    entries, keep = _numpy_entries(tensor_dict)
    stats = _ferry.save_file(os.fspath(filename), entries, pairs, **engine)
    del keep
    return stats


def numpy_save_file(tensor_dict, filename: PathLike, metadata: Optional[Dict[str, str]] = None) -> None:
    """Like safetensors.numpy.save_file, byte for byte."""
    numpy_write_file(tensor_dict, filename, metadata)


def numpy_save(tensor_dict, metadata: Optional[Dict[str, str]] = None) -> bytes:
    pairs = _check_names_and_metadata(tensor_dict.keys(), metadata)
    entries, keep = _numpy_entries(tensor_dict)
    data = _ferry.save_bytes(entries, pairs)
    del keep
    return data
