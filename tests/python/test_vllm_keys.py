"""vLLM's offload keys in ferry's store (real vllm; skipped without it): the store indexes blocks
by a 64-bit hash of the key, so two keys can meet under one hash. With that hash patched to a
constant (every key collides), the tier and the spec's worker load a key's block only when the
full key stored with it is that key: another key's block is a failed key, never its bytes."""
import os

import numpy as np
import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
pytest.importorskip("vllm")

from vllm_helpers import offload_key  # noqa: E402

import torch  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402

from test_vllm_spec import gpu, kv_caches, make_spec, run  # noqa: E402
from test_vllm_tier import CHUNK, direct_tier, finish, payloads  # noqa: E402


def test_trailer_records():
    from ferry.vllm.keys import TRAILER, record
    a, b = offload_key(1), offload_key(2)
    assert len(record(a)) == TRAILER and record(a) != record(b)
    assert record(a)[2:2 + len(a)] == a
    long_a, long_b = b"x" * 300 + b"a", b"x" * 300 + b"b"
    assert len(record(long_a)) == TRAILER and record(long_a) != record(long_b)


def test_tier_colliding_keys(tmp_path, monkeypatch):
    import ferry.vllm.tier
    monkeypatch.setattr(ferry.vllm.tier, "kv_key", lambda key: 42)
    a, b = offload_key(1), offload_key(2)
    data = payloads([a, b], 5)
    tier, primary = direct_tier(tmp_path)
    ctx = ReqContext("r")
    primary[0] = data[a]
    tier.submit_store(TransferJob(1, [a], np.array([0], dtype=np.int32), False, ctx))
    assert finish(tier, 1).success
    # b's hash is taken by a's block: the store keeps a's (its put is "already present").
    primary[1] = data[b]
    tier.submit_store(TransferJob(2, [b], np.array([1], dtype=np.int32), False, ctx))
    assert finish(tier, 2).success
    assert tier.lookup(b, ctx) is LookupResult.HIT  # the index cannot tell them apart

    primary[:] = 0
    tier.submit_load(TransferJob(3, [a, b], np.array([2, 3], dtype=np.int32), True, ctx))
    result = finish(tier, 3)
    assert not result.success and tuple(result.successful_keys) == (a,)
    assert np.array_equal(primary[2], data[a])
    tier.submit_load(TransferJob(4, [b], np.array([4], dtype=np.int32), True, ctx))
    result = finish(tier, 4)
    assert not result.success and not result.successful_keys
    # a's block stays for a.
    tier.submit_load(TransferJob(5, [a], np.array([5], dtype=np.int32), True, ctx))
    assert finish(tier, 5).success and np.array_equal(primary[5], data[a])
    tier.shutdown()
    assert CHUNK == primary.shape[1]


def test_spec_colliding_keys(tmp_path, monkeypatch):
    import ferry.vllm.spec
    from ferry.vllm.spec import FerryLoadStoreSpec
    monkeypatch.setattr(ferry.vllm.spec, "kv_key", lambda key: 42)
    spec = make_spec(tmp_path)
    source, caches = kv_caches(4)
    reference = [t.clone() for t in source]
    worker = spec.get_worker(caches)
    a, b = offload_key(1), offload_key(2)
    assert run(worker, 1, lambda: worker.submit_store(1, gpu([3]), FerryLoadStoreSpec([a]))).success
    for t in source:
        t[[5, 6]] = 0
    # vLLM's own connector: the job fails (vLLM stops) rather than hand b a's bytes.
    result = run(worker, 2, lambda: worker.submit_load(2, FerryLoadStoreSpec([b]), gpu([5])))
    assert not result.success
    # FerryOffloadingConnector: b's block is a load error, which vLLM recomputes.
    spec.reports_load_errors = True
    for t in source:
        t[5] = 0
    result = run(worker, 3, lambda: worker.submit_load(3, FerryLoadStoreSpec([a, b]),
                                                       gpu([6, 5])))
    assert result.success and worker.take_load_errors() == {5}
    for t, ref in zip(source, reference):
        assert torch.equal(t[6], ref[3])
    # a's block is still there (b's failed load did not remove it).
    assert spec.get_manager().lookup(a, ReqContext("r")) is LookupResult.HIT
    worker.shutdown()
    spec.get_manager().shutdown()
