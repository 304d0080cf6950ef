"""ferry.KVStore: attention KV blocks kept on local storage, crash-safe (prefix caching).

    store = ferry.KVStore(root, model="llama-3-8b", dtype="bf16", block_layout="...",
                          capacity_bytes=64 << 30, block_bytes=2 << 20)
    store.put(keys, blocks)            # device -> storage; per-key KVResult
    store.get(keys, blocks)            # storage -> device, into the tensors given
    store.lookup(keys)                 # how many leading keys are stored (the prefix hit)
    t = store.put_async(keys, blocks, callback=fn); t.wait(); t.results()

A key is an int (vLLM's block hashes; taken modulo 2**64) or bytes (hashed with XXH3-64). A block
is one contiguous tensor or a list of them (vLLM's per-layer K and V pages), gathered into one
write and scattered from one read, on the CPU or any GPU. A paged KV cache is given whole
instead: `store.get(keys, KVPages(layers, block_ids))` moves row block_ids[i] of every layer
tensor as the block of keys[i] (one entry per layer crosses into C++, not one per piece). A put
of GPU tensors is ordered after `after_event` (a torch.cuda.Event), by default an event recorded
on the current stream of the tensors' device: KV still being computed is never stored. Each
result names the path its block took ("host", "staged", "cufile-gds", "cufile-compat",
"page-cache-dma") and, with page-cache DMA on (page_cache_pin=), why.
"""
import operator
from collections import namedtuple
from typing import Any, Callable, List, Optional, Sequence, Union

from . import _ferry

Key = Union[int, bytes]

KVResult = namedtuple("KVResult", ["status", "route", "message", "route_reason"],
                      defaults=[""])
KVResult.ok = property(lambda r: r.status == "ok")
KVResult.__doc__ = ("status: ok, already_present, missing, bad_size, no_space, io_error, "
                    "unsupported or read_only; route: the path the bytes took; message: why; "
                    "route_reason: why that path (page-cache DMA on)")


def _key(key: Key) -> int:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return _ferry.kv_key(bytes(key))
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"a KV key is an int or bytes, not {type(key).__name__}")
    return key % (1 << 64)  # Python's hash() values may be negative


def _pieces(block) -> list:
    tensors = list(block) if isinstance(block, (list, tuple)) else [block]
    pieces = []
    for t in tensors:
        if not hasattr(t, "data_ptr"):
            raise TypeError(f"a KV block piece is a torch.Tensor, not {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"a KV block piece must be contiguous (shape {tuple(t.shape)}, "
                             f"strides {t.stride()})")
        pieces.append((t.data_ptr(), t.numel() * t.element_size(), str(t.device)))
    return pieces


class KVPages:
    """The blocks of a paged KV cache: block i of a batch is row rows[i] (dimension 0) of every
    tensor in `layers`, in that order (vLLM's per-layer (num_blocks, page_bytes) pages, or K and
    V buffers of shape (num_blocks, ...)). Each row must be contiguous; layers may live on
    different devices and have different row sizes. KVPages.joined([...]) makes one batch of
    several (a hybrid model's KV groups, each with layers of its own), in order."""

    def __init__(self, layers: Sequence[Any], rows: Sequence[int]):
        self.layers = list(layers)
        rows = [int(r) for r in rows]
        if any(r < 0 for r in rows):
            raise ValueError(f"KVPages rows are block indices, not {min(rows)}")
        spec = [self._layer(i, t) for i, t in enumerate(self.layers)]
        if not spec:
            raise ValueError("KVPages needs at least one layer tensor")
        self._segments = [(spec, rows)]

    @classmethod
    def joined(cls, parts: Sequence["KVPages"]) -> "KVPages":
        if not parts:
            raise ValueError("KVPages.joined needs at least one KVPages")
        out = cls.__new__(cls)
        out.layers = [t for p in parts for t in p.layers]
        out._segments = [segment for p in parts for segment in p._segments]
        return out

    @property
    def rows(self) -> List[int]:
        return [r for _, rows in self._segments for r in rows]

    @staticmethod
    def _layer(index: int, t) -> tuple:
        if not hasattr(t, "data_ptr"):
            raise TypeError(f"KVPages layer {index} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() < 1 or t.shape[0] == 0:
            raise ValueError(f"KVPages layer {index} has no rows (shape {tuple(t.shape)})")
        if not t[0].is_contiguous():
            raise ValueError(f"KVPages layer {index}: a row is not contiguous (shape "
                             f"{tuple(t.shape)}, strides {t.stride()})")
        size = t.element_size()
        return (t.data_ptr(), t[0].numel() * size, t.stride(0) * size, t.shape[0], str(t.device))

    def __len__(self) -> int:
        return sum(len(rows) for _, rows in self._segments)


def _batch(keys: Sequence[Key], blocks: Union[Sequence[Any], KVPages]):
    keys = [_key(k) for k in keys]
    if len(keys) != len(blocks):
        raise ValueError(f"{len(keys)} keys but {len(blocks)} blocks")
    if isinstance(blocks, KVPages):
        return keys, blocks._segments
    return keys, [_pieces(b) for b in blocks]


def _gpu_devices(pieces) -> List[str]:
    if pieces and isinstance(pieces[0], tuple):  # a KVPages batch: [(layers, rows), ...]
        return sorted({layer[4] for spec, _ in pieces for layer in spec
                       if layer[4].startswith("cuda")})
    return sorted({d for block in pieces for (_, _, d) in block if d.startswith("cuda")})


def _producer_event(pieces, after_event):
    """The CUevent a put waits for (as an int), and the object that keeps it alive."""
    if after_event is not None:
        return int(getattr(after_event, "cuda_event", after_event)), after_event
    devices = _gpu_devices(pieces)
    if not devices:
        return 0, None
    import torch
    if len(devices) > 1:
        raise ValueError(f"a put of tensors on {devices} needs after_event: ferry orders it "
                         f"after one event")
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(torch.device(devices[0])))
    return int(event.cuda_event), event


class KVTicket:
    """An asynchronous put or get: wait(), ready(), results() (one KVResult per key)."""

    def __init__(self, core, keepalive):
        self._core = core
        self._keepalive = keepalive  # the tensors and event, until the batch is done

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._core.wait(timeout)

    def ready(self) -> bool:
        return self._core.ready()

    def results(self) -> List[KVResult]:
        out = [KVResult(*r) for r in self._core.results()]
        self._keepalive = None
        return out


class KVStore:
    """One namespace (model, dtype, block layout, tensor-parallel rank and world size) of a KV
    block store under `root`; see the module's documentation. gpu_path: "auto" (cuFile only where
    it does true GPUDirect Storage), "staged" or "direct" (cuFile; allow_compat lets it run in
    compatibility mode). read_only: a reader sharing the namespace with one writer process.
    page_cache_pin: bytes (int, or a size such as "4GiB") of slab windows kept registered for
    page-cache DMA: gets into GPU memory whose 64 MiB window is wholly in the page cache copy
    straight from it, each block checked by the GPU that received it (0: off). fleet_writers:
    a fleet of up to this many writer processes on the namespace (fixed when the namespace is
    made; 0: one writer): each writer opened takes a free share of the slots (its own journal;
    it evicts only its own blocks) and every call first folds in the others' commits, so
    engines on one machine or on several (a shared file system) share one prefix cache;
    docs/kv_fleet.md. Readers leave it 0."""

    def __init__(self, root, *, model: str, dtype: str, capacity_bytes: int, block_bytes: int,
                 block_layout: str = "", tp_rank: int = 0, world_size: int = 1,
                 gpu_path: str = "auto", allow_compat: bool = False, read_only: bool = False,
                 slab_count: int = 4, checkpoint_every: int = 65536,
                 page_cache_pin: Union[int, str] = 0, fleet_writers: int = 0):
        import os
        where = os.fsencode(root)  # str, bytes or os.PathLike; names need not be UTF-8
        if b"\0" in where:
            raise ValueError(f"KV store root {os.fsdecode(where)!r}: a path cannot hold a NUL "
                             f"byte")
        counts = {"capacity_bytes": (capacity_bytes, 64), "block_bytes": (block_bytes, 64),
                  "slab_count": (slab_count, 32), "checkpoint_every": (checkpoint_every, 64),
                  "fleet_writers": (fleet_writers, 32)}
        for name, (value, bits) in counts.items():  # the C++ side takes unsigned integers
            try:
                number = None if isinstance(value, bool) else operator.index(value)
            except TypeError:
                number = None
            if number is None or not 0 <= number < 2 ** bits:
                raise ValueError(f"KV store at {os.fsdecode(where)}: {name} must be a whole "
                                 f"number from 0 to 2^{bits} - 1, not {value!r}")
        self._core = _ferry.KVStoreCore(where, model, dtype, block_layout, tp_rank,
                                        world_size, capacity_bytes, block_bytes, gpu_path,
                                        allow_compat, read_only, slab_count, checkpoint_every,
                                        str(page_cache_pin), fleet_writers)
        self.block_bytes = block_bytes

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Waits for the calls and batches in flight (their callbacks included), checkpoints (a
        writer) and closes; later calls raise ValueError. From a completion callback it cannot
        wait for its own batch: new calls are refused at once, the files are released when the
        last batch ends. Dropping the last reference in a callback is fine, too."""
        self._core.close()

    def put(self, keys: Sequence[Key], blocks: Sequence[Any], *,
            after_event=None) -> List[KVResult]:
        keys, pieces = _batch(keys, blocks)
        event, _held = _producer_event(pieces, after_event)
        return [KVResult(*r) for r in self._core.put(keys, pieces, event)]

    def get(self, keys: Sequence[Key], blocks: Sequence[Any]) -> List[KVResult]:
        keys, pieces = _batch(keys, blocks)
        return [KVResult(*r) for r in self._core.get(keys, pieces)]

    def put_async(self, keys: Sequence[Key], blocks: Sequence[Any], *, after_event=None,
                  callback: Optional[Callable[[List[KVResult]], None]] = None) -> KVTicket:
        keys, pieces = _batch(keys, blocks)
        event, held = _producer_event(pieces, after_event)
        keepalive = (blocks, held)
        return KVTicket(self._core.put_async(keys, pieces, event, _done(callback, keepalive)),
                        keepalive)

    def get_async(self, keys: Sequence[Key], blocks: Sequence[Any], *,
                  callback: Optional[Callable[[List[KVResult]], None]] = None) -> KVTicket:
        keys, pieces = _batch(keys, blocks)
        return KVTicket(self._core.get_async(keys, pieces, _done(callback, blocks)), blocks)

    def lookup(self, keys: Sequence[Key]) -> int:
        return self._core.lookup([_key(k) for k in keys])

    def contains(self, keys: Sequence[Key]) -> List[bool]:
        return self._core.contains([_key(k) for k in keys])

    def remove(self, keys: Sequence[Key]) -> List[KVResult]:
        return [KVResult(*r) for r in self._core.remove([_key(k) for k in keys])]

    def stored_length(self, key: Key) -> int:
        return self._core.stored_length(_key(key))

    def checkpoint(self) -> None:
        self._core.checkpoint()

    def keys(self) -> List[int]:
        return self._core.keys()

    def stats(self) -> dict:
        return self._core.stats()


def _done(callback, keepalive):
    """The completion callback handed to C++: it holds `keepalive` (the batch's tensors) until
    the batch is done, whether or not the caller keeps the ticket."""
    def done(results):
        _ = keepalive
        if callback is not None:
            callback([KVResult(*r) for r in results])
    return done


def kv_key(data: bytes) -> int:
    """The key of a byte-string block hash (XXH3-64)."""
    return _ferry.kv_key(bytes(data))
