"""ferry.safe_open: safetensors' lazy reader, backed by ferry's engine."""
import os
from typing import Any, Dict, List, Optional

from . import _ferry
from ._dtypes import normalize_device, numpy_view, tensor_table


class _Slice:
    """get_slice(name): shape and dtype without loading; indexing loads the tensor once and
    returns a contiguous copy of the slice (the full tensor is released with this object)."""

    def __init__(self, handle: "safe_open", name: str):
        self._handle, self._name = handle, name
        self._full = None

    def get_shape(self) -> List[int]:
        return list(self._handle._table[self._name][1])

    def get_dtype(self) -> str:
        return self._handle._table[self._name][0]

    def __getitem__(self, index):
        if self._full is None:
            self._full = self._handle.get_tensor(self._name)
        part = self._full[index]
        return part.clone() if hasattr(part, "clone") else part.copy()


class safe_open:
    """Like safetensors.safe_open(path, framework, device): keys(), metadata(), get_tensor(),
    get_slice(). `path` may also be a shard directory or an index."""

    def __init__(self, filename, framework: str = "pt", device: Any = "cpu"):
        if framework not in ("pt", "torch", "np", "numpy"):
            raise ValueError(f"framework {framework!r} is not supported: use 'pt' or 'np'")
        self._torch = framework in ("pt", "torch")
        self._device = normalize_device(device)
        if not self._torch and self._device != "cpu":
            raise ValueError("framework 'np' loads into host memory only (device='cpu')")
        self._checkpoint = _ferry.Checkpoint.open(os.fspath(filename))
        self._table = tensor_table(self._checkpoint)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def keys(self) -> List[str]:
        return sorted(self._table)

    def metadata(self) -> Optional[Dict[str, str]]:
        return self._checkpoint.metadata(0) or None

    def get_tensor(self, name: str):
        if name not in self._table:
            raise KeyError(f"{self._checkpoint.path}: no tensor named {name!r}")
        loaded = _ferry.load(self._checkpoint, self._device, [name])
        dtype, shape, _ = self._table[name]
        if self._torch:
            from .torch import _as_tensor

            return _as_tensor(loaded, name, dtype, shape)
        return numpy_view(loaded, name, dtype, shape)

    def get_slice(self, name: str) -> _Slice:
        if name not in self._table:
            raise KeyError(f"{self._checkpoint.path}: no tensor named {name!r}")
        return _Slice(self, name)
