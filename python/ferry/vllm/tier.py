"""Secondary KV tier "ferry" for vLLM's TieringOffloadingSpec, over ferry.KVStore.

    "secondary_tiers": [{"type": "ferry", "root": "/nvme/kv", "capacity_bytes": 1000000000000}]

Each chunk of the CPU primary tier is one KVStore block (indexed by the XXH3-64 of vLLM's
OffloadKey bytes, the full key stored with the block and checked on every load: keys.py), moved
straight between the primary tier's shared memory and the store's slab files:
checksummed, published only after its data and the journal are on the device (fdatasync), so
blocks survive a restart or a crash of the server, and a new tier on the same root finds them. A
block that fails its checksum or cannot be read is a failed key of a partial JobResult (vLLM
recomputes it); its bytes in the primary tier are never handed out. Options: ferry.KVStore's
gpu_path, allow_compat, slab_count, checkpoint_every, page_cache_pin.
"""
import collections
import threading
from typing import Any, ClassVar, Dict, Iterable, List

import numpy as np
import torch

from ferry.kv import KVStore, kv_key

from . import _compat
from ._compat import LookupResult, SecondaryTierManager, job_result
from .keys import TRAILER, KeyTrailers
from .options import STORE_OPTIONS, capacity, check

# Store calls per direction at once; the jobs waiting behind them go as one call.
_CALLS = 2

try:
    from vllm.v1.kv_offload.base import Medium
except ImportError:  # pragma: no cover
    Medium = None


def namespace(spec, block_bytes: int, kind: str) -> Dict[str, Any]:
    """The KVStore namespace of a vLLM deployment: blocks of another model, dtype, block
    shape or parallel layout never meet."""
    config = spec.config
    layout = (f"{kind};bytes={block_bytes};key_trailer={TRAILER};"
              f"tokens_per_block={list(spec.tokens_per_block)};"
              f"blocks_per_chunk={spec.blocks_per_chunk};"
              f"layout={getattr(config, 'kv_cache_layout', None)};"
              f"tp={config.parallel.tp_size};pp={config.parallel.pp_size};"
              f"workers={config.parallel.world_size}")
    return {"model": config.model.name, "dtype": str(config.model.dtype), "block_layout": layout}


class FerryTierManager(SecondaryTierManager):
    """vLLM's SecondaryTierManager over one ferry.KVStore (a writer; one per root and model)."""

    medium: ClassVar = Medium.STORAGE if Medium is not None else None

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 root: str = None, capacity_bytes: Any = None, backpressure_detector=None,
                 locality: str = None, **options):
        _compat.tier_base_init(self, offloading_spec, primary_kv_view, tier_type,
                               backpressure_detector)
        what = f"secondary tier {tier_type!r}"
        if not root:
            raise ValueError(f"{what}: 'root' (the store's directory) is required")
        options = check(options, STORE_OPTIONS, what)
        self._block = int(primary_kv_view.strides[0])
        # The primary tier's chunks as one (num_chunks, chunk bytes) uint8 tensor (no copy).
        self._chunks = torch.from_numpy(np.asarray(primary_kv_view).view(np.uint8)
                                        .reshape(-1, self._block))
        self._store = KVStore(root, capacity_bytes=capacity(capacity_bytes, what),
                              block_bytes=self._block + TRAILER,
                              **namespace(offloading_spec, self._block, "vllm-tier"), **options)
        self._lock = threading.Condition()
        self._finished: collections.deque = collections.deque()
        self._in_flight = 0  # jobs submitted and not finished
        self._waiting = {True: collections.deque(), False: collections.deque()}  # by storing
        self._calls = {True: 0, False: 0}  # store calls running, by storing
        self._closed = False

    def on_new_request(self, req_context):
        return _compat.RequestOffloadingContext()

    def lookup(self, key, req_context) -> LookupResult:
        return LookupResult.HIT if self._store.contains([kv_key(key)])[0] else LookupResult.MISS

    def _blocks(self, job) -> List[torch.Tensor]:
        return [self._chunks[i] for i in _compat.job_chunk_ids(job)]

    def _result(self, job, ok: List[bool], storing: bool):
        keys = list(job.keys)
        if all(ok):
            return job_result(job.job_id, True, transfer_bytes=self._block * len(keys))
        if storing or not any(ok):
            return job_result(job.job_id, False)
        # a partial promotion: the keys that loaded are kept, the rest recomputed
        return job_result(job.job_id, False,
                          successful_keys=tuple(k for k, g in zip(keys, ok) if g),
                          transfer_bytes=self._block * sum(ok))

    def _submit(self, job, storing: bool) -> None:
        """Up to _CALLS store calls per direction run at once; jobs submitted meanwhile wait and
        go together as one call when one ends (a job's keys never twice in one call): a store
        call has a fixed cost (a batch's start and its slowest block), and vLLM submits a request's chunks
        as jobs of a few blocks each (32 jobs of 16 blocks, each its own call: loads at 1.28-1.38
        GB/s; merged: 1.48-1.62; docs/vllm.md)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the ferry tier was shut down")
            self._in_flight += 1
            self._waiting[storing].append(job)
            calls = self._take_calls(storing)
        for jobs in calls:
            self._start(jobs, storing)

    def _take_calls(self, storing: bool) -> List[list]:
        """Under the lock: the waiting jobs of one direction cut into the calls that may start."""
        calls = []
        waiting = self._waiting[storing]
        while waiting and self._calls[storing] < _CALLS:
            jobs, seen = [], set()
            while waiting and not seen.intersection(waiting[0].keys):
                seen.update(waiting[0].keys)
                jobs.append(waiting.popleft())
            self._calls[storing] += 1
            calls.append(jobs)
        return calls

    def _start(self, jobs: list, storing: bool) -> None:
        """One store call for `jobs` (from a submit, or from the callback of a call that ended:
        whatever fails here becomes the jobs' failed results, never an exception)."""
        keys = [k for job in jobs for k in job.keys]
        good = ("ok", "already_present") if storing else ("ok",)
        try:
            trailers = KeyTrailers(keys, "cpu", storing)
            chunks = [c for job in jobs for c in self._blocks(job)]
            blocks = [[chunk, trailers.piece(i)] for i, chunk in enumerate(chunks)]

            def done(results) -> None:
                ok = [r.status in good for r in results]
                if not storing:  # another key's block under the same 64-bit hash: a failed key
                    for i in trailers.mismatched([i for i, g in enumerate(ok) if g]):
                        ok[i] = False
                        _compat.logger.warning("ferry tier: the block stored under key %s's hash "
                                               "belongs to another key", bytes(keys[i]).hex())
                self._finish(jobs, ok, storing)

            if storing:
                self._store.put_async([kv_key(k) for k in keys], blocks, callback=done)
            else:
                self._store.get_async([kv_key(k) for k in keys], blocks, callback=done)
        except Exception:  # vLLM's manager takes failures as results, never as exceptions
            _compat.logger.exception("ferry tier: jobs %s could not start",
                                     [job.job_id for job in jobs])
            self._finish(jobs, [False] * len(keys), storing)

    def _finish(self, jobs: list, ok: List[bool], storing: bool) -> None:
        results, at = [], 0
        for job in jobs:
            n = len(job.keys)
            results.append(self._result(job, ok[at:at + n], storing))
            at += n
        with self._lock:
            self._finished.extend(results)
            self._in_flight -= len(jobs)
            self._calls[storing] -= 1
            calls = self._take_calls(storing)
            self._lock.notify_all()
        for next_jobs in calls:
            self._start(next_jobs, storing)

    def submit_store(self, job_metadata) -> None:
        self._submit(job_metadata, storing=True)

    def submit_load(self, job_metadata) -> None:
        self._submit(job_metadata, storing=False)

    def get_finished_jobs(self) -> Iterable:
        with self._lock:
            out = list(self._finished)
            self._finished.clear()
        return out

    def has_pending_work(self) -> bool:
        with self._lock:
            return self._in_flight > 0

    def drain_jobs(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._in_flight == 0)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.drain_jobs()
        self._store.close()

    def stats(self) -> dict:
        return self._store.stats()
