"""How ferry's dtype names (the safetensors spellings) map to torch and numpy dtypes."""
from typing import Any, Dict, List, Optional, Tuple

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
    import numpy

    attr = _NUMPY.get(name)
    if attr is None:
        raise TypeError(f'tensor "{tensor}": dtype {name} has no numpy dtype; use ferry.torch')
    return numpy.dtype(attr)


def tensor_table(checkpoint) -> Dict[str, Tuple[str, List[int], int]]:
    """name -> (dtype, shape, bytes) for every tensor of a _ferry.Checkpoint."""
    return {name: (dtype, list(shape), size) for name, dtype, shape, size, _, _ in checkpoint.tensors()}


def normalize_device(device: Optional[Any]) -> str:
    """'cpu', 'cuda', 'cuda:N', an int N (= cuda:N) or a torch.device -> ferry's spelling."""
    if device is None:
        return "cpu"
    if isinstance(device, int):
        return f"cuda:{device}"
    text = str(device)
    if text == "cuda":
        try:
            import torch

            return f"cuda:{torch.cuda.current_device()}"
        except Exception:
            return "cuda:0"
    return text


class HostBytes:
    """Hands a host DLPack capsule to numpy.from_dlpack, which asks for the protocol methods."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def numpy_view(loaded, name: str, dtype: str, shape: List[int]):
    """A numpy view of a loaded host tensor: no copy, and it keeps the memory alive."""
    import numpy

    raw = numpy.from_dlpack(HostBytes(loaded.bytes(name)))
    return raw.view(numpy_dtype(dtype, name)).reshape(shape)
