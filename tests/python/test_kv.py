"""ferry.KVStore with torch tensors (vLLM's own interfaces: test_vllm_*.py):
round trips bit-exact (contiguous and per-layer pieces), async forms with callbacks, per-key
status, keys as ints and bytes, reopening, and paged KV laid out as vLLM lays it out. CPU tensors
here; the same tests run on cuda:0 where a GPU is present (both gpu paths)."""
import os
import sys
import threading
import time

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")

import ferry  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])
PATHS = ["staged", "direct"] if torch.cuda.is_available() else ["auto"]


def open_store(root, block_bytes=64 * 1024, blocks=64, **kw):
    kw.setdefault("allow_compat", True)
    return ferry.KVStore(root, model="test-model", dtype="bf16", block_layout="l=4",
                         capacity_bytes=blocks * ((block_bytes + 4095) // 4096 * 4096),
                         block_bytes=block_bytes, **kw)


def direct_unusable(path, device):
    """cuFile may be missing on a GPU machine: a direct put is then `unsupported`, said so."""
    return path == "direct" and device != "cpu"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gpu_path", PATHS)
def test_round_trip_contiguous_and_pieces(tmp_path, device, gpu_path):
    gen = torch.Generator().manual_seed(1)
    with open_store(tmp_path, gpu_path=gpu_path) as store:
        whole = [torch.randint(0, 255, (64 * 1024,), dtype=torch.uint8, generator=gen).to(device)
                 for _ in range(4)]
        layers = [[torch.randn(8, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
                   for _ in range(8)] for _ in range(3)]  # 8 pieces of 2 KiB: 16 KiB blocks
        results = store.put([1, 2, 3, 4], whole)
        if direct_unusable(gpu_path, device) and results[0].status == "unsupported":
            pytest.skip(results[0].message)
        assert all(r.ok for r in results), results
        routes = {r.route for r in results}
        if device == "cpu":
            assert routes == {"host"}
        elif gpu_path == "staged":
            assert routes == {"staged"}
        else:
            assert routes <= {"cufile-gds", "cufile-compat"}
        assert all(r.ok for r in store.put([b"req-a", b"req-b", b"req-c"], layers))
        back = [torch.empty_like(t) for t in whole]
        assert all(r.ok for r in store.get([1, 2, 3, 4], back))
        for a, b in zip(whole, back):
            assert torch.equal(a.cpu(), b.cpu())
        # Per-layer pieces read back as pieces, and as one contiguous block (the host view).
        back_layers = [[torch.zeros_like(p) for p in block] for block in layers]
        assert all(r.ok for r in store.get([b"req-a", b"req-b", b"req-c"], back_layers))
        for a, b in zip(layers, back_layers):
            assert all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))
        flat = torch.empty(16 * 1024, dtype=torch.uint8)
        assert store.get([b"req-b"], [flat])[0].ok
        assert torch.equal(flat, torch.cat([p.cpu().view(torch.uint8).reshape(-1)
                                            for p in layers[1]]))
        assert store.lookup([1, 2, 3, 99, 4]) == 3
        assert store.contains([1, 99, b"req-c"]) == [True, False, True]


@pytest.mark.parametrize("device", DEVICES)
def test_page_cache_dma_round_trip_says_its_route(tmp_path, device):
    """page_cache_pin=: gets into GPU memory copy from registered page-cache windows once the
    slab is in the page cache (read it first); host memory keeps the host path and says why."""
    gen = torch.Generator().manual_seed(2)
    blocks = [torch.randint(0, 255, (64 * 1024,), dtype=torch.uint8, generator=gen)
              for _ in range(4)]
    with open_store(tmp_path, page_cache_pin="64MiB", slab_count=1) as store:
        assert all(r.ok for r in store.put([1, 2, 3, 4], [b.to(device) for b in blocks]))
        for slab in tmp_path.rglob("slab-*.dat"):
            slab.read_bytes()  # into the page cache
        # The first get takes the usual path while its window is registered in the background
        # (a get never waits for a registration); the second copies from it.
        for attempt in ("first", "registered"):
            out = [torch.zeros_like(b, device=device) for b in blocks]
            results = store.get([1, 2, 3, 4], out)
            for r, got, want in zip(results, out, blocks):
                assert r.ok, r.message
                assert torch.equal(got.cpu(), want)
                if device == "cpu":
                    assert r.route == "host" and "host memory" in r.route_reason, r
                elif attempt == "first":
                    assert "registering it in the background" in r.route_reason, r.route_reason
                else:
                    assert r.route == "page-cache-dma", r.route_reason
            for _ in range(60000):
                if store.stats()["page_cache_windows_pending"] == 0:
                    break
                time.sleep(0.001)
            assert store.stats()["page_cache_windows_pending"] == 0
        stats = store.stats()
        assert stats["page_cache_pin"] == 64 << 20
        assert stats["page_cache_dma_bytes"] == (0 if device == "cpu" else 4 * 64 * 1024)
        assert stats["page_cache_windows_registered"] == (0 if device == "cpu" else 1)
    with pytest.raises(ValueError, match="page_cache_pin"):
        open_store(tmp_path / "bad", page_cache_pin="lots")


def test_per_key_status_and_bad_input(tmp_path):
    with open_store(tmp_path) as store:
        block = torch.arange(64 * 1024 // 4, dtype=torch.int32)
        assert store.put([7], [block])[0].ok
        assert store.put([7], [block])[0].status == "already_present"
        small = torch.empty(100, dtype=torch.uint8)
        results = store.get([7, 8, 7], [torch.empty_like(block), torch.empty_like(block), small])
        assert [r.status for r in results] == ["ok", "missing", "bad_size"]
        assert "100" in results[2].message
        assert results[1].route == "none"
        too_big = torch.empty(64 * 1024 + 1, dtype=torch.uint8)
        assert store.put([9], [too_big])[0].status == "bad_size"
        with pytest.raises(ValueError, match="contiguous"):
            store.put([10], [torch.empty(64, 1024, dtype=torch.uint8).t()])
        with pytest.raises(ValueError, match="2 keys but 1 blocks"):
            store.put([1, 2], [block])
        with pytest.raises(TypeError):
            store.put([1.5], [block])
        assert [r.status for r in store.remove([7, 7])] == ["ok", "missing"]
        assert store.stats()["blocks"] == 0
    with pytest.raises(ValueError, match="block size"):
        open_store(tmp_path, block_bytes=4096)
    for name, bad in (("slab_count", -1), ("checkpoint_every", -5), ("fleet_writers", 2 ** 40),
                      ("block_bytes", "64KiB"), ("capacity_bytes", -1), ("fleet_writers", True)):
        sizes = {"capacity_bytes": 1 << 20, "block_bytes": 4096, name: bad}
        with pytest.raises(ValueError, match=f"{name} must be a whole number from 0 to"):
            ferry.KVStore(tmp_path / "bad", model="m", dtype="bf16", **sizes)


def test_a_fleet_of_writers_shares_one_namespace(tmp_path):
    """fleet_writers: each writer its share; each sees the other's blocks; one more is refused;
    a writer without it on a fleet's namespace is refused."""
    a = open_store(tmp_path, fleet_writers=2)
    b = open_store(tmp_path, fleet_writers=2)
    block = torch.arange(64 * 1024 // 4, dtype=torch.int32)
    assert a.put([1], [block])[0].ok
    assert b.put([2], [block + 1])[0].ok
    out = torch.empty_like(block)
    assert b.get([1], [out])[0].ok and torch.equal(out, block)
    assert a.get([2], [out])[0].ok and torch.equal(out, block + 1)
    assert a.stats()["writers_active"] == 2
    with pytest.raises(RuntimeError, match="all 2 writer shares of this fleet are taken"):
        open_store(tmp_path, fleet_writers=2)
    with pytest.raises(ValueError):
        open_store(tmp_path)
    a.close()
    b.close()


def test_async_with_callbacks_and_reopen(tmp_path):
    store = open_store(tmp_path, blocks=256)
    blocks = [torch.full((64 * 1024,), i, dtype=torch.uint8) for i in range(100)]
    seen = []
    done = threading.Event()

    def callback(results):
        seen.append(results)
        done.set()

    ticket = store.put_async(range(100), blocks, callback=callback)
    assert ticket.wait(60)
    assert done.is_set() and len(seen) == 1
    assert all(r.ok for r in ticket.results()) and len(seen[0]) == 100
    # Tickets whose owners drop them still finish (the tensors are held until then).
    back = [torch.empty(64 * 1024, dtype=torch.uint8) for _ in range(100)]
    tickets = [store.get_async([i], [back[i]]) for i in range(100)]
    assert all(t.results()[0].ok for t in tickets)
    assert all(int(b[0]) == i and int(b[-1]) == i for i, b in enumerate(back))
    # A callback that raises does not break the store: it is reported as unraisable.
    reported = []
    hook, sys.unraisablehook = sys.unraisablehook, reported.append
    try:
        broken = store.get_async([1], [back[1]], callback=lambda r: 1 / 0)
        assert broken.results()[0].ok
    finally:
        sys.unraisablehook = hook
    assert len(reported) == 1 and isinstance(reported[0].exc_value, ZeroDivisionError)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.lookup([1])
    with open_store(tmp_path, blocks=256) as again:
        assert again.lookup(list(range(100))) == 100
        assert again.stats()["blocks"] == 100
        reader = open_store(tmp_path, blocks=256, read_only=True)
        assert reader.lookup(list(range(100))) == 100
        assert reader.put([1000], [blocks[0]])[0].status == "read_only"
        reader.close()
