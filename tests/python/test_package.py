"""The Python package against Hugging Face's safetensors: same tensors, no copies, clear errors."""
import gc
import json
import os
import threading

import numpy as np
import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import safetensors
import torch

import ferry
import ferry.numpy
import ferry.torch
from safetensors.torch import load_file as st_load_file

from conftest import DTYPES, write_safetensors

def torch_has(spec_dtype: str) -> bool:
    """Whether this torch build has the dtype (old torch lacks the float8 and float4 types)."""
    return hasattr(torch, spec_dtype)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact: dtype, shape and bytes (torch.equal says NaN != NaN in random bf16)."""
    return a.dtype == b.dtype and a.shape == b.shape and as_bytes(a) == as_bytes(b)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture
def every_dtype(tmp_path):
    """Every dtype this torch build has (old torch lacks the unsigned, float8 and float4 ones)."""
    tensors = {f"t_{d}": (d, [3, 8]) for d in DTYPES if torch_has(d)}
    tensors["empty"] = ("float32", [0, 5])
    tensors["scalar"] = ("int64", [])
    return write_safetensors(tmp_path / "all.safetensors", tensors, {"format": "pt"}, seed=3)


@pytest.fixture
def shards(tmp_path):
    weight_map = {}
    for i in range(3):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        tensors = {f"layer{i}.w{j}": ("bfloat16", [16 + j, 33]) for j in range(4)}
        write_safetensors(tmp_path / name, tensors, {"format": "pt"}, seed=10 + i)
        weight_map.update({t: name for t in tensors})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return tmp_path


def test_load_file_equals_safetensors_for_every_dtype(every_dtype):
    ours = ferry.torch.load_file(every_dtype)
    theirs = st_load_file(str(every_dtype))
    reference = dict(safetensors.deserialize(every_dtype.read_bytes()))
    assert set(ours) == set(reference)
    for name, info in reference.items():
        t = ours[name]
        assert as_bytes(t) == bytes(info["data"]), name
        assert t.dtype == theirs[name].dtype and list(t.shape) == list(theirs[name].shape), name


def test_dtypes_this_torch_lacks_raise_type_error(tmp_path):
    missing = [d for d in DTYPES if not torch_has(d)]
    if not missing:
        pytest.skip(f"torch {torch.__version__} has every dtype")
    path = write_safetensors(tmp_path / "m.safetensors", {"x": (missing[0], [4])})
    with pytest.raises(TypeError, match=DTYPES[missing[0]][0]):
        ferry.torch.load_file(path)


def test_sharded_directory_and_index(shards):
    for path in (shards, shards / "model.safetensors.index.json"):
        ours = ferry.torch.load_file(path)
        assert len(ours) == 12
        for i in range(3):
            theirs = st_load_file(str(shards / f"model-{i + 1:05d}-of-00003.safetensors"))
            for name, t in theirs.items():
                assert ours[name].dtype == torch.bfloat16
                assert same(ours[name], t), name


def test_tensors_are_views_that_keep_memory_alive(tmp_path):
    path = write_safetensors(tmp_path / "big.safetensors",
                             {"a": ("uint8", [64 << 20]), "b": ("uint8", [64 << 20])}, seed=5)
    expected = bytes(dict(safetensors.deserialize(path.read_bytes()))["b"]["data"][:4096])
    ferry.torch.load_file(path)  # a first load: its staging stays kept, and is counted in `before`
    gc.collect()
    before = rss_bytes()
    tensors = ferry.torch.load_file(path)
    b = tensors["b"]
    del tensors
    gc.collect()
    # The dict is gone; b still views the loaded memory, which must still be there and intact.
    assert rss_bytes() - before > 100 << 20
    assert as_bytes(b[:4096]) == expected
    del b
    gc.collect()
    assert rss_bytes() - before < 32 << 20, "memory freed when the last tensor died"


def test_loaded_tensors_can_be_saved_again_by_safetensors(every_dtype, tmp_path):
    """Each tensor is its own storage, as with safetensors: a writer that refuses tensors sharing
    memory accepts what ferry loaded, and writes the same bytes back."""
    from safetensors.torch import save_file
    loaded = ferry.torch.load_file(every_dtype)
    storages = [t.storage().data_ptr() for t in loaded.values() if t.numel()]
    assert len(set(storages)) == len(storages)
    save_file(loaded, tmp_path / "again.safetensors")
    again = st_load_file(tmp_path / "again.safetensors")
    for name, tensor in loaded.items():
        assert same(again[name], tensor), name


def test_safe_open_keys_metadata_tensors_and_slices(every_dtype, shards):
    with ferry.safe_open(every_dtype, framework="pt") as f:
        assert f.keys() == sorted(dict(safetensors.deserialize(every_dtype.read_bytes())))
        assert f.metadata() == {"format": "pt"}
        assert as_bytes(f.get_tensor("t_int32")) == bytes(
            dict(safetensors.deserialize(every_dtype.read_bytes()))["t_int32"]["data"])
    name = "layer1.w2"
    file = shards / "model-00002-of-00003.safetensors"
    with ferry.safe_open(shards, framework="pt") as ours, safetensors.safe_open(str(file), framework="pt") as theirs:
        s = ours.get_slice(name)
        assert s.get_shape() == [18, 33] and s.get_dtype() == "BF16"
        for index in [slice(2, 9), (slice(None), slice(5, 20)), (slice(1, 3), 4)]:
            assert same(s[index], theirs.get_slice(name)[index]), index
    with ferry.safe_open(every_dtype, framework="np") as f:
        array = f.get_tensor("t_float32")
        assert array.dtype == np.float32 and array.shape == (3, 8)
        assert array.tobytes() == bytes(dict(safetensors.deserialize(every_dtype.read_bytes()))["t_float32"]["data"])
    with pytest.raises(KeyError):
        ferry.safe_open(every_dtype).get_tensor("nope")


def test_numpy_load_file_equals_safetensors(tmp_path):
    path = write_safetensors(tmp_path / "np.safetensors",
                             {"a": ("float32", [7, 3]), "b": ("int16", [5]), "c": ("bool", [4])}, seed=8)
    import safetensors.numpy as stn

    ours, theirs = ferry.numpy.load_file(path), stn.load_file(str(path))
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape
        assert ours[name].tobytes() == theirs[name].tobytes(), name
    # BF16, F8 and F4, with ml_dtypes and without: test_dropin.py.


def test_iterate_weights_streams_every_tensor_in_groups(shards):
    expected = ferry.torch.load_file(shards)
    seen = {}
    for name, tensor in ferry.torch.iterate_weights([shards], group_bytes=2000):
        assert name not in seen
        seen[name] = tensor
    assert set(seen) == set(expected)
    for name, tensor in seen.items():
        assert same(tensor, expected[name]), name


def test_load_into_fills_parameters_in_place(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4, bias=False))
    source = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4, bias=False))
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    stats = ferry.torch.load_into(model, path)
    assert stats["missing"] == [] and stats["unexpected"] == []
    for k, v in model.state_dict().items():
        assert v.data_ptr() == pointers[k], "no second allocation"
        assert same(v, source.state_dict()[k]), k
    wrong = {"0.weight": torch.zeros(8, 16, dtype=torch.float64)}
    with pytest.raises(ValueError, match="0.weight"):
        ferry.torch.load_into(wrong, path, strict=False)
    with pytest.raises(RuntimeError, match='Missing key.*"extra"'):
        ferry.torch.load_into({"extra": torch.zeros(1)}, path)


def test_progress_and_stats_with_the_gil_released(shards):
    calls = []
    ticks = []
    stop = threading.Event()

    def spin():  # runs only if the load releases the GIL
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.0001)

    spinner = threading.Thread(target=spin)
    spinner.start()
    tensors, stats = ferry.torch.load_with_stats(shards, progress=lambda done, total: calls.append((done, total)),
                                      chunk_bytes=4096, threads=2)
    stop.set()
    spinner.join()
    assert calls and calls[-1][0] == calls[-1][1] == stats["bytes_read"]
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert stats["tensor_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert {f["io_path"] for f in stats["files"]} <= {"odirect", "buffered"}
    assert all(f["reason"] for f in stats["files"])
    assert ticks


def test_errors_are_python_exceptions(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        ferry.torch.load_file(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\0\0\0\0\0\0\0{bad}")
    with pytest.raises(ValueError, match="bad.safetensors"):
        ferry.torch.load_file(bad)
    good = write_safetensors(tmp_path / "g.safetensors", {"a": ("uint8", [4])})
    with pytest.raises(ValueError, match="gpu7"):
        ferry.torch.load_file(good, device="gpu7")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            ferry.torch.load_file(good, device="cuda:0")
