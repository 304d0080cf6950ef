"""ferry.safe_open: safetensors' lazy reader. Each get_tensor / get_slice is one positioned read
of the bytes asked for (ferry's TensorReader), straight into the tensor handed out; get_tensors
runs ferry's engine over the whole checkpoint."""
import os
import threading
from typing import Any, Dict, List, Optional

from . import _ferry
from ._dtypes import (BITS, engine_device, normalize_device, numpy_from_bytes, numpy_view,
                      tensor_table, torch_dtype, torch_shape)
from ._ferry import SafetensorError
from ._slicing import as_python_index, byte_ranges, leading_rows, parse_indexers

_TORCH_NAMES = ("pt", "torch", "pytorch")
_NUMPY_NAMES = ("np", "numpy")
_OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle")
BACKENDS = ("mmap", "pread")

# A GPU read goes through one pinned host buffer per handle, at most this large.
_PINNED_BYTES = 64 << 20


class _MissingTensor(SafetensorError, KeyError):
    """A name the file does not hold: safetensors raises SafetensorError, dict-like code catches
    KeyError; this is both."""

    __str__ = BaseException.__str__


def parse_framework(framework: Any) -> str:
    """'pt' or 'np' for every name safetensors accepts for torch and numpy."""
    name = str(framework)
    if name in _TORCH_NAMES:
        return "pt"
    if name in _NUMPY_NAMES:
        return "np"
    if name in _OTHER_FRAMEWORKS:
        raise SafetensorError(f"framework {name} is not supported by ferry: it hands out torch "
                              "tensors ('pt') and numpy arrays ('np')")
    raise SafetensorError(f"framework {name} is invalid")


def check_backend(backend: Any) -> str:
    """safetensors' storage backends. ferry never maps files: both read the same bytes through
    positioned reads; the backend only picks get_slice's index rules, as in safetensors ('mmap'
    with 'pt': torch's; otherwise safetensors' own)."""
    if backend not in BACKENDS:
        raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
    return backend


def open_checkpoint(filename: Any) -> "_ferry.Checkpoint":
    """Opens a file, directory or index; a missing path raises safetensors' FileNotFoundError."""
    path = os.fspath(filename)
    try:
        return _ferry.Checkpoint.open(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise
        raise FileNotFoundError(f"No such file or directory: {path}") from None


class _Slice:
    """What get_slice returns: shape and dtype without reading; indexing reads only the rows of
    the first dimension that the index touches and returns a tensor of its own."""

    def __init__(self, handle: "safe_open", name: str):
        # The reader, not the handle, is kept: as in safetensors, a slice outlives `with`.
        self._reader, self._name = handle._reader, name
        self._dtype, self._shape, self._size = handle._info(name)
        self._framework, self._device, self._backend = handle._framework, handle._device, handle._backend

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, index):
        if self._framework == "pt" and self._backend == "mmap":
            return self._torch_rules(index if isinstance(index, tuple) else (index,))
        indexers = parse_indexers(index, self._shape)
        ranges, newshape = byte_ranges(indexers, self._shape, BITS[self._dtype])
        if BITS[self._dtype] % 8:
            return self._gather(ranges, newshape)
        return self._index(as_python_index(indexers, self._shape))

    def _torch_rules(self, index: tuple):
        if BITS[self._dtype] % 8:  # torch cannot index packed types by their logical shape
            indexers = parse_indexers(index, self._shape)
            return self._gather(*byte_ranges(indexers, self._shape, BITS[self._dtype]))
        return self._index(index)

    def _index(self, index: tuple):
        """Reads the rows `index` needs and applies `index` to them."""
        rows = self._shape[0] if self._shape else 0
        plan = leading_rows(index, rows) if self._shape else None
        row_bytes = self._size // rows if rows else 0
        if plan is None:
            first, end, relative = 0, rows, index
            begin, length, shape = 0, self._size, self._shape
        else:
            first, end, relative = plan
            begin, length = first * row_bytes, (end - first) * row_bytes
            shape = [end - first] + list(self._shape[1:])
        part = _read(self._reader, self._name, self._dtype, shape, begin, length, self._framework,
                     "cpu", None)[relative]
        if self._framework == "np":
            small = part.nbytes < length or not part.flags.c_contiguous
            return part.copy() if small else part
        if part.numel() < (length // max(part.element_size(), 1)) or not part.is_contiguous():
            part = part.clone()
        return part if self._device == "cpu" else part.to(self._device)

    def _gather(self, ranges, newshape):
        """Sub-byte dtypes: the byte ranges of the slice, joined."""
        import numpy

        whole = numpy.empty(self._size, dtype=numpy.uint8)
        if self._size:
            self._reader.read(self._name, 0, self._size, whole.ctypes.data)
        joined = numpy.concatenate([whole[a:b] for a, b in ranges]) if ranges else whole[:0]
        if self._framework == "np":
            return numpy_from_bytes(joined, self._name, self._dtype, newshape)
        import torch

        raw = torch.from_numpy(joined)
        out = raw.view(torch_dtype(self._dtype, self._name)).reshape(torch_shape(self._dtype, newshape))
        return out if self._device == "cpu" else out.to(self._device)


def _read(reader, name: str, dtype: str, shape: List[int], begin: int, length: int,
          framework: str, device: str, pinned: Optional["_PinnedBuffer"]):
    """`length` bytes at `begin` of tensor `name` as a new tensor (torch) or array (numpy) of
    `dtype` and `shape` on `device`."""
    if framework == "np":
        import numpy

        raw = numpy.empty(length, dtype=numpy.uint8)
        if length:
            reader.read(name, begin, length, raw.ctypes.data)
        return numpy_from_bytes(raw, name, dtype, shape)
    import torch

    target = torch_dtype(dtype, name)
    on_gpu = device.startswith("cuda:")
    raw = torch.empty(length, dtype=torch.uint8, device=device if on_gpu else "cpu")
    if length and not on_gpu:
        reader.read(name, begin, length, raw.data_ptr())
    elif length:
        with pinned.lock:  # one buffer per handle: threads sharing the handle take turns
            buffer = pinned.at_least(min(length, _PINNED_BYTES))
            for at in range(0, length, buffer.numel()):
                n = min(buffer.numel(), length - at)
                reader.read(name, begin + at, n, buffer.data_ptr())
                raw[at:at + n].copy_(buffer[:n])  # synchronous: the buffer is reused next
    out = raw.view(target).reshape(torch_shape(dtype, shape))
    return out if on_gpu or device == "cpu" else out.to(device)


class _PinnedBuffer:
    """A handle's pinned host buffer for reads to a GPU, made on first use; hold `lock` while
    using it."""

    def __init__(self):
        self.lock = threading.Lock()
        self._buffer = None

    def at_least(self, size: int):
        import torch

        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = torch.empty(size, dtype=torch.uint8, device="cpu", pin_memory=True)
        return self._buffer


class safe_open:
    """safetensors.safe_open(filename, framework, device="cpu", *, backend="mmap"): keys(),
    offset_keys(), metadata(), get_tensor(), get_slice(), get_tensors(); SafetensorError after
    the handle is closed. `filename` may also be a shard directory or an index; its files are
    held open from here to close, so a path replaced meanwhile does not change what is read."""

    def __init__(self, filename, framework: str = "pt", device: Any = "cpu", *, backend: str = "mmap"):
        self._framework = parse_framework(framework)
        self._device = normalize_device(device)
        self._backend = check_backend(backend)
        checkpoint = open_checkpoint(filename)
        if self._framework == "np" and self._device != "cpu":
            raise SafetensorError(f"Device {self._device} is not supported for framework numpy")
        self._checkpoint = checkpoint
        self._names = checkpoint.names()  # read order; each tensor's entry is asked for when used
        self._reader = _ferry.TensorReader(checkpoint)
        self._pinned = _PinnedBuffer()
        self._open = True

    def _check_open(self) -> None:
        if not self._open:
            raise SafetensorError("File is closed")

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self._open = False
        self._reader = None
        self._pinned = None

    def keys(self) -> List[str]:
        self._check_open()
        return sorted(self._names)

    def offset_keys(self) -> List[str]:
        self._check_open()
        return list(self._names)

    def metadata(self) -> Optional[Dict[str, str]]:
        self._check_open()
        return self._checkpoint.metadata(0) if self._checkpoint.has_metadata(0) else None

    def _info(self, name: str):
        """(dtype, shape, bytes) of `name`."""
        self._check_open()
        info = self._checkpoint.tensor(name)
        if info is None:
            raise _MissingTensor(f"File does not contain tensor {name}")
        dtype, shape, size = info
        return dtype, list(shape), size

    def get_tensor(self, name: str):
        dtype, shape, size = self._info(name)
        return _read(self._reader, name, dtype, shape, 0, size, self._framework, self._device,
                     self._pinned)

    def get_slice(self, name: str) -> _Slice:
        self._info(name)
        return _Slice(self, name)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in file order, through one engine load (one allocation on the device)."""
        self._check_open()
        table = tensor_table(self._checkpoint)
        loaded = _ferry.load(self._checkpoint, engine_device(self._device))
        if self._framework == "np":
            return {name: numpy_view(loaded, name, dtype, shape, size)
                    for name, (dtype, shape, size) in table.items()}
        from .torch import _tensors

        tensors = _tensors(loaded, table)
        if engine_device(self._device) != self._device:
            tensors = {name: t.to(self._device) for name, t in tensors.items()}
        return {name: tensors[name] for name in table}


class _safe_open_handle(safe_open):
    """safetensors._safe_open_handle(f, framework, device="cpu", *, backend="mmap"): safe_open
    on an open file object (it must have fileno() and name, as safetensors asks)."""

    def __init__(self, f, framework: str = "pt", device: Any = "cpu", *, backend: str = "mmap"):
        getattr(f, "fileno")
        super().__init__(f.name, framework, device, backend=backend)
