"""ferry as a drop-in for safetensors' loading API: names, devices, backends, closed handles,
metadata, load(bytes), slicing rules and errors, spec conformance on hand-made files, per-key
reads that hold their files, numpy's extension dtypes, tied weights."""
import json
import os
import struct
import sys

import numpy as np
import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import ferry
import ferry.numpy
import ferry.torch
from conftest import write_safetensors


def raw_file(path, header: dict, data: bytes, pad: bytes = b""):
    text = json.dumps(header).encode() + pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def entry(dtype, shape, begin, end, **extra):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end], **extra}


def as_bytes(t) -> bytes:
    if isinstance(t, np.ndarray):
        return t.tobytes()
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture
def small(tmp_path):
    tensors = {"a": torch.arange(60, dtype=torch.float32).reshape(10, 6),
               "b": torch.arange(24, dtype=torch.int16).reshape(2, 3, 4),
               "s": torch.tensor(3.5, dtype=torch.float64), "e": torch.zeros((0, 3))}
    path = tmp_path / "small.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"k": "v"})
    return path, tensors


def test_framework_names_devices_and_backends(small):
    path, tensors = small
    for framework in ("pt", "torch", "pytorch", "np", "numpy"):
        for backend in ("mmap", "pread"):
            with ferry.safe_open(path, framework, backend=backend) as f:
                assert as_bytes(f.get_tensor("a")) == as_bytes(tensors["a"])
    for device in ("cpu", torch.device("cpu"), None):
        with ferry.safe_open(path, "pt", device=device) as f:
            assert f.get_tensor("b").device.type == "cpu"
    for framework, message in [("tf", "not supported by ferry"), ("flax", "not supported"),
                               ("caffe", "framework caffe is invalid")]:
        with pytest.raises(ferry.SafetensorError, match=message):
            ferry.safe_open(path, framework)
    with pytest.raises(ferry.SafetensorError, match='backend "mapped" is invalid'):
        ferry.safe_open(path, "pt", backend="mapped")
    with pytest.raises(ferry.SafetensorError, match="device gpu7 is invalid"):
        ferry.safe_open(path, "pt", device="gpu7")
    with pytest.raises(ferry.SafetensorError, match="not supported for framework numpy"):
        ferry.safe_open(path, "np", device="cuda:0")
    assert issubclass(ferry.SafetensorError, ValueError)
    with pytest.raises(FileNotFoundError, match="No such file or directory: nothing.safetensors"):
        ferry.safe_open("nothing.safetensors", "pt")


def test_handle_methods_after_close(small):
    path, tensors = small
    with ferry.safe_open(path, "pt") as f:
        part = f.get_slice("a")
        assert f.keys() == ["a", "b", "e", "s"]
        assert f.offset_keys() == list(safetensors.safe_open(str(path), "pt").offset_keys())
        assert f.metadata() == {"k": "v"}
        assert set(f.get_tensors()) == set(tensors)
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("a"),
                 lambda: f.get_slice("a")):
        with pytest.raises(ferry.SafetensorError, match="File is closed"):
            call()
    assert torch.equal(part[2:4], tensors["a"][2:4])  # a slice outlives its handle, as in safetensors


def test_metadata_absent_empty_and_present(tmp_path):
    none = raw_file(tmp_path / "none.safetensors", {"x": entry("U8", [1], 0, 1)}, b"\x01")
    empty = raw_file(tmp_path / "empty.safetensors", {"__metadata__": {}, "x": entry("U8", [1], 0, 1)}, b"\x01")
    for path, want in [(none, None), (empty, {})]:
        assert safetensors.safe_open(str(path), "np").metadata() == want
        assert ferry.safe_open(path, "np").metadata() == want


def test_missing_tensor_is_safetensor_error_and_key_error(small):
    with ferry.safe_open(small[0], "pt") as f:
        for call in (f.get_tensor, f.get_slice):
            with pytest.raises(ferry.SafetensorError, match="File does not contain tensor nope"):
                call("nope")
            with pytest.raises(KeyError):
                call("nope")


def test_load_bytes_equals_safetensors(small):
    path, _ = small
    data = path.read_bytes()
    for ours, theirs in [(ferry.torch.load(data), safetensors.torch.load(data)),
                         (ferry.numpy.load(data), safetensors.numpy.load(data))]:
        assert set(ours) == set(theirs)
        for name in theirs:
            assert as_bytes(ours[name]) == as_bytes(theirs[name]), name
            assert tuple(ours[name].shape) == tuple(theirs[name].shape)
    arrays = ferry.numpy.load(data)
    arrays["a"][0, 0] = 7  # writable, and its own memory
    assert ferry.numpy.load(data)["a"][0, 0] == 0
    with pytest.raises(TypeError, match="load_with_stats"):
        ferry.torch.load(str(path))
    with pytest.raises(ferry.SafetensorError):
        ferry.torch.load(data[:-1])
    tensors, stats = ferry.torch.load_with_stats(path)
    assert stats["tensor_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())


def test_numpy_arrays_are_writable(small):
    path, _ = small
    for arrays in (ferry.numpy.load_file(path), ferry.safe_open(path, "np").get_tensors(),
                   {"a": ferry.safe_open(path, "np").get_tensor("a")}):
        arrays["a"][1, 1] = -1.0
        assert arrays["a"][1, 1] == -1.0


# safetensors' own rules for numpy and the pread backend: the same results and the same errors.
NUMPY_INDICES = [slice(None), (), slice(2, 7), (slice(None), slice(1, 4)), (0, slice(None, 2)),
                 (slice(2, None), -1), (slice(None, None, 3),), (Ellipsis, 2), [], (1, Ellipsis),
                 (slice(2, None), -7), [0, 1], (slice(2, None), 20), slice(None, 20),
                 (slice(None), slice(None, 20)), (slice(None, None, 0),), (Ellipsis, Ellipsis),
                 (1, 2, 3), "x"]


@pytest.mark.parametrize("framework,backend", [("np", "mmap"), ("pt", "pread")])
def test_slices_follow_safetensors_rules(small, framework, backend):
    path, _ = small
    with safetensors.safe_open(str(path), framework, backend=backend) as theirs, \
            ferry.safe_open(path, framework, backend=backend) as ours:
        for index in NUMPY_INDICES:
            try:
                want = theirs.get_slice("a")[index]
            except Exception as e:  # noqa: BLE001 - the error itself is what is compared
                with pytest.raises(Exception) as got:
                    ours.get_slice("a")[index]
                assert str(got.value) == str(e), index
                assert isinstance(got.value, ferry.SafetensorError) == isinstance(e, safetensors.SafetensorError)
                continue
            got = ours.get_slice("a")[index]
            assert tuple(got.shape) == tuple(want.shape) and as_bytes(got) == as_bytes(want), index


TORCH_INDICES = [slice(None), slice(2, 7), (slice(None), slice(1, 4)), (0, slice(None, 2)),
                 (slice(2, None), -1), slice(-3, None), slice(None, 20), (slice(None, None, 3), 1),
                 (Ellipsis, 2), -1, (slice(8, 2),), [0, 3], (None, 1)]


def test_torch_slices_follow_torch_rules(small):
    path, tensors = small
    with ferry.safe_open(path, "pt") as f:
        for index in TORCH_INDICES:
            got, want = f.get_slice("a")[index], tensors["a"][index]
            assert got.shape == want.shape and as_bytes(got) == as_bytes(want), index
        assert torch.equal(f.get_slice("s")[()], tensors["s"])


@pytest.mark.parametrize("framework,backend", [("pt", "mmap"), ("pt", "pread"), ("np", "mmap")])
def test_slices_read_only_their_bytes(tmp_path, framework, backend):
    """Row blocks read their rows; column blocks (tensor parallelism's other split) read only
    each row's part; bytes_read counts what the files gave."""
    weights = torch.arange(1000 * 16, dtype=torch.float32).reshape(1000, 16)
    wide = torch.arange(64 * 512, dtype=torch.float32).reshape(64, 512)
    path = tmp_path / "rows.safetensors"
    safetensors.torch.save_file({"w": weights, "wide": wide}, str(path))
    with ferry.safe_open(path, framework, backend=backend) as f:
        cases = [("w", (slice(500, 750),), 250 * 64), ("w", (3, slice(2, 5)), 3 * 4),
                 ("wide", (slice(None), slice(0, 256)), 64 * 256 * 4),
                 ("wide", (slice(10, 20), slice(256, 512)), 10 * 256 * 4),
                 ("wide", (slice(None), slice(0, 512, 2)), 64 * 512 * 4)]  # tiny ranges: rows
        for name, index, want_bytes in cases:
            before = f.stats()["bytes_read"]
            part = f.get_slice(name)[index]
            want = (weights if name == "w" else wide)[index]
            assert as_bytes(part) == as_bytes(want), index
            assert tuple(part.shape) == tuple(want.shape), index
            assert f.stats()["bytes_read"] - before == want_bytes, index


def test_get_tensor_equals_safetensors_for_every_dtype(tmp_path):
    dtypes = {f"t_{d}": (d, [3, 8]) for d in ("bool", "uint8", "int8", "int16", "int32", "int64",
                                                  "float16", "bfloat16", "float32", "float64",
                                                  "complex64")}
    path = write_safetensors(tmp_path / "d.safetensors", dtypes, seed=4)
    with ferry.safe_open(path, "pt") as ours, safetensors.safe_open(str(path), "pt") as theirs:
        for name in theirs.keys():
            got, want = ours.get_tensor(name), theirs.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert as_bytes(got) == as_bytes(want), name


def test_a_handle_reads_the_file_it_opened(tmp_path):
    """save_file, hub downloads and git replace files by rename: a handle keeps reading the file
    it opened, as safetensors' mapping does."""
    path = tmp_path / "m.safetensors"
    first = {"w": torch.arange(4096, dtype=torch.int32)}
    safetensors.torch.save_file(first, str(path))
    with ferry.safe_open(path, "pt") as f:
        safetensors.torch.save_file({"w": -torch.arange(4096, dtype=torch.int32)}, str(tmp_path / "new"))
        os.replace(tmp_path / "new", path)
        assert torch.equal(f.get_tensor("w"), first["w"])
        assert torch.equal(f.get_slice("w")[10:20], first["w"][10:20])


# ---------------------------------------------------------------------------------------------
# The format as safetensors reads it, on hand-made files

def both_refuse(path, word):
    with pytest.raises(safetensors.SafetensorError):
        safetensors.safe_open(str(path), "pt")
    with pytest.raises(ferry.SafetensorError, match=word):
        ferry.safe_open(path, "pt")
    with pytest.raises(ValueError, match=word):
        ferry.torch.load_file(path)


def test_holes_nul_padding_and_trailing_bytes_are_refused(tmp_path):
    both_refuse(raw_file(tmp_path / "hole_first.safetensors", {"a": entry("U8", [2], 2, 4)}, bytes(4)),
                "has a hole")
    both_refuse(raw_file(tmp_path / "hole_between.safetensors",
                         {"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 3, 5)}, bytes(5)),
                "has a hole")
    both_refuse(raw_file(tmp_path / "nul.safetensors", {"a": entry("U8", [2], 0, 2)}, b"ab",
                         pad=b"\0" * 6), "NUL byte")
    both_refuse(raw_file(tmp_path / "html.safetensors", {"a": entry("U8", [2], 0, 2)},
                         b"ab<html></html>"), "not zero")
    both_refuse(raw_file(tmp_path / "long.safetensors", {"a": entry("U8", [2], 0, 2)},
                         b"ab" + bytes(4097)), "4097 bytes follow")


def test_what_safetensors_accepts_ferry_accepts(tmp_path):
    extra = raw_file(tmp_path / "extra.safetensors",
                     {"a": entry("U8", [2], 0, 2, strides=[1], note="x")}, b"ab")
    spaces = raw_file(tmp_path / "spaces.safetensors", {"a": entry("U8", [2], 0, 2)}, b"ab", pad=b"   \n")
    for path in (extra, spaces):
        assert safetensors.safe_open(str(path), "pt").get_tensor("a").tolist() == [97, 98]
        assert ferry.safe_open(path, "pt").get_tensor("a").tolist() == [97, 98]
        assert ferry.torch.load_file(path)["a"].tolist() == [97, 98]


def test_zero_padding_after_the_last_tensor_is_ferrys_one_difference(tmp_path):
    path = raw_file(tmp_path / "pad.safetensors", {"a": entry("U8", [2], 0, 2)}, b"ab" + bytes(64))
    with pytest.raises(safetensors.SafetensorError):
        safetensors.safe_open(str(path), "pt")
    assert ferry.safe_open(path, "pt").get_tensor("a").tolist() == [97, 98]


# ---------------------------------------------------------------------------------------------
# numpy's extension dtypes

EXTENSION = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
             "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
             "float8_e8m0fnu": "float8_e8m0fnu"}


def test_numpy_extension_dtypes_through_ml_dtypes(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    tensors = {name: (name, [3, 4]) for name in EXTENSION}
    tensors["f4"] = ("float4_e2m1fn_x2", [3, 2])
    path = write_safetensors(tmp_path / "x.safetensors", tensors, seed=9)
    reference = dict(safetensors.deserialize(path.read_bytes()))
    arrays = ferry.numpy.load_file(path)
    with ferry.safe_open(path, "np") as f:
        for name, attr in EXTENSION.items():
            for array in (arrays[name], f.get_tensor(name)):
                assert array.dtype == np.dtype(getattr(ml_dtypes, attr)) and array.shape == (3, 4)
                assert array.tobytes() == bytes(reference[name]["data"]), name
        packed = np.frombuffer(bytes(reference["f4"]["data"]), np.uint8)
        for array in (arrays["f4"], f.get_tensor("f4")):
            assert array.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and array.shape == (3, 4)
            nibbles = array.view(np.uint8).reshape(-1)
            assert (nibbles[0::2] == packed & 0xF).all() and (nibbles[1::2] == packed >> 4).all()


def test_numpy_extension_dtypes_without_ml_dtypes_name_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
    path = write_safetensors(tmp_path / "bf.safetensors", {"x": ("bfloat16", [2])})
    for call in (lambda: ferry.numpy.load_file(path), lambda: ferry.safe_open(path, "np").get_tensor("x"),
                 lambda: ferry.numpy.load(path.read_bytes())):
        with pytest.raises(TypeError, match="BF16 needs the ml_dtypes package"):
            call()


# ---------------------------------------------------------------------------------------------
# Tied weights

class Tied(torch.nn.Module):
    """transformers' tie_word_embeddings: lm_head.weight is embed.weight."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.lm_head = torch.nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.embed.weight


def test_load_into_fills_tied_weights_once(tmp_path):
    source = Tied()
    state = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    path = tmp_path / "tied.safetensors"
    safetensors.torch.save_file(state, str(path))  # as transformers saves a tied model
    model = Tied()
    stats = ferry.torch.load_into(model, path)
    assert stats["missing"] == [] and stats["unexpected"] == []
    assert model.lm_head.weight.data_ptr() == model.embed.weight.data_ptr()
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    # The file naming the tied tensor by its other name fills it just the same.
    safetensors.torch.save_file({"lm_head.weight": source.embed.weight.detach().clone(),
                                 "norm.weight": source.norm.weight.detach(),
                                 "norm.bias": source.norm.bias.detach()}, str(tmp_path / "other.safetensors"))
    model = Tied()
    assert ferry.torch.load_into(model, tmp_path / "other.safetensors")["missing"] == []
    assert torch.equal(model.embed.weight, source.embed.weight)


def test_load_into_reports_missing_and_unexpected_like_load_state_dict(tmp_path):
    path = tmp_path / "part.safetensors"
    safetensors.torch.save_file({"norm.weight": torch.ones(8), "extra": torch.zeros(2)}, str(path))
    stats = ferry.torch.load_into(Tied(), path, strict=False)
    assert stats["missing"] == ["embed.weight", "lm_head.weight", "norm.bias"]
    assert stats["unexpected"] == ["extra"]
    with pytest.raises(RuntimeError) as error:
        ferry.torch.load_into(Tied(), path)
    torch_error = pytest.raises(RuntimeError, Tied().load_state_dict,
                                safetensors.torch.load_file(str(path))).value
    for line in str(torch_error).splitlines()[1:]:
        assert line.strip().split(":")[0] in str(error.value)
    assert '"extra"' in str(error.value) and '"norm.bias"' in str(error.value)


def test_load_model_with_tied_weights(tmp_path):
    source = Tied()
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_model(source, str(path))
    model = Tied()
    assert ferry.torch.load_model(model, path) == (set(), [])
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


# ---------------------------------------------------------------------------------------------
# GPU (skipped without one)

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
