"""How ferry's dtype names (the safetensors spellings) map to torch and numpy dtypes, and how
devices and host memory are named."""
from typing import Any, Dict, List, Optional, Tuple

from ._ferry import SafetensorError

# safetensors name -> torch attribute name (missing in older torch builds: resolved lazily)
_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}

_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
    "F32": "float32", "F64": "float64", "C64": "complex64",
}

# The dtypes numpy itself lacks, by their ml_dtypes names (the numpy dtypes JAX uses). F4 is
# handed out unpacked, one float4_e2m1fn per byte, as ml_dtypes stores it.
_ML_DTYPES = {
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn",
}

# Bits per element, for slicing sub-byte types.
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64,
        "I64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64, "F8_E4M3": 8,
        "F8_E4M3FNUZ": 8, "F8_E5M2": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8, "F6_E2M3": 6,
        "F6_E3M2": 6, "F4": 4}


def torch_dtype(name: str, tensor: str) -> Any:
    """The torch dtype for `name`; TypeError where this torch build has none."""
    import torch

    attr = _TORCH.get(name)
    dtype = getattr(torch, attr, None) if attr else None
    if dtype is None:
        raise TypeError(f'tensor "{tensor}": dtype {name} has no torch dtype in torch {torch.__version__}')
    return dtype


def torch_shape(name: str, shape: List[int]) -> List[int]:
    """F4 packs two values per byte: its torch storage shape halves the last dimension, as
    safetensors does."""
    if name == "F4" and shape:
        return shape[:-1] + [shape[-1] // 2]
    return list(shape)


def numpy_dtype(name: str, tensor: str) -> Any:
    """The numpy dtype for `name`: numpy's own, else ml_dtypes' where it is installed; TypeError
    naming the package where it is needed and missing."""
    import numpy

    attr = _NUMPY.get(name)
    if attr is not None:
        return numpy.dtype(attr)
    extension = _ML_DTYPES.get(name)
    if extension is None:
        raise TypeError(f'tensor "{tensor}": dtype {name} has no numpy dtype; use ferry.torch')
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f'tensor "{tensor}": dtype {name} needs the ml_dtypes package for numpy '
                        "(pip install ml_dtypes), or use ferry.torch") from None
    return numpy.dtype(getattr(ml_dtypes, extension))


def numpy_from_bytes(raw, name: str, dtype: str, shape: List[int]):
    """A numpy array of `dtype` and `shape` over the 1-D uint8 array `raw` (no copy, except F4,
    whose packed nibbles become one float4_e2m1fn each, the first value in the low nibble)."""
    import numpy

    target = numpy_dtype(dtype, name)
    if dtype == "F4":
        unpacked = numpy.empty(raw.size * 2, dtype=numpy.uint8)
        unpacked[0::2] = raw & 0x0F
        unpacked[1::2] = raw >> 4
        return unpacked.view(target).reshape(shape)
    return raw.view(target).reshape(shape)


def tensor_table(checkpoint) -> Dict[str, Tuple[str, List[int], int]]:
    """name -> (dtype, shape, bytes) for every tensor of a _ferry.Checkpoint, in read order."""
    return {name: (dtype, list(shape), size) for name, dtype, shape, size, _, _ in checkpoint.tensors()}


# Device types that torch knows and ferry's engine does not: tensors are read into host memory
# and moved there with torch's .to(), as safetensors does.
_OTHER_ACCELERATORS = ("mps", "npu", "xpu", "xla", "mlu", "musa", "hpu")


def normalize_device(device: Optional[Any]) -> str:
    """'cpu', 'cuda', 'cuda:N', an int N (= cuda:N) or a torch.device -> ferry's spelling ('cpu',
    'cuda:N'), or another torch device ('mps', 'xpu:1', ...) as text. SafetensorError (a
    ValueError) names a device that is neither."""
    if device is None:
        return "cpu"
    if isinstance(device, bool) or (isinstance(device, int) and device < 0):
        raise SafetensorError(f"device {device!r} is invalid")
    if isinstance(device, int):
        return f"cuda:{device}"
    text = str(device)
    if text == "cuda":
        try:
            import torch

            return f"cuda:{torch.cuda.current_device()}"
        except Exception:
            return "cuda:0"
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu"
    if kind in ("cuda",) + _OTHER_ACCELERATORS and (not index or index.isdigit()):
        return text
    raise SafetensorError(f"device {text} is invalid")


def engine_device(device: str) -> str:
    """Where ferry's engine puts the bytes for `device`: itself for cpu and cuda:N, else host
    memory (moved on by torch)."""
    return device if device == "cpu" or device.startswith("cuda:") else "cpu"


class HostArray:
    """Exposes `size` bytes of host memory at `address` to numpy, writable, while `owner` (what
    keeps that memory alive) lives: numpy.asarray(HostArray(...)) keeps this object as its base."""

    def __init__(self, address: int, size: int, owner: Any):
        self._owner = owner
        self.__array_interface__ = {
            "data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3,
        }


def numpy_view(loaded, name: str, dtype: str, shape: List[int], size: int):
    """A writable numpy view of a loaded host tensor's `size` bytes: no copy, and it keeps the
    memory alive."""
    import numpy

    raw = (numpy.asarray(HostArray(loaded.address(name), size, loaded)) if size
           else numpy.empty(0, numpy.uint8))
    return numpy_from_bytes(raw, name, dtype, shape)
