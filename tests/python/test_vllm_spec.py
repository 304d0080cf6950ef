"""FerryOffloadingSpec in the real vllm (skipped without it): its worker moves KV pages shaped as
vLLM's CanonicalKVCaches (CPU tensors here) to and from ferry.KVStore bit-exactly, its manager
finds what the worker stored, and a failed load is reported as vLLM can act on it."""
import os
import time

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
pytest.importorskip("vllm")

from vllm_helpers import offload_key, offloading_config  # noqa: E402

import torch  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches,  # noqa: E402
                                     CanonicalKVCacheTensor, GPULoadStoreSpec, LookupResult,
                                     ReqContext)

PAGE = 16 * 1024
BLOCKS = 12


def kv_caches(seed):
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randint(-128, 127, (BLOCKS, PAGE), dtype=torch.int8, generator=gen)
               for _ in range(2)]
    return tensors, CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, PAGE) for t in tensors],
        group_data_refs=[[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]])


def make_spec(path, **extra):
    import ferry.vllm
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    ferry.vllm.register()
    config = offloading_config({"spec_name": "FerryOffloadingSpec", "root": str(path),
                                "capacity_bytes": 64 * 2 * PAGE, **extra}, PAGE)
    return OffloadingSpecFactory.create_spec(config)


def gpu(ids):
    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


def run(worker, job_id, submit):
    assert submit()
    worker.wait({job_id})
    (result,) = worker.get_finished()
    assert result.job_id == job_id
    return result


def test_jobs_finish_through_get_finished_alone(tmp_path):
    """vLLM's worker polls get_finished each step (no wait()): every job shows up there once,
    with its result, the load's bytes in place; shutdown settles what is still in flight."""
    from ferry.vllm.spec import FerryLoadStoreSpec
    spec = make_spec(tmp_path)
    source, caches = kv_caches(3)
    reference = [t.clone() for t in source]
    worker = spec.get_worker(caches)
    keys = [offload_key(i) for i in range(4)]
    assert worker.submit_store(1, gpu([0, 1, 2, 3]), FerryLoadStoreSpec(keys))

    def finished(job_id):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = worker.get_finished()
            if got:
                assert [r.job_id for r in got] == [job_id]
                return got[0]
            time.sleep(0.01)
        raise AssertionError(f"job {job_id} never finished")

    assert finished(1).success
    for t in source:
        t[[8, 9, 10, 11]] = 0
    assert worker.submit_load(2, FerryLoadStoreSpec(keys), gpu([8, 9, 10, 11]))
    assert finished(2).success
    assert worker.get_finished() == []
    for t, ref in zip(source, reference):
        assert torch.equal(t[8:12], ref[0:4])
    assert worker.submit_load(3, FerryLoadStoreSpec(keys[:2]), gpu([4, 5]))
    worker.shutdown()  # waits for job 3
    assert [r.job_id for r in worker.get_finished()] == [3]
    spec.get_manager().shutdown()


def test_spec_store_lookup_load_exact(tmp_path):
    from ferry.vllm.spec import FerryLoadStoreSpec
    spec = make_spec(tmp_path)
    source, caches = kv_caches(1)
    worker = spec.get_worker(caches)
    manager = spec.get_manager()
    ctx = ReqContext("r")
    keys = [offload_key(i) for i in range(3)]
    assert all(manager.lookup(k, ctx) is LookupResult.MISS for k in keys)
    out = manager.prepare_store(keys, ctx)
    assert out.keys_to_store == keys and out.evicted_keys == []
    assert manager.lookup(keys[0], ctx) is LookupResult.HIT_PENDING
    result = run(worker, 1, lambda: worker.submit_store(1, gpu([3, 7, 1]), out.store_spec))
    assert result.success and result.transfer_size == 3 * 2 * PAGE
    manager.complete_store(keys, ctx)
    assert all(manager.lookup(k, ctx) is LookupResult.HIT for k in keys)
    assert manager.prepare_store(keys, ctx).keys_to_store == []

    for t in source:  # the GPU blocks are reused for something else
        t[[0, 2, 4]] = 0
    load = manager.prepare_load(keys, ctx)
    result = run(worker, 2, lambda: worker.submit_load(2, load, gpu([0, 2, 4]), expedited=True))
    assert result.success
    for t, reference in zip(source, kv_caches(1)[0]):
        for dst, src in zip([0, 2, 4], [3, 7, 1]):
            assert torch.equal(t[dst], reference[src])
    counters = worker.counters
    assert counters["stored_blocks"] == 3 and counters["loaded_blocks"] == 3
    assert counters["store_seconds"] > 0 and counters["load_seconds"] > 0
    assert counters["routes"] == {"host": 6}

    # A load of a block never stored: under vLLM's own OffloadingConnector the job fails
    # (vLLM stops rather than use wrong bytes) ...
    missing = FerryLoadStoreSpec([keys[0], offload_key(77)])
    result = run(worker, 3, lambda: worker.submit_load(3, missing, gpu([5, 6])))
    assert not result.success
    # ... and under FerryOffloadingConnector the job completes and block 6 is a load error,
    # which vLLM recomputes.
    spec.reports_load_errors = True
    result = run(worker, 4, lambda: worker.submit_load(4, missing, gpu([5, 6])))
    assert result.success
    assert worker.take_load_errors() == {6}
    assert worker.take_load_errors() == set()
    # Keys and blocks that do not pair are refused.
    assert not worker.submit_load(5, missing, gpu([5]))
    worker.shutdown()
    manager.shutdown()

    # A restarted server finds the blocks.
    spec = make_spec(tmp_path)
    assert spec.get_manager().lookup(keys[2], ctx) is LookupResult.HIT
    assert spec.get_manager().lookup(offload_key(78), ctx) is LookupResult.MISS
    worker = spec.get_worker(kv_caches(3)[1])
    worker.shutdown()
    spec.get_manager().shutdown()


def test_two_engines_share_one_root_as_a_fleet(tmp_path):
    """Two engine instances' specs on one root with fleet_writers: each worker stores into its
    own share; each engine's manager finds the other's blocks and its worker loads them exact."""
    from ferry.vllm.spec import FerryLoadStoreSpec
    engines = [make_spec(tmp_path, fleet_writers=2) for _ in range(2)]
    sources = [kv_caches(seed) for seed in (5, 6)]
    workers = [spec.get_worker(caches) for spec, (_, caches) in zip(engines, sources)]
    managers = [spec.get_manager() for spec in engines]
    ctx = ReqContext("fleet")
    keys = [[offload_key(100 * e + i) for i in range(3)] for e in range(2)]
    for e, (manager, worker) in enumerate(zip(managers, workers)):
        out = manager.prepare_store(keys[e], ctx)
        assert run(worker, 1, lambda: worker.submit_store(1, gpu([0, 1, 2]), out.store_spec)).success
        manager.complete_store(keys[e], ctx)
    # Engine 1 finds engine 0's blocks and loads them into its own GPU blocks 9, 10, 11.
    assert all(managers[1].lookup(k, ctx) is LookupResult.HIT for k in keys[0])
    result = run(workers[1], 2, lambda: workers[1].submit_load(
        2, FerryLoadStoreSpec(keys[0]), gpu([9, 10, 11])))
    assert result.success
    for t, reference in zip(sources[1][0], kv_caches(5)[0]):
        for dst, src in zip([9, 10, 11], [0, 1, 2]):
            assert torch.equal(t[dst], reference[src])
    with pytest.raises(Exception, match="all 2 writer shares of this fleet are taken"):
        make_spec(tmp_path, fleet_writers=2).get_worker(kv_caches(7)[1])
    for worker, manager in zip(workers, managers):
        worker.shutdown()
        manager.shutdown()


def test_spec_config_errors(tmp_path):
    with pytest.raises(ValueError, match="'root'"):
        make_spec(tmp_path, root="")
    with pytest.raises(ValueError, match="slab_count must be int"):
        make_spec(tmp_path, slab_count="four")


def test_connector_is_registered():
    import ferry.vllm
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector)
    ferry.vllm.register()
    cls = KVConnectorFactory._registry["FerryOffloadingConnector"]()
    assert issubclass(cls, OffloadingConnector)
    assert "get_block_ids_with_load_errors" in cls.__dict__


def test_spec_job_of_two_kv_groups_round_trips(tmp_path):
    """A hybrid model's job (two KV groups, each with its own layers: a sliding-window group
    beside a full-attention one) stores and loads each group's blocks from its own tensors."""
    spec = make_spec(tmp_path)
    source = kv_caches(5)[0]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, PAGE) for t in source],
        group_data_refs=[[CanonicalKVCacheRef(0, PAGE)], [CanonicalKVCacheRef(1, PAGE)]])
    worker = spec.get_worker(caches)
    keys = [offload_key(i, 0) for i in range(2)] + [offload_key(i, 1) for i in range(2)]
    ids, into = [3, 7, 1, 5], [0, 2, 4, 6]
    two = lambda blocks: GPULoadStoreSpec(blocks, group_sizes=[2, 2], block_indices=[0, 0])
    stored = spec.get_manager().prepare_store(keys, ReqContext("r")).store_spec
    assert run(worker, 1, lambda: worker.submit_store(1, two(ids), stored)).success
    spec.get_manager().complete_store(keys, ReqContext("r"))
    load = spec.get_manager().prepare_load(keys, ReqContext("r"))
    assert run(worker, 2, lambda: worker.submit_load(2, load, two(into))).success
    reference = kv_caches(5)[0]
    for group, (dst, src) in enumerate([(into[:2], ids[:2]), (into[2:], ids[2:])]):
        for d, s in zip(dst, src):
            assert torch.equal(source[group][d], reference[group][s]), (group, d)
    worker.shutdown()
    spec.get_manager().shutdown()
