"""The secondary KV tier "ferry" inside vLLM's TieringOffloadingManager (real vllm; skipped
without it): stored blocks cascade to ferry, leave the CPU tier, are found again (HIT_PENDING,
then HIT) with their bytes, survive a restart, and a corrupted one is a failed key."""
import glob
import os
import time

import numpy as np
import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
pytest.importorskip("vllm")

from vllm_helpers import chunk_rows, offload_key, offloading_config  # noqa: E402

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

PAGE = 64 * 1024  # per layer; 2 layers: 128 KiB chunks
CHUNK = 2 * PAGE


def make_manager(root, engine_id, cpu_chunks=4, **tier_options):
    import ferry.vllm
    ferry.vllm.register()
    extra = {"cpu_bytes_to_use": cpu_chunks * CHUNK,
             "secondary_tiers": [{"type": "ferry", "root": str(root),
                                  "capacity_bytes": 64 * CHUNK, **tier_options}]}
    spec = TieringOffloadingSpec(offloading_config(extra, PAGE, engine_id=engine_id))
    return spec.get_manager()


def step(manager):
    with manager.lock:
        manager.on_schedule_end(ScheduleEndContext((), ()))


def settle(manager, timeout=30.0):
    deadline = time.monotonic() + timeout
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "tier jobs did not finish"
        step(manager)
        time.sleep(0.01)


def store(manager, ctx, keys, payload):
    rows = chunk_rows(manager.primary_tier.get_kv_memoryview())
    with manager.lock:
        out = manager.prepare_store(keys, ctx)
    for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
        rows[int(chunk)] = payload[key]  # what the GPU -> CPU worker would copy
    with manager.lock:
        manager.complete_store(out.keys_to_store, ctx)
    settle(manager)


def load(manager, ctx, key, timeout=30.0):
    """lookup until HIT (via HIT_PENDING when it comes from ferry), then the chunk's bytes."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        with manager.lock:
            result = manager.lookup(key, ctx)
        seen.append(result)
        if result is LookupResult.HIT:
            break
        assert result in (LookupResult.HIT_PENDING, LookupResult.RETRY), seen
        assert time.monotonic() < deadline, seen
        step(manager)
        time.sleep(0.01)
    with manager.lock:
        spec = manager.prepare_load([key], ctx)
    data = chunk_rows(manager.primary_tier.get_kv_memoryview())[int(spec.chunk_ids[0])].copy()
    with manager.lock:
        manager.complete_load([key], ctx)
    return seen, data


def payloads(keys, seed):
    rng = np.random.default_rng(seed)
    return {k: rng.integers(0, 256, CHUNK, dtype=np.uint8) for k in keys}


def test_tier_store_evict_promote_restart(tmp_path):
    keys = [offload_key(i) for i in range(8)]
    data = payloads(keys, 1)
    manager = make_manager(tmp_path, "ferry-tier-a")
    ctx = ReqContext("r1")
    with manager.lock:
        manager.on_new_request(ctx)
    store(manager, ctx, keys[:4], data)
    store(manager, ctx, keys[4:], data)  # the CPU tier holds 4 chunks: keys[:4] leave it
    tier = manager.secondary_tiers[0]
    assert type(tier).__name__ == "FerryTierManager"
    assert all(tier.lookup(k, ctx) is LookupResult.HIT for k in keys)
    seen, got = load(manager, ctx, keys[1])
    assert seen[0] is LookupResult.HIT_PENDING and seen[-1] is LookupResult.HIT
    assert np.array_equal(got, data[keys[1]])
    assert tier.lookup(offload_key(99), ctx) is LookupResult.MISS
    with manager.lock:
        manager.on_request_finished(ctx)
    manager.shutdown()

    # A restarted server: a new manager and tier on the same root find every block.
    manager = make_manager(tmp_path, "ferry-tier-b")
    ctx = ReqContext("r2")
    with manager.lock:
        manager.on_new_request(ctx)
    for key in (keys[0], keys[6]):
        seen, got = load(manager, ctx, key)
        assert seen[0] is LookupResult.HIT_PENDING
        assert np.array_equal(got, data[key])
    with manager.lock:
        manager.on_request_finished(ctx)
    manager.shutdown()


def test_two_engines_share_one_root_as_a_fleet(tmp_path):
    """Two engine instances (two tiers) on one root with fleet_writers: each writes its own
    share; each finds the other's blocks with their bytes. Without it the second is refused."""
    keys = [offload_key(i) for i in range(8)]
    data = payloads(keys, 3)
    a = make_manager(tmp_path, "ferry-fleet-a", fleet_writers=2)
    b = make_manager(tmp_path, "ferry-fleet-b", fleet_writers=2)
    ctx_a, ctx_b = ReqContext("a"), ReqContext("b")
    for manager, ctx in ((a, ctx_a), (b, ctx_b)):
        with manager.lock:
            manager.on_new_request(ctx)
    store(a, ctx_a, keys[:4], data)
    store(a, ctx_a, keys[4:], data)  # keys[:4] leave a's CPU tier, in ferry's
    store(b, ctx_b, [offload_key(100 + i) for i in range(4)],
          payloads([offload_key(100 + i) for i in range(4)], 4))
    for key in (keys[0], keys[5]):  # a's blocks, loaded by b from the shared root
        seen, got = load(b, ctx_b, key)
        assert seen[0] is LookupResult.HIT_PENDING and seen[-1] is LookupResult.HIT, seen
        assert np.array_equal(got, data[key])
    assert b.secondary_tiers[0]._store.stats()["writers_active"] == 2
    with pytest.raises(Exception, match="all 2 writer shares of this fleet are taken"):
        make_manager(tmp_path, "ferry-fleet-c", fleet_writers=2)
    for manager, ctx in ((a, ctx_a), (b, ctx_b)):
        with manager.lock:
            manager.on_request_finished(ctx)
        manager.shutdown()


def direct_tier(root, rows=8):
    """The tier as vLLM builds it, over a primary region of `rows` chunks."""
    import ferry.vllm
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    ferry.vllm.register()
    extra = {"cpu_bytes_to_use": rows * CHUNK}
    spec = TieringOffloadingSpec(offloading_config(extra, PAGE, engine_id="ferry-direct"))
    primary = np.zeros((rows, CHUNK), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "ferry", "root": str(root), "capacity_bytes": 64 * CHUNK},
        memoryview(primary), spec)
    return tier, primary


def finish(tier, job_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        for result in tier.get_finished_jobs():
            assert result.job_id == job_id
            return result
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_tier_corrupt_block_is_a_failed_key_and_contracts(tmp_path):
    keys = [offload_key(i) for i in range(4)]
    data = payloads(keys, 2)
    tier, primary = direct_tier(tmp_path)
    ctx = ReqContext("r")
    for i, key in enumerate(keys):  # one job each: slots in order
        primary[i] = data[key]
        tier.submit_store(TransferJob(i, [key], np.array([i], dtype=np.int32), False, ctx))
        tier.drain_jobs()  # every submitted job done, its result queued
        (result,) = tier.get_finished_jobs()
        assert result.job_id == i and result.success
    assert not tier.has_pending_work()
    tier.shutdown()
    tier.shutdown()  # idempotent
    slabs = sorted(glob.glob(os.path.join(tmp_path, "ns-*", "slab-*.dat")))
    assert slabs
    with open(slabs[0], "r+b") as f:  # the first slot of the first slab: the first block
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))

    tier, primary = direct_tier(tmp_path)
    primary[:] = 0
    tier.submit_load(TransferJob(10, keys, np.arange(4, dtype=np.int32), True, ctx))
    result = finish(tier, 10)
    assert not result.success
    good = set(result.successful_keys)
    assert good < set(keys) and len(good) == 3, result
    for i, key in enumerate(keys):
        if key in good:
            assert np.array_equal(primary[i], data[key])
    # The failed block is gone: a later lookup misses instead of failing again.
    (bad,) = set(keys) - good
    assert tier.lookup(bad, ctx) is LookupResult.MISS
    # All keys missing: a failed job without successful keys.
    tier.submit_load(TransferJob(11, [offload_key(50)], np.array([0], dtype=np.int32), True, ctx))
    result = finish(tier, 11)
    assert not result.success and not result.successful_keys
    tier.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        tier.submit_load(TransferJob(12, [keys[1]], np.array([0], dtype=np.int32), True, ctx))


def test_tier_config_errors(tmp_path):
    import ferry.vllm
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    ferry.vllm.register()
    spec = TieringOffloadingSpec(offloading_config({"cpu_bytes_to_use": 4 * CHUNK}, PAGE))
    view = memoryview(np.zeros((4, CHUNK), dtype=np.uint8))
    with pytest.raises(ValueError, match="'root'"):
        SecondaryTierFactory.create_secondary_tier({"type": "ferry", "capacity_bytes": 1 << 30},
                                                   view, spec)
    with pytest.raises(ValueError, match="capacity_bytes"):
        SecondaryTierFactory.create_secondary_tier({"type": "ferry", "root": str(tmp_path)},
                                                   view, spec)
    with pytest.raises(ValueError, match="unknown key.*threads_typo"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": "ferry", "root": str(tmp_path), "capacity_bytes": 1 << 30,
             "threads_typo": 3}, view, spec)


def test_jobs_waiting_behind_running_calls_go_as_one_call(tmp_path):
    """Two store calls per direction run at once; jobs submitted meanwhile go together as one
    call when one ends (a job whose keys are already in that call waits for the next). Every
    job's result and bytes are its own."""
    import ferry.vllm
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    ferry.vllm.register()
    chunks = 16
    spec = TieringOffloadingSpec(offloading_config({"cpu_bytes_to_use": chunks * CHUNK}, PAGE))
    primary = np.zeros((chunks, CHUNK), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "ferry", "root": str(tmp_path), "capacity_bytes": 64 * CHUNK},
        memoryview(primary), spec)
    store, held, calls = tier._store, [], []
    real_put, real_get = store.put_async, store.get_async

    def gated(real):  # the first two calls wait until released; later ones run at once
        def call(keys, blocks, callback):
            calls.append(len(keys))
            if len(calls) <= 2:
                held.append(lambda: real(keys, blocks, callback=callback))
            else:
                real(keys, blocks, callback=callback)
        return call

    store.put_async, store.get_async = gated(real_put), gated(real_get)
    keys = [offload_key(i) for i in range(chunks)]
    rng = np.random.default_rng(7)
    primary[:] = rng.integers(0, 256, primary.shape, dtype=np.uint8)
    want = primary.copy()
    ctx = ReqContext("merge")
    # 8 jobs of 2 chunks; job 7 repeats job 6's keys (so it cannot join job 6's call).
    jobs = [TransferJob(j, keys[2 * j:2 * j + 2], np.arange(2 * j, 2 * j + 2, dtype=np.int32),
                        False, ctx) for j in range(7)]
    jobs.append(TransferJob(7, keys[12:14], np.arange(12, 14, dtype=np.int32), False, ctx))
    for job in jobs:
        tier.submit_store(job)
    assert calls == [2, 2] and tier.has_pending_work()
    for release in held:
        release()
    tier.drain_jobs()
    # Jobs 2-6 together when one call ended, job 7 (job 6's keys) when the other did (the two
    # calls are made on the store's threads, in either order).
    assert calls[:2] == [2, 2] and sorted(calls[2:]) == [2, 10], calls
    results = {r.job_id: r for r in tier.get_finished_jobs()}
    assert sorted(results) == list(range(8)) and all(r.success for r in results.values())

    store.put_async, store.get_async = real_put, real_get
    primary[:] = 0
    for j in range(7):
        tier.submit_load(TransferJob(100 + j, keys[2 * j:2 * j + 2],
                                     np.arange(2 * j, 2 * j + 2, dtype=np.int32), True, ctx))
    tier.drain_jobs()
    results = {r.job_id: r for r in tier.get_finished_jobs()}
    assert sorted(results) == list(range(100, 107)) and all(r.success for r in results.values())
    assert np.array_equal(primary[:14], want[:14])
    tier.shutdown()
