"""ferry.safe_open: safetensors' lazy reader over ferry's TensorReader. On the host each
get_tensor is one positioned read straight into the tensor handed out, and get_slice reads only
the slice's bytes. To cuda:N a small read (a slice of at most SMALL_READ_BYTES, a tensor of at
most SMALL_TENSOR_BYTES in a file the page cache holds) is positioned reads into pinned host
memory in the calling thread, then one asynchronous copy on the current stream: a transfer-engine
job costs about half a millisecond of hand-offs between threads, such a read microseconds. For
get_tensor it is off by default (SMALL_TENSOR_BYTES = 0): there the engine's read-ahead already
hides that cost, and it measured faster.
Larger ones go through the transfer engine (parallel reads, staged copies), get_tensor with
read-ahead (_read_ahead.py); get_tensors runs the engine over the whole checkpoint."""
import math
import os
import threading
from typing import Any, Dict, List, Optional

from . import _ferry
from ._dtypes import (BITS, engine_device, normalize_device, numpy_from_bytes, numpy_view,
                      tensor_table, torch_dtype, torch_shape)
from ._ferry import SafetensorError
from ._read_ahead import ReadAhead
from ._slicing import (as_python_index, byte_ranges, leading_rows, parse_indexers, range_count,
                       torch_indexers)

_TORCH_NAMES = ("pt", "torch", "pytorch")
_NUMPY_NAMES = ("np", "numpy")
_OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle")
BACKENDS = ("mmap", "pread")


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


# Reads to a GPU up to these sizes skip the transfer engine (module attributes: the benchmark
# sets them to 0 to measure the engine alone). A slice is read synchronously either way, so the
# engine pays off once its parallel reads save more than its setup: a few MiB. A tensor taken
# by get_tensor competes with the read-ahead, which overlaps the engine's reads with the
# caller's work: on the H100, 1,000 tensors of 256 KiB to cuda:0 took 49.5 ms through the
# read-ahead and 108.8 ms as small reads (256 x 1 MiB: 27.2 against 68.4 ms), so get_tensor
# takes the engine unless a caller sets a size here (only page-cache files qualify then:
# O_DIRECT reads of a cold file want the engine's parallelism).
SMALL_READ_BYTES = 4 << 20
SMALL_TENSOR_BYTES = 0

# Strided slices are read range by range where the ranges are few and not tiny; otherwise the
# rows that cover the slice are read whole and indexed.
_MAX_RANGES = 1 << 16
_MIN_RANGE_BYTES = 512


class _Slice:
    """What get_slice returns: shape and dtype without reading; indexing reads only the bytes of
    the slice (a row block, or the rows' parts of a column block) and returns a tensor of its
    own."""

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
        bits = BITS[self._dtype]
        if self._framework == "pt" and self._backend == "mmap":
            index = index if isinstance(index, tuple) else (index,)
            if bits % 8:  # torch cannot index packed types by their logical shape
                return self._gather(*byte_ranges(parse_indexers(index, self._shape), self._shape, bits))
            indexers = torch_indexers(index, self._shape)
            if indexers is not None and self._few_ranges(indexers):
                return self._gather(*byte_ranges(indexers, self._shape, bits))
            return self._index(index)
        indexers = parse_indexers(index, self._shape)
        ranges, newshape = byte_ranges(indexers, self._shape, bits)
        if bits % 8 or self._few_ranges(indexers):
            return self._gather(ranges, newshape)
        return self._index(as_python_index(indexers, self._shape))

    def _few_ranges(self, indexers) -> bool:
        count = range_count(indexers, self._shape)
        return count == 1 or (count <= _MAX_RANGES and self._size // count >= _MIN_RANGE_BYTES)

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
        if self._framework == "pt" and self._device.startswith("cuda:"):
            raw = _to_gpu(self._reader, self._name, [(begin, begin + length)], length, self._device)
            whole = raw.view(torch_dtype(self._dtype, self._name))
            part = whole.reshape(torch_shape(self._dtype, shape))[relative]
        else:
            part = _read(self._reader, self._name, self._dtype, shape, begin, length,
                         self._framework)[relative]
        if self._framework == "np":
            small = part.nbytes < length or not part.flags.c_contiguous
            return part.copy() if small else part
        if part.numel() < (length // max(part.element_size(), 1)) or not part.is_contiguous():
            part = part.clone()
        return part if self._device == "cpu" else part.to(self._device)

    def _gather(self, ranges, newshape):
        """The byte ranges of the slice, read back to back: the slice itself."""
        length = sum(b - a for a, b in ranges)
        if length * 8 != math.prod(newshape) * BITS[self._dtype]:  # an empty slice
            ranges, length = [], 0
        if self._framework == "np":
            import numpy

            raw = numpy.empty(length, dtype=numpy.uint8)
            if length:
                self._reader.read_ranges(self._name, ranges, raw.ctypes.data)
            return numpy_from_bytes(raw, self._name, self._dtype, newshape)
        import torch

        on_gpu = self._device.startswith("cuda:")
        if on_gpu:
            raw = _to_gpu(self._reader, self._name, ranges, length, self._device)
        else:
            raw = torch.empty(length, dtype=torch.uint8)
            if length:
                self._reader.read_ranges(self._name, ranges, raw.data_ptr())
        out = raw.view(torch_dtype(self._dtype, self._name)).reshape(torch_shape(self._dtype, newshape))
        return out if on_gpu or self._device == "cpu" else out.to(self._device)


def _to_gpu(reader, name: str, ranges, length: int, device: str):
    """The (begin, end) byte ranges of tensor `name` (`length` bytes in all), packed into a new
    uint8 tensor on `device` (cuda:N): small reads through pinned memory in this thread, larger
    ones through the transfer engine."""
    if length <= SMALL_READ_BYTES:
        return small_read(reader, name, ranges, length, device)
    import torch

    raw = torch.empty(length, dtype=torch.uint8, device=device)
    _engine_read(reader, name, ranges, raw, device)
    return raw


def small_read(reader, name: str, ranges, length: int, device: str):
    """The ranges read into pinned host memory (torch's caching host allocator: it keeps a block
    from reuse until the copies that read it have run), then copied up asynchronously on the
    current stream, which orders the copy after work queued on memory the allocator recycles.
    On the host (the tests' stand-in) a plain read."""
    import torch

    on_gpu = device.startswith("cuda")
    host = torch.empty(length, dtype=torch.uint8, pin_memory=on_gpu)
    if length:
        reader.read_ranges(name, ranges, host.data_ptr())
    return host.to(device, non_blocking=True) if on_gpu else host


def _engine_read(reader, name: str, ranges, tensor, device: str) -> None:
    """The (begin, end) byte ranges of tensor `name`, packed into `tensor` (on a GPU) through the
    transfer engine, written after the work already queued on the current stream (the caching
    allocator may have handed back memory that work still reads)."""
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    reader.wait(reader.submit_ranges(name, ranges, tensor.data_ptr(), device, event.cuda_event))


def _read(reader, name: str, dtype: str, shape: List[int], begin: int, length: int, framework: str):
    """`length` bytes at `begin` of tensor `name` as a new host tensor (torch) or array (numpy)
    of `dtype` and `shape`: one positioned read into its memory."""
    if framework == "np":
        import numpy

        raw = numpy.empty(length, dtype=numpy.uint8)
        if length:
            reader.read(name, begin, length, raw.ctypes.data)
        return numpy_from_bytes(raw, name, dtype, shape)
    import torch

    raw = torch.empty(length, dtype=torch.uint8)
    if length:
        reader.read(name, begin, length, raw.data_ptr())
    return raw.view(torch_dtype(dtype, name)).reshape(torch_shape(dtype, shape))


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
        # Names in read order and sorted, made when first asked for (100,000 names cost some
        # milliseconds); each tensor's entry is asked for when used.
        self._in_file_order: Optional[List[str]] = None
        self._sorted: Optional[List[str]] = None
        self._reader = _ferry.TensorReader(checkpoint)
        self._ahead: Optional[ReadAhead] = None  # GPU reads, made at the first one
        self._ahead_lock = threading.Lock()
        self._open = True

    def _check_open(self) -> None:
        if not self._open:
            raise SafetensorError("File is closed")

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self._open = False
        if self._ahead is not None:
            self._ahead.close()
        self._reader = None
        self._ahead = None

    def stats(self) -> Dict[str, int]:
        """ferry's own: bytes_read (file bytes read through this handle and its slices so far,
        O_DIRECT alignment included), read_ahead_hits (GPU tensors handed out from the
        read-ahead) and read_ahead_wasted_bytes (read ahead and never asked for)."""
        self._check_open()
        ahead = self._ahead
        return {"bytes_read": self._reader.bytes_read,
                "read_ahead_hits": ahead.hits if ahead else 0,
                "read_ahead_wasted_bytes": ahead.wasted_bytes if ahead else 0}

    def keys(self) -> List[str]:
        self._check_open()
        if self._sorted is None:
            self._sorted = self._checkpoint.names(sorted=True)
        return list(self._sorted)

    def offset_keys(self) -> List[str]:
        self._check_open()
        return list(self._names())

    def _names(self) -> List[str]:
        if self._in_file_order is None:
            self._in_file_order = self._checkpoint.names()
        return self._in_file_order

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
        if self._device == "cpu" or self._framework == "np":
            return _read(self._reader, name, dtype, shape, 0, size, self._framework)
        if not self._device.startswith("cuda:"):  # another torch device: through host memory
            return _read(self._reader, name, dtype, shape, 0, size, "pt").to(self._device)
        raw = self._read_ahead().take(name, size)
        return raw.view(torch_dtype(dtype, name)).reshape(torch_shape(dtype, shape))

    def _read_ahead(self) -> ReadAhead:
        with self._ahead_lock:
            if self._ahead is None:
                reader = self._reader

                def small(name: str, size: int) -> bool:
                    return size <= SMALL_TENSOR_BYTES and reader.through_page_cache(name)

                self._ahead = ReadAhead(reader, self._names(), self._device,
                                        lambda name: self._checkpoint.tensor(name)[2], small,
                                        lambda name, size: small_read(reader, name, [(0, size)], size,
                                                                      self._device))
            return self._ahead

    def get_slice(self, name: str) -> _Slice:
        self._info(name)
        return _Slice(self, name)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in file order, through one engine load (one allocation on the device)."""
        self._check_open()
        table = tensor_table(self._checkpoint)
        if self._framework == "np":
            loaded = _ferry.load(self._checkpoint, engine_device(self._device))
            return {name: numpy_view(loaded, name, dtype, shape, size)
                    for name, (dtype, shape, size) in table.items()}
        from ._views import _load_tensors

        tensors = _load_tensors(self._checkpoint, engine_device(self._device))[0]
        if engine_device(self._device) != self._device:
            tensors = {name: t.to(self._device) for name, t in tensors.items()}
        return {name: tensors[name] for name in table}


class _safe_open_handle(safe_open):
    """safetensors._safe_open_handle(f, framework, device="cpu", *, backend="mmap"): safe_open
    on an open file object (it must have fileno() and name, as safetensors asks)."""

    def __init__(self, f, framework: str = "pt", device: Any = "cpu", *, backend: str = "mmap"):
        getattr(f, "fileno")
        super().__init__(f.name, framework, device, backend=backend)
