"""ferry for GGUF files (llama.cpp, Ollama): the same loaders as ferry.torch and ferry.numpy.

Plain tensors (F32, F16, BF16, F64, I8..I64) keep their dtype with shape = GGUF's dims reversed
(row-major). Quantized tensors are their raw bytes: uint8 of shape [rows..., bytes per row];
`tensor_types` says which ggml type each is.
"""
import json
import os
from typing import Any, Dict, List, Tuple, Union

from . import _ferry

PathLike = Union[str, "os.PathLike[str]"]


def _open(path: PathLike):
    checkpoint = _ferry.Checkpoint.open(os.fspath(path))
    if checkpoint.format != "gguf":
        raise ValueError(f"{os.fspath(path)}: not a GGUF file ({checkpoint.format})")
    return checkpoint


def load_file(path: PathLike, device: Any = "cpu") -> Dict[str, Any]:
    """Every tensor as a torch.Tensor on `device` (zero-copy views of ferry's memory)."""
    _open(path)
    from .torch import load_file as torch_load_file

    return torch_load_file(path, device)


def load_numpy(path: PathLike) -> Dict[str, Any]:
    """Every tensor as a numpy array in host memory, without torch."""
    _open(path)
    from .numpy import load_file as numpy_load_file

    return numpy_load_file(path)


def metadata(path: PathLike) -> Dict[str, Any]:
    """Key -> value for the first file, with GGUF's types kept: {"type": "UINT32", "value": 64}."""
    return json.loads(_open(path).metadata_json(0) or "{}")


def tensor_types(path: PathLike) -> Dict[str, Tuple[str, List[int]]]:
    """Name -> (ggml type name, dims with ne[0] first), as llama.cpp reports them."""
    return {name: (kind, list(dims)) for name, kind, dims in _open(path).ggml_tensors()}
