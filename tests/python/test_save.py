"""ferry's saver against Hugging Face's safetensors: the same bytes for the same tensors and
metadata (every dtype, 0-dim and empty tensors), round trips through both libraries, the same
errors for bad input, and failures that leave no partial file."""
import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

from ferry import _ferry  # noqa: E402
from ferry._save import SafetensorError  # noqa: E402

# safetensors' TensorSpec dtype name -> header name, with bits per element
DTYPES = {
    "bool": ("BOOL", 8), "uint8": ("U8", 8), "int8": ("I8", 8), "uint16": ("U16", 16), "int16": ("I16", 16),
    "uint32": ("U32", 32), "int32": ("I32", 32), "uint64": ("U64", 64), "int64": ("I64", 64),
    "float16": ("F16", 16), "bfloat16": ("BF16", 16), "float32": ("F32", 32), "float64": ("F64", 64),
    "complex64": ("C64", 64), "float8_e4m3fn": ("F8_E4M3", 8), "float8_e4m3fnuz": ("F8_E4M3FNUZ", 8),
    "float8_e5m2": ("F8_E5M2", 8), "float8_e5m2fnuz": ("F8_E5M2FNUZ", 8), "float8_e8m0fnu": ("F8_E8M0", 8),
    "float4_e2m1fn_x2": ("F4", 4),
}

SHAPES = [[], [0], [3, 0, 2], [5], [4, 6], [2, 3, 8]]


def _specs(seed=0):
    """Every dtype in every shape, with random bytes: (name, spec dtype, header dtype, shape, data)."""
    rng = np.random.default_rng(seed)
    out = []
    for dtype, (header, bits) in DTYPES.items():
        for i, shape in enumerate(SHAPES):
            count = int(np.prod(shape)) if shape else 1
            if bits == 4 and count % 2:
                continue  # F4 needs whole bytes
            data = rng.integers(0, 256, size=count * bits // 8, dtype=np.uint8)
            out.append((f"{dtype}.{i}", dtype, header, shape, data))
    return out


def _theirs(specs, metadata):
    tensors = {}
    for name, dtype, _, shape, data in specs:
        # TensorSpec doubles the last dim of F4 (it takes torch's storage shape)
        spec_shape = shape[:-1] + [shape[-1] // 2] if dtype == "float4_e2m1fn_x2" and shape else shape
        tensors[name] = safetensors.TensorSpec(dtype=dtype, shape=spec_shape, data_ptr=data.ctypes.data,
                                               data_len=data.nbytes)
    return tensors


def _ours(specs):
    return [(name, header, shape, data.ctypes.data if data.nbytes else 0, data.nbytes, "cpu")
            for name, _, header, shape, data in specs]


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}, {"ünï": "cödé \"q\" \\ \n\t\x01"}])
def test_every_dtype_and_shape_gives_safetensors_bytes(tmp_path, metadata):
    specs = _specs()
    expected = bytes(safetensors.serialize(_theirs(specs, metadata), metadata=metadata))
    pairs = list(metadata.items()) if metadata is not None else None
    assert _ferry.save_bytes(_ours(specs), pairs) == expected
    _ferry.save_file(str(tmp_path / "f.safetensors"), _ours(specs), pairs)
    assert (tmp_path / "f.safetensors").read_bytes() == expected
    safetensors.serialize_file(_theirs(specs, metadata), str(tmp_path / "s.safetensors"), metadata=metadata)
    assert (tmp_path / "s.safetensors").read_bytes() == expected


def test_one_dtype_at_a_time_and_empty_file(tmp_path):
    for dtype in DTYPES:
        specs = [s for s in _specs(seed=len(dtype)) if s[1] == dtype]
        assert _ferry.save_bytes(_ours(specs), None) == bytes(safetensors.serialize(_theirs(specs, None)))
    assert _ferry.save_bytes([], None) == bytes(safetensors.serialize({}))
    # No tensors with empty metadata: safetensors 0.8.0 writes `{},"__metadata__":{}}` (not JSON,
    # which no reader accepts); ferry writes the header the format means.
    assert _ferry.save_bytes([], []) == struct.pack("<Q", 24) + b'{"__metadata__":{}}     '
    assert _ferry.save_bytes([], [("a", "b")]) == bytes(safetensors.serialize({}, metadata={"a": "b"}))


def _split(data: bytes):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n], object_pairs_hook=list), n, data[8 + n:]


def test_metadata_keys_in_dict_order_the_rest_identical():
    """safetensors' order of two or more metadata keys is a Rust hash map's (changes per process);
    ferry keeps the dict's. Everything else is identical."""
    specs = _specs(seed=5)
    metadata = {"format": "pt", "z": "1", "a": "2", "m": "3"}
    ours = _ferry.save_bytes(_ours(specs), list(metadata.items()))
    theirs = bytes(safetensors.serialize(_theirs(specs, metadata), metadata=metadata))
    (our_header, our_n, our_data), (their_header, their_n, their_data) = _split(ours), _split(theirs)
    assert our_n == their_n and our_data == their_data
    assert our_header[0] == ("__metadata__", list(metadata.items()))
    assert dict(their_header[0][1]) == metadata
    assert our_header[1:] == their_header[1:]


def test_large_file_through_many_pieces_equals_safetensors(tmp_path):
    rng = np.random.default_rng(9)
    arrays = {f"t{i}": rng.integers(0, 256, size=(3 << 20) + 17 * i, dtype=np.uint8) for i in range(5)}
    arrays["f"] = rng.standard_normal(100_001).astype(np.float32)
    import safetensors.numpy

    import ferry.numpy

    expected = safetensors.numpy.save(arrays, metadata={"k": "v"})
    for staging, piece in [(1 << 20, 64 << 10), (8192, 4096), (256 << 20, 16 << 20)]:
        path = tmp_path / "big.safetensors"
        stats = ferry.numpy.write_file(arrays, path, {"k": "v"}, staging_bytes=staging, piece_bytes=piece,
                                       writer_threads=3)
        assert path.read_bytes() == expected, (staging, piece)
        assert stats["file_bytes"] == len(expected)
        assert stats["io_path"] in ("direct", "buffered") and stats["io_reason"]
        assert stats["staging_bytes"] <= max(staging, 2 * piece)
    assert sorted(os.listdir(tmp_path)) == ["big.safetensors"]


# ---- torch -------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
import safetensors.torch  # noqa: E402

import ferry.torch  # noqa: E402


def _torch_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {
        "f32": torch.randn(7, 5, generator=g),
        "f16": torch.randn(3, 4, generator=g).half(),
        "bf16": torch.randn(33, generator=g).bfloat16(),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.randint(-1000, 1000, (9,), generator=g),
        "i32": torch.randint(-1000, 1000, (2, 3), generator=g).int(),
        "i16": torch.randint(-1000, 1000, (4,), generator=g).short(),
        "i8": torch.randint(-100, 100, (4,), generator=g).to(torch.int8),
        "u8": torch.randint(0, 255, (6,), generator=g).to(torch.uint8),
        "bool": torch.rand(5, generator=g) > 0.5,
        "c64": torch.randn(3, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "empty_bf16": torch.zeros(2, 0, dtype=torch.bfloat16),
    }
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        if hasattr(torch, name):  # torch >= 2.1
            out[name] = torch.randn(10, generator=g).to(getattr(torch, name))
    for name in ("uint16", "uint32", "uint64"):
        if hasattr(torch, name):  # torch >= 2.3
            out[name] = torch.randint(0, 100, (10,), generator=g).to(getattr(torch, name))
    return out


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}])
def test_torch_save_and_save_file_equal_safetensors(tmp_path, metadata):
    tensors = _torch_tensors()
    expected = safetensors.torch.save(tensors, metadata=metadata)
    assert ferry.torch.save(tensors, metadata=metadata) == expected
    assert ferry.torch.save_file(tensors, tmp_path / "f.safetensors", metadata=metadata) is None
    assert (tmp_path / "f.safetensors").read_bytes() == expected
    safetensors.torch.save_file(tensors, str(tmp_path / "s.safetensors"), metadata=metadata)
    assert (tmp_path / "s.safetensors").read_bytes() == expected


def test_torch_round_trips_through_both_libraries(tmp_path):
    tensors = _torch_tensors(seed=3)
    ferry.torch.save_file(tensors, tmp_path / "ferry.safetensors", {"format": "pt"})
    back = safetensors.torch.load_file(str(tmp_path / "ferry.safetensors"))
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    safetensors.torch.save_file(tensors, str(tmp_path / "st.safetensors"))
    ours = ferry.torch.load_file(tmp_path / "st.safetensors")
    for name, tensor in tensors.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    again = ferry.torch.load_file(tmp_path / "ferry.safetensors")
    assert all(torch.equal(again[n], t) for n, t in tensors.items())


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["not_dict", "not_tensor", "shared", "slice_of_other", "non_contiguous",
                                  "sparse", "key_not_str", "metadata_value", "metadata_key", "metadata_not_dict"])
def test_torch_errors_match_safetensors(tmp_path, case):
    base = torch.zeros(4, 4)
    tensors, metadata = {"a": torch.zeros(2)}, None
    if case == "not_dict":
        tensors = [torch.zeros(2)]
    elif case == "not_tensor":
        tensors = {"a": [1, 2]}
    elif case == "shared":
        tensors = {"a": base, "b": base}
    elif case == "slice_of_other":
        tensors = {"a": base, "b": base[1]}
    elif case == "non_contiguous":
        tensors = {"a": base.t()}
    elif case == "sparse":
        tensors = {"a": torch.eye(3).to_sparse()}
    elif case == "key_not_str":
        tensors = {1: torch.zeros(2)}
    elif case == "metadata_value":
        metadata = {"a": 1}
    elif case == "metadata_key":
        metadata = {1: "a"}
    elif case == "metadata_not_dict":
        metadata = "x"
    theirs = _error(lambda: safetensors.torch.save(tensors, metadata=metadata))
    ours = _error(lambda: ferry.torch.save(tensors, metadata=metadata))
    assert ours[0] is theirs[0]
    if case not in ("shared", "slice_of_other"):  # the sets of names print in hash order
        assert ours[1] == theirs[1]
    ours_file = _error(lambda: ferry.torch.save_file(tensors, tmp_path / "x.safetensors", metadata=metadata))
    assert ours_file[0] is theirs[0]
    assert os.listdir(tmp_path) == []


def test_unsupported_dtype_is_a_safetensor_error(tmp_path):
    with pytest.raises(SafetensorError, match="complex128"):
        ferry.torch.save({"a": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(SafetensorError, match="complex128"):
        ferry.numpy.save({"a": np.zeros(2, np.complex128)})


# ---- numpy -------------------------------------------------------------------------------------

import safetensors.numpy  # noqa: E402

import ferry.numpy  # noqa: E402


def test_numpy_save_equals_safetensors_and_round_trips(tmp_path):
    rng = np.random.default_rng(4)
    arrays = {
        "f32": rng.standard_normal((4, 3)).astype(np.float32), "f64": rng.standard_normal(5),
        "f16": rng.standard_normal(7).astype(np.float16), "i64": rng.integers(-9, 9, 4),
        "u16": rng.integers(0, 9, 3).astype(np.uint16), "bool": rng.random(5) > 0.5,
        "c64": (rng.standard_normal(3) + 1j).astype(np.complex64), "scalar": np.array(3, np.int32),
        "empty": np.zeros((0, 2), np.uint8), "big_endian": np.arange(6, dtype=">i4"),
    }
    for metadata in (None, {}, {"format": "np"}):
        expected = safetensors.numpy.save(arrays, metadata=metadata)
        assert ferry.numpy.save(arrays, metadata=metadata) == expected
        ferry.numpy.save_file(arrays, tmp_path / "n.safetensors", metadata=metadata)
        assert (tmp_path / "n.safetensors").read_bytes() == expected
    back = safetensors.numpy.load_file(str(tmp_path / "n.safetensors"))
    for name, array in arrays.items():
        assert np.array_equal(back[name], array), name


def test_numpy_non_contiguous_is_refused_not_written_as_raw_memory(tmp_path):
    # safetensors writes a transposed array's memory order (not its values); ferry refuses.
    with pytest.raises(ValueError, match="non contiguous"):
        ferry.numpy.save_file({"t": np.arange(6, dtype=np.float32).reshape(2, 3).T}, tmp_path / "t.safetensors")
    assert os.listdir(tmp_path) == []


# ---- failures leave nothing behind -------------------------------------------------------------

def test_missing_directory_names_the_path(tmp_path):
    target = tmp_path / "missing" / "m.safetensors"
    with pytest.raises(FileNotFoundError, match="missing"):
        ferry.torch.save_file({"a": torch.zeros(2)}, target)


def test_a_name_the_loader_refuses_is_not_saved(tmp_path):
    # One name rule both ways: safetensors writes "a\0b", ferry's loader refuses it, so ferry's
    # saver refuses it too, naming the tensor, and writes nothing.
    target = tmp_path / "m.safetensors"
    for save in (lambda: ferry.torch.save_file({"a\0b": torch.ones(2)}, target),
                 lambda: ferry.torch.save({"a\0b": torch.ones(2)}),
                 lambda: ferry.numpy.save_file({"a\0b": np.ones(2)}, target)):
        with pytest.raises(ValueError, match=r'"a\\0\.\.\.".*NUL'):
            save()
    assert os.listdir(tmp_path) == []


def test_existing_file_is_replaced_whole(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"x" * (5 << 20))
    tensors = {"a": torch.arange(10)}
    ferry.torch.save_file(tensors, path)
    assert path.read_bytes() == safetensors.torch.save(tensors)


FULL_DISK_CHILD = textwrap.dedent("""
    import resource, signal, sys, numpy as np, ferry.numpy
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        ferry.numpy.save_file({"a": np.zeros(4 << 20, np.uint8)}, sys.argv[1])
    except OSError as e:
        print(type(e).__name__, e.errno, e)
        sys.exit(0)
    sys.exit(1)
""")


def test_file_size_limit_gives_a_clear_error_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"old")
    done = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(path)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(path) in done.stdout and "File too large" in done.stdout
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["m.safetensors"]


# ---- GPU ---------------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_cuda_tensors_stream_to_the_same_bytes(tmp_path):
    tensors = _torch_tensors(seed=8)
    tensors["big"] = torch.randn(3000, 1000).bfloat16()
    expected = safetensors.torch.save(tensors, metadata={"format": "pt"})
    on_gpu = {k: v.to("cuda:0") for k, v in tensors.items()}
    assert ferry.torch.save(on_gpu, metadata={"format": "pt"}) == expected
    for staging, piece in [(128 << 20, 16 << 20), (8192, 4096)]:
        stats = ferry.torch.write_file(on_gpu, tmp_path / "g.safetensors", {"format": "pt"},
                                       staging_bytes=staging, piece_bytes=piece)
        assert (tmp_path / "g.safetensors").read_bytes() == expected
        assert stats["staging_pinned"]
    back = ferry.torch.load_file(tmp_path / "g.safetensors", device="cuda:0")
    assert all(torch.equal(back[k], v) for k, v in on_gpu.items())


def test_save_benchmark_smoke_run(tmp_path):
    """bench/load/save_bench.py runs end to end (on the CPU, tiny tensors); timing is not checked."""
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench" / "load" / "save_bench.py"
    out = tmp_path / "runs.json"
    done = subprocess.run([sys.executable, str(bench), "--device", "cpu", "--dir", str(tmp_path), "--shape",
                           "qwen3_0_6b", "--scale", "0.0005", "--runs", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = json.loads(out.read_text())
    assert {r["saver"] for r in runs} == {"raw", "ferry", "safetensors"}
    sizes = {r["saver"]: r["file_bytes"] for r in runs}
    assert sizes["ferry"] == sizes["safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["runs.json"]


HOST_GROWTH_CHILD = textwrap.dedent("""
    import sys, torch, ferry.torch

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    tensors = {f"w{i}": torch.randn(64 << 20, device="cuda:0").to(torch.bfloat16) for i in range(8)}  # 1 GiB
    torch.cuda.synchronize()
    ferry.torch.write_file({"warm": torch.zeros(4, device="cuda:0")}, sys.argv[1])  # CUDA and pinning start
    open("/proc/self/clear_refs", "w").write("5\\n")
    before = status("VmRSS")
    stats = ferry.torch.write_file(tensors, sys.argv[1])
    print(status("VmHWM") - before, stats["staging_bytes"])
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_cuda_save_host_memory_stays_at_the_staging_size(tmp_path):
    path = tmp_path / "big.safetensors"
    done = subprocess.run([sys.executable, "-c", HOST_GROWTH_CHILD, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    growth, staging = map(int, done.stdout.split())
    assert path.stat().st_size > 1 << 30
    assert growth <= staging + (100 << 20), f"host memory grew {growth >> 20} MiB for {staging >> 20} MiB staging"
