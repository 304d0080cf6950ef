"""ferry as a drop-in for safetensors' loading API: names, devices, backends, closed handles,
metadata, load(bytes), slicing rules and errors, spec conformance on hand-made files, per-key
reads that hold their files, numpy's extension dtypes, tied weights (per-key reads to the GPU,
threads sharing a handle and read-ahead: test_dropin_reads.py)."""
import os
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
from dropin_helpers import as_bytes, entry, raw_file


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
