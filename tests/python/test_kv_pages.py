"""ferry.KVPages: a paged KV cache given per layer (block i = row rows[i] of every layer tensor)
round-trips bit-exact through KVStore, sync and async, equals the same blocks given piece by
piece, leaves other rows and the padding between strided rows untouched, and refuses bad
geometry by name. CPU tensors here; cuda:0 too where a GPU is present."""
import os
import threading

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")

import ferry  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])
BLOCKS = 8


def cache(device, seed):
    """Two layers of vLLM's shape (blocks, 16 tokens, 2 heads, 64) bf16 and one strided layer:
    the first half of each row of a (blocks, 2, 1024) uint8 tensor (its rows 2 KiB apart)."""
    gen = torch.Generator().manual_seed(seed)
    layers = [torch.randn(BLOCKS, 16, 2, 64, generator=gen).to(torch.bfloat16)
              for _ in range(2)]
    wide = torch.randint(0, 255, (BLOCKS, 2, 1024), dtype=torch.uint8, generator=gen)
    return [t.to(device) for t in layers] + [wide.to(device)]


def pages_of(tensors):
    return tensors[:2] + [tensors[2][:, 0]]


def block_bytes():
    return 2 * 16 * 2 * 64 * 2 + 1024


def open_store(root):
    return ferry.KVStore(root, model="m", dtype="bf16", block_layout="paged", allow_compat=True,
                         capacity_bytes=32 * 8192, block_bytes=block_bytes())


@pytest.mark.parametrize("device", DEVICES)
def test_round_trip_matches_pieces_and_touches_nothing_else(tmp_path, device):
    source = cache(device, 1)
    rows, keys = [5, 2, 7], [50, 20, 70]
    with open_store(tmp_path) as store:
        assert all(r.ok for r in store.put(keys, ferry.KVPages(pages_of(source), rows)))
        target = [torch.zeros_like(t) for t in source]
        target[2].fill_(0x5A)
        assert all(r.ok for r in store.get(keys, ferry.KVPages(pages_of(target), rows)))
        for t, s in zip(pages_of(target), pages_of(source)):
            for row in range(BLOCKS):
                assert torch.equal(t[row].cpu(), s[row].cpu()) == (row in rows), row
        assert bool((target[2][:, 1] == 0x5A).all())  # the padding after each strided row
        # The same blocks given piece by piece hold the same bytes.
        pieces = [[torch.empty_like(p[r]) for p in pages_of(source)] for r in rows]
        assert all(r.ok for r in store.get(keys, pieces))
        for block, row in zip(pieces, rows):
            for piece, layer in zip(block, pages_of(source)):
                assert torch.equal(piece.cpu(), layer[row].cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_async_forms_with_callbacks(tmp_path, device):
    source, target = cache(device, 2), [torch.zeros_like(t) for t in cache(device, 2)]
    rows = list(range(BLOCKS))
    keys = [b"block-%d" % r for r in rows]
    done = threading.Event()
    seen = []
    with open_store(tmp_path) as store:
        ticket = store.put_async(keys, ferry.KVPages(pages_of(source), rows))
        assert ticket.wait(30) and all(r.ok for r in ticket.results())

        def callback(results):
            seen.extend(results)
            done.set()
        store.get_async(keys, ferry.KVPages(pages_of(target), rows), callback=callback)
        assert done.wait(30) and len(seen) == BLOCKS and all(r.ok for r in seen)
    for t, s in zip(pages_of(target), pages_of(source)):
        assert torch.equal(t.cpu(), s.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_joined_batches_keep_each_part_on_its_own_layers(tmp_path, device):
    """Two parts of one batch (a hybrid model's KV groups), each block of each part the rows of
    that part's layers: one call moves both, in order."""
    a, b = cache(device, 4), cache(device, 5)
    # Both parts' blocks must have the store's block size: part b gives its three layers too.
    pages = ferry.KVPages.joined([ferry.KVPages(pages_of(a), [1, 6]),
                                  ferry.KVPages(pages_of(b), [0])])
    assert len(pages) == 3 and pages.rows == [1, 6, 0]
    with open_store(tmp_path) as store:
        assert all(r.ok for r in store.put([1, 2, 3], pages))
        got = [torch.zeros_like(t) for t in a]
        back = store.get([1, 2, 3], [[p[r] for p in pages_of(got)] for r in (0, 1, 2)])
        assert all(r.ok for r in back)
        for t_got, t_a, t_b in zip(pages_of(got), pages_of(a), pages_of(b)):
            assert torch.equal(t_got[0].cpu(), t_a[1].cpu())
            assert torch.equal(t_got[1].cpu(), t_a[6].cpu())
            assert torch.equal(t_got[2].cpu(), t_b[0].cpu())
    with pytest.raises(ValueError, match="at least one KVPages"):
        ferry.KVPages.joined([])


def test_bad_geometry_is_refused_by_name(tmp_path):
    layers = pages_of(cache("cpu", 3))
    with open_store(tmp_path) as store:
        with pytest.raises(ValueError, match="row 8 is past paged layer 0's 8 rows"):
            store.get([1], ferry.KVPages(layers, [8]))
        with pytest.raises(ValueError, match="2 keys but 1 blocks"):
            store.get([1, 2], ferry.KVPages(layers, [0]))
        with pytest.raises(ValueError, match="a row is not contiguous"):
            ferry.KVPages([torch.zeros(4, 8, 2)[:, :, 0]], [0])
        with pytest.raises(ValueError, match="not -1"):
            ferry.KVPages(layers, [-1])
        with pytest.raises(ValueError, match="no rows"):
            ferry.KVPages([torch.zeros(0, 8)], [0])
        with pytest.raises(ValueError, match="at least one layer"):
            ferry.KVPages([], [0])
        with pytest.raises(TypeError, match="not list"):
            ferry.KVPages([[1, 2]], [0])
