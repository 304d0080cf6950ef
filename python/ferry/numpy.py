"""ferry for numpy: safetensors.numpy's loading API (load_file, load), host memory, no torch
needed. Arrays are writable. BF16, F8 and F4 come as ml_dtypes' numpy dtypes where that package
is installed (F4 unpacked, one value per byte)."""
import os
from typing import Dict, Union

import numpy

from . import _ferry
from ._dtypes import numpy_dtype, numpy_from_bytes, numpy_view, tensor_table
from ._ferry import SafetensorError
from ._open import check_backend, open_checkpoint
from ._save import numpy_save as save, numpy_save_file as save_file, numpy_write_file as write_file  # noqa: F401

__all__ = ["SafetensorError", "load", "load_file", "save", "save_file"]


def load_file(filename: Union[str, "os.PathLike[str]"], *, backend: str = "mmap") -> Dict[str, numpy.ndarray]:
    """Like safetensors.numpy.load_file; `filename` may also be a shard directory or an index.
    The arrays view ferry's host memory, which lives as long as any of them. `backend` is
    accepted as safetensors accepts it ("mmap" or "pread"); ferry reads the same way for both."""
    check_backend(backend)
    checkpoint = open_checkpoint(filename)
    table = tensor_table(checkpoint)
    for name, (dtype, _, _) in table.items():
        numpy_dtype(dtype, name)  # refuse before loading, not halfway
    loaded = _ferry.load(checkpoint, "cpu")
    return {name: numpy_view(loaded, name, dtype, shape, size)
            for name, (dtype, shape, size) in table.items()}


def load(data: bytes) -> Dict[str, numpy.ndarray]:
    """Like safetensors.numpy.load: the arrays of a safetensors file held in `data`, each a
    writable array of its own."""
    if isinstance(data, (str, os.PathLike)):
        raise TypeError("load takes the bytes of a safetensors file; for a path use load_file")
    data = bytes(data)
    _, _, _, tensors = _ferry.parse_header(data)
    for name, dtype, _, _, _ in tensors:
        numpy_dtype(dtype, name)
    return {name: numpy_from_bytes(numpy.frombuffer(bytearray(data[offset:offset + size]), numpy.uint8),
                                   name, dtype, list(shape))
            for name, dtype, shape, offset, size in tensors}
