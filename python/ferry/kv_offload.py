"""A KV offloading handler with the shape of vLLM's (vllm/v1/kv_offload/worker/worker.py), over
ferry.KVStore, without needing vLLM.

vLLM keeps one paged KV tensor per attention layer. With FlashAttention's layout a layer's tensor
is (2, num_blocks, block_size, num_kv_heads, head_size): K pages in [0], V pages in [1]; other
backends put the block first, (num_blocks, 2, block_size, ...). A stored block is every layer's K
and V page of one GPU block id, gathered into ONE write (2 x layers pieces), under the block's hash.

    handler = FerryOffloadingHandler(store, kv_caches)           # kv_caches: list or dict by layer
    handler.transfer_async(job_id, (GPUBlocks(ids), StoredBlocks(hashes)))   # save (offload)
    handler.transfer_async(job_id, (StoredBlocks(hashes), GPUBlocks(ids)))   # load (onload)
    handler.get_finished()  -> [TransferResult(job_id, success, ...)]
    handler.wait({job_id}); handler.get_block_ids_with_load_errors()
    handler.lookup(hashes)  -> how many leading blocks are stored (the prefix to load)

A save of a block already stored succeeds (a block hash names its content). A load whose block
is missing or fails its checksum fails that job, and its GPU block ids are reported by
get_block_ids_with_load_errors(), as vLLM's KV connectors report them (vLLM recomputes those).
"""
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from .kv import KVResult, KVStore, Key


@dataclass
class GPUBlocks:
    """Block ids in the GPU's paged KV cache (vLLM's GPULoadStoreSpec)."""
    block_ids: Sequence[int]

    @staticmethod
    def medium() -> str:
        return "GPU"


@dataclass
class StoredBlocks:
    """The stored blocks' keys: vLLM's block hashes (int or bytes)."""
    keys: Sequence[Key]

    @staticmethod
    def medium() -> str:
        return "FERRY"


@dataclass
class TransferResult:
    """As vLLM's TransferResult, plus the GPU block ids that failed (loads) and why."""
    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None
    transfer_type: Optional[Tuple[str, str]] = None
    failed_block_ids: List[int] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)


def block_pieces(kv_caches, block_id: int, block_dim: int) -> list:
    """Every layer's K and V page of GPU block `block_id`, in layer order."""
    pieces = []
    for layer in kv_caches:
        if block_dim == 1:  # (2, num_blocks, ...): K and V pages apart
            pieces += [layer[0, block_id], layer[1, block_id]]
        else:  # (num_blocks, 2, ...): the block's K and V pages together
            pieces.append(layer[block_id])
    return pieces


class FerryOffloadingHandler:
    """vLLM's OffloadingHandler primitives (transfer_async, get_finished, wait, shutdown) moving
    paged KV blocks between GPU memory and a ferry.KVStore."""

    def __init__(self, store: KVStore, kv_caches: Union[Sequence, Dict[str, object]],
                 block_dim: int = 1):
        if block_dim not in (0, 1):
            raise ValueError("block_dim is 1 for (2, num_blocks, ...) layers, 0 for "
                             "(num_blocks, 2, ...)")
        self.store = store
        caches = kv_caches.values() if isinstance(kv_caches, dict) else kv_caches
        self.kv_caches = list(caches)
        if not self.kv_caches:
            raise ValueError("no KV cache tensors")
        self.block_dim = block_dim
        self.num_blocks = self.kv_caches[0].shape[block_dim]
        pieces = block_pieces(self.kv_caches, 0, block_dim)
        self.block_bytes = sum(p.numel() * p.element_size() for p in pieces)
        if self.block_bytes > store.block_bytes:
            raise ValueError(f"a block of these KV caches is {self.block_bytes} bytes; the store's "
                             f"blocks are {store.block_bytes}")
        self._lock = threading.Lock()
        self._pending: Dict[int, object] = {}  # job id -> KVTicket
        self._finished: List[TransferResult] = []
        self._done = threading.Condition(self._lock)
        self._load_errors: Set[int] = set()

    def transfer_async(self, job_id: int, spec) -> bool:
        """Starts job `job_id`: spec = (GPUBlocks, StoredBlocks) saves, (StoredBlocks, GPUBlocks)
        loads. Returns False for a spec it cannot run (logged in the result's errors)."""
        src, dst = spec
        if isinstance(src, GPUBlocks) and isinstance(dst, StoredBlocks):
            ids, keys, saving = list(src.block_ids), list(dst.keys), True
        elif isinstance(src, StoredBlocks) and isinstance(dst, GPUBlocks):
            ids, keys, saving = list(dst.block_ids), list(src.keys), False
        else:
            return False
        if len(ids) != len(keys) or any(not 0 <= b < self.num_blocks for b in ids):
            return False
        blocks = [block_pieces(self.kv_caches, b, self.block_dim) for b in ids]
        started = time.monotonic()
        kind = ("GPU", "FERRY") if saving else ("FERRY", "GPU")

        def finished(results: List[KVResult]) -> None:
            good = {"ok", "already_present"} if saving else {"ok"}
            failed = [b for b, r in zip(ids, results) if r.status not in good]
            result = TransferResult(
                job_id, not failed, self.block_bytes * (len(ids) - len(failed)),
                time.monotonic() - started, kind, failed,
                [f"block {b}: {r.status}: {r.message}" for b, r in zip(ids, results)
                 if r.status not in good])
            with self._done:
                self._pending.pop(job_id, None)
                self._finished.append(result)
                if not saving:
                    self._load_errors.update(failed)
                self._done.notify_all()

        with self._lock:
            self._pending[job_id] = None
        try:
            if saving:
                ticket = self.store.put_async(keys, blocks, callback=finished)
            else:
                ticket = self.store.get_async(keys, blocks, callback=finished)
        except Exception:
            with self._lock:
                self._pending.pop(job_id, None)
            return False
        with self._lock:
            if job_id in self._pending:
                self._pending[job_id] = ticket
        return True

    def get_finished(self) -> List[TransferResult]:
        """The jobs finished since the last call."""
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: Set[int]) -> None:
        with self._done:
            self._done.wait_for(lambda: not (set(job_ids) & self._pending.keys()))

    def get_block_ids_with_load_errors(self) -> Set[int]:
        """GPU block ids whose load failed since the last call (vLLM recomputes them)."""
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    def lookup(self, keys: Sequence[Key]) -> int:
        """How many leading blocks of a request are stored: the prefix worth loading."""
        return self.store.lookup(keys)

    def shutdown(self) -> None:
        with self._lock:
            pending = set(self._pending)
        self.wait(pending)
