"""Shared fixtures: the ferry binary, a runner for it, and checkpoints written by Hugging Face's
safetensors package (through TensorSpec, so no torch is needed)."""

import dataclasses
import json
import os
import pathlib
import re
import struct
import subprocess

import numpy as np
import pytest
import safetensors
import xxhash

REPO = pathlib.Path(__file__).resolve().parents[2]

# TensorSpec dtype name -> (header dtype, bits per element).
DTYPES = {
    "bool": ("BOOL", 8),
    "uint8": ("U8", 8),
    "int8": ("I8", 8),
    "uint16": ("U16", 16),
    "int16": ("I16", 16),
    "uint32": ("U32", 32),
    "int32": ("I32", 32),
    "uint64": ("U64", 64),
    "int64": ("I64", 64),
    "float16": ("F16", 16),
    "bfloat16": ("BF16", 16),
    "float32": ("F32", 32),
    "float64": ("F64", 64),
    "complex64": ("C64", 64),
    "float8_e4m3fn": ("F8_E4M3", 8),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 8),
    "float8_e5m2": ("F8_E5M2", 8),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 8),
    "float8_e8m0fnu": ("F8_E8M0", 8),
    "float4_e2m1fn_x2": ("F4", 4),
}

# Packed two to a byte: TensorSpec takes the storage shape (bytes) and doubles the last dim.
PACKED_X2 = {"float4_e2m1fn_x2"}


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def ferry_binary() -> pathlib.Path:
    env = os.environ.get("FERRY_BIN")
    return pathlib.Path(env) if env else REPO / "build" / "cli" / "ferry"


@pytest.fixture(scope="session")
def ferry_bin() -> pathlib.Path:
    path = ferry_binary()
    if not path.is_file():
        pytest.fail(f"ferry binary not found at {path}: build it or set FERRY_BIN")
    return path


@pytest.fixture(scope="session")
def run_ferry(ferry_bin):
    """Runs `ferry ARGS...` and returns its exit status and output; never raises on failure."""

    def run(*args, timeout=60) -> Result:
        done = subprocess.run(
            [str(ferry_bin), *map(str, args)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    return run


def storage_bytes(dtype: str, shape) -> int:
    """Bytes of a tensor; `shape` is what TensorSpec takes (the storage shape for packed types)."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dtype in PACKED_X2:
        return count
    return count * DTYPES[dtype][1] // 8


def write_safetensors(path, tensors, metadata=None, seed=0):
    """Writes `tensors` ({name: (TensorSpec dtype, shape)}) with random bytes via safetensors."""
    rng = np.random.default_rng(seed)
    arrays = {}  # kept alive until serialize_file returns: TensorSpec only holds a pointer
    specs = {}
    for name, (dtype, shape) in tensors.items():
        data = rng.integers(0, 256, size=storage_bytes(dtype, shape), dtype=np.uint8)
        arrays[name] = data
        specs[name] = safetensors.TensorSpec(
            dtype=dtype, shape=list(shape), data_ptr=data.ctypes.data, data_len=data.nbytes
        )
    safetensors.serialize_file(specs, str(path), metadata)
    return path


def reference(*files):
    """What safetensors itself reads: {name: (dtype, shape, xxh3-64 hex, bytes)}."""
    out = {}
    for f in files:
        for name, info in safetensors.deserialize(pathlib.Path(f).read_bytes()):
            assert name not in out, f"{name} in two files"
            data = bytes(info["data"])
            digest = xxhash.xxh3_64_hexdigest(data)
            out[name] = (info["dtype"], list(info["shape"]), digest, len(data))
    return out


def raw_header(path):
    """(data_start, header dict) parsed by hand, for offsets safetensors does not expose."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


def parse_hash_lines(stdout):
    """`ferry load --hash` lines -> [(name, dtype, shape, hex)] in printed order."""
    rows = []
    for line in stdout.splitlines():
        name, dtype, shape, digest = line.split("\t")
        rows.append((name, dtype, json.loads(shape), digest))
    return rows


def o_direct_supported(directory) -> bool:
    probe = pathlib.Path(directory) / "o_direct_probe"
    probe.write_bytes(b"\0" * 4096)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:  # EINVAL on tmpfs and other file systems without O_DIRECT
        return False
    finally:
        probe.unlink()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


_IMPORTS_THE_PACKAGE = re.compile(r"^\s*(import ferry|from ferry)\b", re.MULTILINE)


def pytest_ignore_collect(collection_path, config):
    """FERRY_SKIP_PACKAGE_TESTS (the sanitizer build: its extension cannot load into an
    uninstrumented interpreter, and no package is installed yet): every test module that imports
    the package is left out, whether or not it says so itself."""
    if not os.environ.get("FERRY_SKIP_PACKAGE_TESTS") or collection_path.suffix != ".py":
        return None
    if collection_path.name.startswith("test_") and \
            _IMPORTS_THE_PACKAGE.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None
