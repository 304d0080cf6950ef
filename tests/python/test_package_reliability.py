"""The Python package where input or interpreter state is hostile or unlucky (issue 12): high
ranks, interpreter exit during a load, NUL in paths, paths that are not UTF-8."""
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import safetensors.torch
import torch

import ferry
import ferry.torch
from safetensors.torch import load_file as st_load_file

from conftest import write_safetensors


def raw(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


# --- item 2: ranks nanobind cannot describe load anyway -----------------------------------------

@pytest.fixture
def high_rank(tmp_path):
    path = tmp_path / "rank.safetensors"
    header = {"r129": {"dtype": "F32", "shape": [1] * 128 + [2], "data_offsets": [0, 8]},
              "r200": {"dtype": "BF16", "shape": [1] * 199 + [3], "data_offsets": [8, 14]},
              "r128": {"dtype": "U8", "shape": [1] * 127 + [2], "data_offsets": [14, 16]}}
    path.write_bytes(raw(header, struct.pack("<2f", 1.5, -2.0) + bytes(range(8))))
    return path


def test_tensors_of_rank_129_and_more_load_as_safetensors_loads_them(high_rank):
    expected = st_load_file(str(high_rank))
    got = ferry.torch.load_file(high_rank)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8))
    tensors, _ = ferry.torch.load_with_stats(high_rank)
    assert tensors["r129"].ndim == 129
    assert dict(ferry.torch.iterate_weights(high_rank))["r200"].ndim == 200


# --- item 5: interpreter exit while a daemon thread loads with a progress callback ---------------

EXIT_DURING_LOAD = """
import sys, threading, time, ferry.torch
path, delay = sys.argv[1], float(sys.argv[2])
def work():
    ferry.torch.load_with_stats(path, threads=2, chunk_bytes=1 << 12, io="buffered",
                     progress=lambda done, total: None)
threading.Thread(target=work, daemon=True).start()
time.sleep(delay)
"""


def test_interpreter_exit_during_a_load_with_progress_does_not_abort(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors",
                             {f"t{i}": ("uint8", [1 << 20]) for i in range(16)})
    for delay in ("0.05", "0.2", "0.5"):
        r = subprocess.run([sys.executable, "-c", EXIT_DURING_LOAD, str(path), delay],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"exit {r.returncode} after {delay} s: {r.stderr[-500:]}"
        assert "terminate" not in r.stderr and "FATAL" not in r.stderr, r.stderr


def test_interpreter_exit_during_a_long_load_is_clean(tmp_path):
    # 4 KiB reads of 128 MiB: the load is still under way when the interpreter exits, so the exit
    # handler cancels it and waits for it before the process runs its exit handlers.
    path = write_safetensors(tmp_path / "big.safetensors",
                             {f"t{i}": ("uint8", [16 << 20]) for i in range(8)})
    r = subprocess.run([sys.executable, "-c", EXIT_DURING_LOAD, str(path), "0.1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    for noise in ("terminate", "FATAL", "nanobind: leaked"):
        assert noise not in r.stderr, r.stderr[-500:]


LOAD_IN_LATE_ATEXIT = """
import atexit, sys
path = sys.argv[1]
def late():  # registered before ferry's own handler, so it runs after it
    import ferry.torch
    print(sorted(ferry.torch.load_with_stats(path, progress=lambda d, t: None)[0]))
atexit.register(late)
import ferry.torch
"""


def test_the_main_thread_may_still_load_after_the_exit_handler(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {"w": ("uint8", [1 << 16])})
    r = subprocess.run([sys.executable, "-c", LOAD_IN_LATE_ATEXIT, str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['w']"


# --- item 6: a NUL in a path never opens a shorter path -----------------------------------------

def test_nul_in_a_path_is_a_value_error(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {"w": ("float32", [2])})
    for bad in (str(path) + "\0.other", os.fsencode(path) + b"\0x"):
        with pytest.raises(ValueError, match="null"):
            ferry.torch.load_file(bad)
        with pytest.raises(ValueError, match="null"):
            ferry.safe_open(bad, "pt")


def test_nul_in_a_tensor_name_is_a_value_error(tmp_path):
    path = tmp_path / "nul.safetensors"
    path.write_bytes(raw({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                          "a\0b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"xy"))
    with pytest.raises(ValueError, match="NUL"):
        ferry.torch.load_file(path)


# --- item 12: bytes and os.PathLike paths; names that are not UTF-8 ------------------------------

def test_paths_as_bytes_and_pathlike(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {"w": ("float32", [2, 3])})
    expected = st_load_file(str(path))["w"]
    for form in (str(path), pathlib.Path(path), os.fsencode(path)):
        assert torch.equal(ferry.torch.load_file(form)["w"], expected), type(form)
    assert torch.equal(dict(ferry.torch.iterate_weights(os.fsencode(path)))["w"], expected)


def test_shard_names_that_are_not_utf8(tmp_path):
    directory = os.fsencode(tmp_path)
    shard = directory + b"/caf\xe9.safetensors"
    write_safetensors(os.fsdecode(shard), {"w": ("float32", [2, 3])})
    with open(shard, "rb") as f:  # safetensors itself refuses paths that are not UTF-8
        expected = safetensors.torch.load(f.read())["w"]
    for form in (shard, os.fsdecode(shard), directory, tmp_path):
        assert torch.equal(ferry.torch.load_file(form)["w"], expected), form
    tensors, stats = ferry.torch.load_with_stats(directory)
    assert [os.fsencode(f["path"]) for f in stats["files"]] == [shard]
    checkpoint = ferry._ferry.Checkpoint.open(directory)
    assert [os.fsencode(f) for f in checkpoint.files()] == [shard]
    assert os.fsencode(checkpoint.path) == directory
