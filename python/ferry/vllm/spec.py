"""FerryOffloadingSpec: vLLM's KV offloading straight between the GPU's KV pages and a
ferry.KVStore (no CPU tier in between).

    "kv_connector": "FerryOffloadingConnector", "kv_load_failure_policy": "recompute",
    "kv_connector_extra_config": {"spec_name": "FerryOffloadingSpec", "root": "/nvme/kv",
                                  "capacity_bytes": 1000000000000}

The worker (one per GPU, a KVStore writer of its rank's namespace) stores a block as the pages of
every layer of one GPU block (one piece per KV tensor, gathered into one write) and loads it back
the same way (staged, cuFile or page-cache DMA, as the store picks), with the full offload key
in a trailer checked on every load (keys.py: the store indexes blocks by a 64-bit hash). The
manager (scheduler) answers lookups from read-only views of every rank's store. vLLM's OffloadingConnector asserts
that no transfer fails; FerryOffloadingConnector reports the GPU blocks of a failed load through
get_block_ids_with_load_errors, so vLLM recomputes them (kv_load_failure_policy "recompute").
Under the plain OffloadingConnector a failed load fails its job (vLLM stops), never wrong bytes.
Offloaded blocks must be GPU blocks (block_size unset or equal to the GPU's).
"""
import collections
import threading
import time
from typing import Dict, List, Set

import torch

from ferry.kv import KVPages, KVStore, kv_key

from . import _compat
from ._compat import (GPULoadStoreSpec, LoadStoreSpec, LookupResult, OffloadingManager,
                      OffloadingSpec, PrepareStoreOutput, TransferResult)
from .keys import TRAILER, record
from .options import STORE_OPTIONS, capacity, check
from .tier import namespace

_SPEC_KEYS = {"root", "capacity_bytes"} | set(STORE_OPTIONS)

# A job in flight: its ticket, GPU block ids, offload keys, direction and start.
_Job = collections.namedtuple("_Job", ["ticket", "ids", "keys", "storing", "started"])


def _records(keys) -> torch.Tensor:
    """The keys' trailers (keys.py), one row each."""
    data = bytearray(b"".join(record(k) for k in keys))
    return torch.frombuffer(data, dtype=torch.uint8).view(len(keys), TRAILER)


class FerryLoadStoreSpec(LoadStoreSpec):
    """The offload keys of a job, in the order of the GPU blocks they pair with."""

    def __init__(self, keys):
        self.keys = list(keys)

    def __repr__(self) -> str:
        return f"FerryLoadStoreSpec({len(self.keys)} keys)"


class FerryOffloadingSpec(OffloadingSpec):
    def __init__(self, config):
        super().__init__(config)
        extra = dict(self.extra_config)
        what = "kv_connector_extra_config of FerryOffloadingSpec"
        if not extra.get("root"):
            raise ValueError(f"{what}: 'root' (the store's directory) is required")
        self.root = extra["root"]
        self.capacity_bytes = capacity(extra.get("capacity_bytes"), what)
        self.store_options = check({k: v for k, v in extra.items() if k in STORE_OPTIONS},
                                   STORE_OPTIONS, what)
        if self.blocks_per_chunk != 1:
            raise ValueError(f"{what}: ferry offloads GPU blocks as they are (block_size "
                             f"unset or the GPU's); this config groups {self.blocks_per_chunk}")
        self.block_bytes = config.worker_kv_bytes_per_block  # data; the store's adds TRAILER
        self.reports_load_errors = False  # FerryOffloadingConnector turns it on
        self._manager = None
        self._worker = None

    def open_store(self, rank: int, read_only: bool) -> KVStore:
        parallel = self.config.parallel
        return KVStore(self.root, capacity_bytes=self.capacity_bytes,
                       block_bytes=self.block_bytes + TRAILER, tp_rank=rank,
                       world_size=parallel.world_size, read_only=read_only,
                       **namespace(self, self.block_bytes, "vllm-spec"), **self.store_options)

    def get_manager(self):
        if self._manager is None:
            self._manager = FerryOffloadingManager(self)
        return self._manager

    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = FerryOffloadingWorker(self, kv_caches)
        return self._worker


class FerryOffloadingManager(OffloadingManager):
    """Scheduler side: lookups in read-only views of every rank's store; keys being stored are
    HIT_PENDING until their store completes."""

    def __init__(self, spec: FerryOffloadingSpec):
        self._spec = spec
        self._readers: List[KVStore] = []
        self._pending: Dict[bytes, int] = {}

    def _stores(self) -> List[KVStore]:
        if not self._readers:
            try:
                self._readers = [self._spec.open_store(r, True)
                                 for r in range(self._spec.config.parallel.world_size)]
            except (OSError, RuntimeError, ValueError):
                for store in self._readers:
                    store.close()
                self._readers = []  # no worker has created its namespace yet
        return self._readers

    def lookup(self, key, req_context) -> LookupResult:
        if key in self._pending:
            return LookupResult.HIT_PENDING
        stores = self._stores()
        if stores and all(s.contains([kv_key(key)])[0] for s in stores):
            return LookupResult.HIT
        return LookupResult.MISS

    def prepare_load(self, keys, req_context) -> FerryLoadStoreSpec:
        return FerryLoadStoreSpec(keys)

    def prepare_store(self, keys, req_context):
        todo = [k for k in keys if self.lookup(k, req_context) is LookupResult.MISS]
        for k in todo:
            self._pending[k] = self._pending.get(k, 0) + 1
        return PrepareStoreOutput(keys_to_store=todo, store_spec=FerryLoadStoreSpec(todo),
                                  evicted_keys=[])

    def complete_store(self, keys, req_context, success: bool = True):
        for k in keys:
            left = self._pending.get(k, 0) - 1
            if left > 0:
                self._pending[k] = left
            else:
                self._pending.pop(k, None)

    def on_new_request(self, req_context):
        return _compat.RequestOffloadingContext()

    def shutdown(self) -> None:
        for store in self._readers:
            store.close()
        self._readers = []


class FerryOffloadingWorker(_compat.OffloadingWorker or object):
    """Worker side: one KVStore writer for this rank; a block = one piece per KV tensor of its
    group (a (num_blocks, page_bytes) row of CanonicalKVCaches)."""

    def __init__(self, spec: FerryOffloadingSpec, kv_caches):
        self._spec = spec
        self._tensors = [t.tensor for t in kv_caches.tensors]
        self._groups = []  # per KV group: the indices of its tensors, each once, in order
        for refs in kv_caches.group_data_refs:
            seen = []
            for ref in refs:
                if ref.tensor_idx not in seen:
                    seen.append(ref.tensor_idx)
            self._groups.append(seen)
        for g, idx in enumerate(self._groups):
            size = sum(self._tensors[i].shape[1] * self._tensors[i].element_size() for i in idx)
            if size > spec.block_bytes:
                raise ValueError(f"KV group {g}: a block is {size} bytes, more than the "
                                 f"{spec.block_bytes} vLLM reported per worker block")
        # Per GPU block, the key trailer its store writes or its load reads (one row each, so a
        # block's trailer lives as long as the block and never shares memory with another's).
        blocks = max(t.shape[0] for t in self._tensors)
        self._trailers = torch.zeros((blocks, TRAILER), dtype=torch.uint8,
                                     device=self._tensors[0].device)
        # Per KV group, the tensors whose rows make up one of its blocks (the trailer last).
        self._group_layers = [[self._tensors[i] for i in idx] + [self._trailers]
                              for idx in self._groups]
        self._store = spec.open_store(spec.config.parallel.rank, False)
        self._lock = threading.RLock()
        self._jobs: Dict[int, _Job] = {}  # submitted, not yet settled
        self._finished: List[TransferResult] = []
        self._load_errors: Set[int] = set()
        # Blocks stored and loaded, loads failed, the routes blocks took and the seconds the
        # jobs ran (for benchmarks and logs: vLLM's own stats count tokens, not ferry's paths).
        self.counters = {"stored_blocks": 0, "loaded_blocks": 0, "failed_loads": 0,
                         "routes": collections.Counter(), "store_seconds": 0.0,
                         "load_seconds": 0.0}

    def _blocks(self, spec: GPULoadStoreSpec):
        """The job's GPU block ids and its blocks: per KV group, its blocks as rows of the
        group's layers and the trailers (one entry per layer crosses into ferry, not one per
        piece), the groups' blocks in the job's order."""
        ids = [int(b) for b in spec.block_ids]
        groups = list(spec.group_sizes) if spec.group_sizes is not None else [len(ids)]
        parts, at = [], 0
        for g, count in enumerate(groups):
            parts.append(KVPages(self._group_layers[g], ids[at:at + count]))
            at += count
        pages = parts[0] if len(parts) == 1 else KVPages.joined(parts)
        return pages.rows, pages  # fewer rows than ids where the group sizes fall short

    def _submit(self, job_id: int, gpu: GPULoadStoreSpec, keys, storing: bool) -> bool:
        ids, blocks = self._blocks(gpu)
        if len(ids) != len(keys):
            _compat.logger.error("ferry KV job %d: %d GPU blocks for %d keys", job_id,
                                 len(ids), len(keys))
            return False
        started = time.monotonic()
        if storing and keys:  # the keys' trailers, ordered before the put by its event
            self._trailers[ids] = _records(keys).to(self._trailers.device)
        ferry_keys = [kv_key(k) for k in keys]
        try:
            move = self._store.put_async if storing else self._store.get_async
            ticket = move(ferry_keys, blocks)
        except Exception:
            _compat.logger.exception("ferry KV job %d could not start", job_id)
            return False
        with self._lock:
            self._jobs[job_id] = _Job(ticket, ids, list(keys), storing, started)
        return True

    def _collect(self, wait_for=()) -> None:
        """Settles the jobs whose batches are done, and first waits for those in `wait_for`, on
        vLLM's thread: the store's threads only mark a batch done (a completion callback there
        would take the GIL from vLLM's busy loop several times per job)."""
        with self._lock:
            for job_id in wait_for:
                if job_id in self._jobs:
                    self._jobs[job_id].ticket.wait()
            done = [(j, job) for j, job in self._jobs.items() if job.ticket.ready()]
            for job_id, job in done:
                del self._jobs[job_id]
                self._settle(job_id, job)

    def _settle(self, job_id: int, job: "_Job") -> None:
        results = job.ticket.results()
        if not job.storing:  # a block of another key under the same 64-bit hash: failed
            self._check_keys(job.ids, job.keys, results)
        good = ("ok", "already_present") if job.storing else ("ok",)
        failed = [(b, k, r) for b, k, r in zip(job.ids, job.keys, results)
                  if r.status not in good]
        success = not failed
        if failed and not job.storing:
            # Unreadable blocks go (a later lookup misses); another key's block stays.
            self._store.remove([kv_key(k) for _, k, r in failed if r.status != "key_mismatch"])
            _compat.logger.warning("ferry KV load %d: %d of %d blocks failed (%s: %s)", job_id,
                                   len(failed), len(job.keys), failed[0][2].status,
                                   failed[0][2].message)
            self._load_errors.update(b for b, _, _ in failed)
            if self._spec.reports_load_errors:
                success = True  # the blocks are reported as load errors instead
            else:
                _compat.logger.error("ferry KV load %d failed; use FerryOffloadingConnector "
                                     "to have vLLM recompute such blocks", job_id)
        moved = len(job.keys) - len(failed)
        self.counters["stored_blocks" if job.storing else "loaded_blocks"] += moved
        self.counters["failed_loads"] += 0 if job.storing else len(failed)
        self.counters["routes"].update(r.route for r in results if r.route)
        # From submission to vLLM's learning of it: ferry's share of a job, beside vLLM's.
        seconds = time.monotonic() - job.started
        self.counters["store_seconds" if job.storing else "load_seconds"] += seconds
        size = self._spec.block_bytes * moved
        self._finished.append(TransferResult(job_id, success, size, seconds))

    def _check_keys(self, ids, keys, results) -> None:
        loaded = [i for i, r in enumerate(results) if r.status == "ok"]
        if not loaded:
            return
        got = self._trailers[[ids[i] for i in loaded]].cpu()
        wrong = (got != _records([keys[i] for i in loaded])).any(dim=1)
        for row in wrong.nonzero().flatten().tolist():
            i = loaded[row]
            results[i] = results[i]._replace(
                status="key_mismatch", message="the block stored under this key's 64-bit "
                "hash belongs to another key")

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, src_spec, dst_spec.keys, storing=True)

    def submit_load(self, job_id: int, src_spec, dst_spec, expedited: bool = False) -> bool:
        # The store serves batches in order; an expedited load is not held behind others.
        return self._submit(job_id, dst_spec, src_spec.keys, storing=False)

    def get_finished(self) -> List[TransferResult]:
        self._collect()
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def wait(self, job_ids) -> None:
        self._collect(wait_for=list(job_ids))

    def take_load_errors(self) -> Set[int]:
        """GPU block ids whose load failed since the last call (vLLM recomputes them)."""
        self._collect()
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        with self._lock:
            pending = list(self._jobs)
        self._collect(wait_for=pending)
        self._store.close()
