"""ferry as a drop-in for safetensors' loading API, its per-key reads: to the GPU (equal to the
host path, read-ahead in order, slices reading only their bytes), eight threads on one handle, and
the read-ahead's logic on host memory."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import safetensors
import safetensors.torch
import torch

import ferry
import ferry.torch
from dropin_helpers import as_bytes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("small_reads", [True, False], ids=["small-reads", "engine-only"])
def test_per_key_reads_to_cuda_equal_the_host_path(tmp_path, monkeypatch, small_reads):
    """Through the transfer engine (a tensor of several chunks, tiny and empty ones), and the
    small ones through pinned memory where that path is on."""
    from ferry import _open

    if small_reads:  # off by default for get_tensor: switched on here so that path stays tested
        monkeypatch.setattr(_open, "SMALL_TENSOR_BYTES", 1 << 20)
    else:
        monkeypatch.setattr(_open, "SMALL_READ_BYTES", 0)
        monkeypatch.setattr(_open, "SMALL_TENSOR_BYTES", 0)
    generator = torch.Generator().manual_seed(1)
    tensors = {"big": torch.randint(0, 255, ((64 << 20) + 4099,), dtype=torch.uint8, generator=generator),
               "w": torch.rand((300, 70), generator=generator).to(torch.bfloat16),
               "s": torch.tensor(2.5), "e": torch.zeros((0, 4))}
    path = tmp_path / "gpu.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    for device in ("cuda:0", 0, torch.device("cuda:0")):
        with ferry.safe_open(path, "pt", device=device) as f:
            for name, want in tensors.items():
                got = f.get_tensor(name)
                assert got.device == torch.device("cuda:0") and got.dtype == want.dtype
                assert as_bytes(got) == as_bytes(want), name
            assert as_bytes(f.get_slice("w")[10:20, 3:9]) == as_bytes(tensors["w"][10:20, 3:9])
            everything = f.get_tensors()
            assert all(as_bytes(everything[n]) == as_bytes(t) for n, t in tensors.items())
    loaded = ferry.torch.load_file(path, device="cuda:0")
    assert all(as_bytes(loaded[n]) == as_bytes(t) for n, t in tensors.items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_read_ahead_to_cuda_follows_the_order_and_stays_out_of_random_access(tmp_path, monkeypatch):
    """Keys taken in keys() order or in file order are read ahead (hits) and equal the host path;
    keys taken at random read exactly what is asked for; a handle closed with reads ahead in
    flight cancels them."""
    from ferry import _read_ahead

    monkeypatch.setattr(_read_ahead, "READ_AHEAD_BYTES", 3 << 20)  # a window of a few tensors
    generator = torch.Generator().manual_seed(3)
    tensors = {f"t{i:02d}": torch.rand((256, 1024 + i), generator=generator) for i in range(24)}
    # First in keys(), last in the file (safetensors writes wider dtypes first).
    tensors["a_half"] = torch.rand((512, 300), generator=generator).to(torch.float16)
    path = tmp_path / "ahead.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    with ferry.safe_open(path, "pt") as host:
        file_order = host.offset_keys()
    assert file_order != sorted(tensors)
    for order in (sorted(tensors), file_order):
        with ferry.safe_open(path, "pt", device="cuda:0") as f:
            for name in order:
                got = f.get_tensor(name)
                torch.cuda.synchronize()
                assert as_bytes(got) == as_bytes(tensors[name]), name
                del got  # its memory goes back to torch's cache and may hold the next read
            stats = f.stats()
            assert stats["read_ahead_hits"] >= len(order) - 2, stats
            assert stats["read_ahead_wasted_bytes"] == 0, stats
    # Strides of 7 through 25 names: no two calls follow each other in either order.
    shuffled = [sorted(tensors)[(3 + 7 * k) % 25] for k in range(25)]
    with ferry.safe_open(path, "pt", device="cuda:0") as f:
        for name in shuffled[:10]:
            assert as_bytes(f.get_tensor(name)) == as_bytes(tensors[name]), name
        stats = f.stats()
        asked = sum(tensors[n].numel() * tensors[n].element_size() for n in shuffled[:10])
        # Only what was asked for (O_DIRECT may widen each read to 4 KiB pages at both ends).
        assert asked <= stats["bytes_read"] <= asked + 10 * 8192, stats
    f = ferry.safe_open(path, "pt", device="cuda:0")
    f.get_tensor(sorted(tensors)[0])
    f.get_tensor(sorted(tensors)[1])  # sequential: the next tensors are in flight now
    f.__exit__(None, None, None)
    with pytest.raises(ferry.SafetensorError):
        f.get_tensor(sorted(tensors)[2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("small_reads", [True, False], ids=["small-reads", "engine-only"])
def test_slices_to_cuda_read_only_their_bytes(tmp_path, monkeypatch, small_reads):
    """Row blocks, column blocks (one range per row part) and the covering-rows fallback (a
    step in the last dimension) land on the GPU equal to the host slices, read through pinned
    memory (small slices) or through the engine (one extent per range)."""
    from ferry import _open

    if not small_reads:
        monkeypatch.setattr(_open, "SMALL_READ_BYTES", 0)
    generator = torch.Generator().manual_seed(6)
    wide = torch.rand((96, 1024), generator=generator).to(torch.bfloat16)
    path = tmp_path / "wide.safetensors"
    safetensors.torch.save_file({"wide": wide}, str(path))
    cases = [((slice(0, 48),), 48 * 2048), ((slice(None), slice(0, 512)), 96 * 1024),
             ((slice(5, 9), slice(512, 1024)), 4 * 1024), ((slice(None), slice(0, 1024, 2)), None)]
    with ferry.safe_open(path, "pt", device="cuda:0") as f:
        for index, want_bytes in cases:
            before = f.stats()["bytes_read"]
            part = f.get_slice("wide")[index]
            assert part.device == torch.device("cuda:0"), index
            assert as_bytes(part) == as_bytes(wide[index]), index
            if want_bytes is not None:
                assert f.stats()["bytes_read"] - before == want_bytes, index
        # Many slices queued without a sync: the pinned blocks are recycled while copies wait.
        parts = [f.get_slice("wide")[i % 90:i % 90 + 6, (i % 4) * 256:] for i in range(300)]
        for i, part in enumerate(parts):
            assert as_bytes(part) == as_bytes(wide[i % 90:i % 90 + 6, (i % 4) * 256:]), i


def test_eight_threads_share_one_handle_and_open_their_own(tmp_path):
    import concurrent.futures

    generator = torch.Generator().manual_seed(2)
    tensors = {f"t{i}": torch.rand((64, 129), generator=generator) for i in range(64)}
    path = tmp_path / "many.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    shared = ferry.safe_open(path, "pt")

    def work(seed):
        names = sorted(tensors)[seed::8]
        with ferry.safe_open(path, "pt") as own:
            for name in names:
                for handle in (shared, own):
                    assert torch.equal(handle.get_tensor(name), tensors[name]), name
                    assert torch.equal(handle.get_slice(name)[3:9, 1:5], tensors[name][3:9, 1:5]), name
        return len(names)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        assert sum(pool.map(work, range(8))) == len(tensors)


def test_read_ahead_logic_on_host_memory(tmp_path, monkeypatch):
    """The read-ahead that serves cuda:N handles, run to host memory: the orders it follows, its
    memory bound, and random access reading exactly what is asked for."""
    from ferry import _ferry, _read_ahead

    monkeypatch.setattr(_read_ahead, "READ_AHEAD_BYTES", 3 * 40000)
    generator = torch.Generator().manual_seed(4)
    tensors = {f"t{i:02d}": torch.rand((100, 100), generator=generator) for i in range(12)}
    tensors["a_half"] = torch.rand((100, 100), generator=generator).to(torch.float16)
    path = tmp_path / "ahead.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    names = checkpoint.names()
    size_of = lambda name: checkpoint.tensor(name)[2]
    for order in (sorted(tensors), names):
        reader = _ferry.TensorReader(checkpoint)
        ahead = _read_ahead.ReadAhead(reader, names, "cpu", size_of)
        for name in order:
            got = ahead.take(name, size_of(name))
            assert got.numpy().tobytes() == as_bytes(tensors[name]), name
            assert ahead._pending_bytes <= _read_ahead.READ_AHEAD_BYTES
        assert ahead.hits == len(order) - 1 and ahead.wasted_bytes == 0
        assert reader.bytes_read == sum(size_of(n) for n in names)
    reader = _ferry.TensorReader(checkpoint)
    ahead = _read_ahead.ReadAhead(reader, names, "cpu", size_of)
    picks = [sorted(tensors)[(3 + 5 * k) % 13] for k in range(13)]  # never one after another
    for name in picks:
        assert ahead.take(name, size_of(name)).numpy().tobytes() == as_bytes(tensors[name]), name
    assert ahead.hits == 0 and ahead.wasted_bytes == 0 and reader.bytes_read == sum(map(size_of, picks))
    # A wrong guess is dropped and counted.
    ahead.take(sorted(tensors)[0], size_of(sorted(tensors)[0]))
    ahead.take(sorted(tensors)[1], size_of(sorted(tensors)[1]))
    ahead.take(sorted(tensors)[9], size_of(sorted(tensors)[9]))
    assert ahead.wasted_bytes > 0 and ahead._pending_bytes == 0
    ahead.close()


def test_read_ahead_submits_its_window_in_batches(tmp_path):
    """Keys taken in order cost one engine submission per half window, not one per key; every
    tensor equals the host path and the reader counts each byte once."""
    from ferry import _ferry, _read_ahead

    generator = torch.Generator().manual_seed(8)
    tensors = {f"t{i:03d}": torch.rand((16, 17 + i % 5), generator=generator) for i in range(200)}
    path = tmp_path / "small.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    names = checkpoint.names()
    size_of = lambda name: checkpoint.tensor(name)[2]

    class Counting:
        """The reader, counting the tensors of each submission."""

        def __init__(self, reader):
            self.reader, self.batches = reader, []

        def submit_tensors(self, wanted, device, after_event=0):
            self.batches.append(len(wanted))
            return self.reader.submit_tensors(wanted, device, after_event)

        def __getattr__(self, name):
            return getattr(self.reader, name)

    reader = _ferry.TensorReader(checkpoint)
    counting = Counting(reader)
    ahead = _read_ahead.ReadAhead(counting, names, "cpu", size_of)
    for name in names:
        assert ahead.take(name, size_of(name)).numpy().tobytes() == as_bytes(tensors[name]), name
    window = _read_ahead.READ_AHEAD_TENSORS
    assert sum(counting.batches) == len(names) and ahead.hits == len(names) - 1
    assert len(counting.batches) <= 2 + len(names) // (window // 2), counting.batches
    assert max(counting.batches) == window, counting.batches
    assert reader.bytes_read == sum(size_of(n) for n in names)
    ahead.close()


def test_read_ahead_leaves_small_tensors_to_the_caller(tmp_path):
    """Tensors the handle calls small (on a GPU: small ones in a page-cached file) are read by
    the caller when taken and never submitted to the engine; the large ones around them are
    still read ahead; every tensor equals the host path and each byte is read once. A small one
    taken out of order drops the guesses as any miss does."""
    from ferry import _ferry, _open, _read_ahead

    generator = torch.Generator().manual_seed(9)
    tensors = {}
    for i in range(30):
        tensors[f"t{i:02d}.big"] = torch.rand((64, 64), generator=generator)
        tensors[f"t{i:02d}.small"] = torch.rand((7,), generator=generator)
    path = tmp_path / "mixed.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    names = checkpoint.names()
    size_of = lambda name: checkpoint.tensor(name)[2]  # noqa: E731
    submitted = []

    class Recording:
        def __init__(self, reader):
            self.reader = reader

        def submit_tensors(self, wanted, device, after_event=0):
            submitted.extend(name for name, _ in wanted)
            return self.reader.submit_tensors(wanted, device, after_event)

        def __getattr__(self, name):
            return getattr(self.reader, name)

    for order in (sorted(tensors), names):
        submitted.clear()
        reader = _ferry.TensorReader(checkpoint)
        small_calls = []

        def read_small(name, size):
            small_calls.append(name)
            return _open.small_read(reader, name, [(0, size)], size, "cpu")

        ahead = _read_ahead.ReadAhead(Recording(reader), names, "cpu", size_of,
                                      lambda name, size: size < 1024, read_small)
        for name in order:
            assert ahead.take(name, size_of(name)).numpy().tobytes() == as_bytes(tensors[name]), name
        bigs = [n for n in order if n.endswith(".big")]
        assert sorted(small_calls) == sorted(n for n in order if n.endswith(".small"))
        assert sorted(submitted) == sorted(bigs) and ahead.hits == len(bigs) - 1
        assert ahead.wasted_bytes == 0 and reader.bytes_read == sum(map(size_of, names))
        ahead.close()
    reader = _ferry.TensorReader(checkpoint)
    ahead = _read_ahead.ReadAhead(reader, names, "cpu", size_of, lambda name, size: size < 1024,
                                  lambda name, size: _open.small_read(reader, name, [(0, size)], size, "cpu"))
    ahead.take(names[0], size_of(names[0]))
    ahead.take(names[1], size_of(names[1]))  # in order: large ones ahead are in flight
    assert ahead._pending_bytes > 0
    stray = next(n for n in reversed(names) if n.endswith(".small"))
    assert ahead.take(stray, size_of(stray)).numpy().tobytes() == as_bytes(tensors[stray])
    assert ahead._pending_bytes == 0 and ahead.wasted_bytes > 0
    ahead.close()


def test_read_ahead_finds_a_large_tensor_before_a_run_of_small_ones_it_skipped(tmp_path):
    """Refills skip runs of small names already looked at; a jump back to before such a run
    still finds the large tensor there and reads it ahead."""
    from ferry import _ferry, _open, _read_ahead

    generator = torch.Generator().manual_seed(10)
    tensors = {f"n{i:02d}": torch.rand((64, 64) if i == 5 else (7,), generator=generator) for i in range(40)}
    path = tmp_path / "runs.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    names = checkpoint.names()
    assert names == sorted(tensors)
    size_of = lambda name: checkpoint.tensor(name)[2]  # noqa: E731
    reader = _ferry.TensorReader(checkpoint)
    ahead = _read_ahead.ReadAhead(reader, names, "cpu", size_of, lambda name, size: size < 1024,
                                  lambda name, size: _open.small_read(reader, name, [(0, size)], size, "cpu"))
    for name in names[20:24] + names[0:8]:  # a run of small ones, then back to the start
        assert ahead.take(name, size_of(name)).numpy().tobytes() == as_bytes(tensors[name]), name
    assert ahead.hits == 1 and ahead.wasted_bytes == 0  # n05, read ahead from n01's refill
    assert reader.bytes_read == sum(size_of(n) for n in names[20:24] + names[0:8])
    ahead.close()
