"""`ferry load --repeat N` in the forms a process meets later loads: each load freed before the
next (the default), every load kept resident (--keep), and loads after the first refilled into
the first load's memory (--refill, a weight refresh). Each lands the bytes of one cpu load; on a
machine with a GPU `--device auto` takes it, with and without page-cache DMA."""

import json

import pytest

from conftest import write_safetensors

TENSORS = {"embed": ("bfloat16", [64, 48]), "norm": ("float32", [48]),
           "proj": ("float16", [48, 96]), "bias": ("int8", [13])}


@pytest.fixture
def model(tmp_path):
    return write_safetensors(tmp_path / "model.safetensors", TENSORS, seed=7)


def hashes(run_ferry, *args):
    r = run_ferry("load", *args, "--hash")
    assert r.returncode == 0, r.stderr
    assert r.stdout, r.stderr
    return r.stdout


def runs(run_ferry, *args):
    r = run_ferry("load", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


ENGINES = [[], ["--page-cache-pin", "1GiB"], ["--threads", "1", "--chunk-mib", "0.00390625"]]
IDS = ["defaults", "page_cache_dma", "small_reads"]


@pytest.mark.parametrize("mode", ["--keep", "--refill", "--cache-device-memory", None])
@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_later_loads_land_the_bytes_of_one_cpu_load(run_ferry, model, mode, engine):
    want = hashes(run_ferry, model, "--device", "cpu")
    flags = [mode] if mode else []
    assert hashes(run_ferry, model, "--device", "auto", "--repeat", "3", *flags, *engine) == want
    assert hashes(run_ferry, model, "--device", "cpu", "--repeat", "3", *flags, *engine) == want


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_refill_goes_into_the_first_loads_memory(run_ferry, model, device):
    loads = runs(run_ferry, model, "--device", device, "--repeat", "3", "--refill")
    assert [s["into"] for s in loads] == ["new memory"] + ["first load's memory"] * 2
    assert loads[0]["allocated_bytes"] >= loads[0]["tensor_bytes"] > 0
    for s in loads[1:]:
        assert s["allocated_bytes"] == 0  # nothing new: the first load's tensors are refilled
        assert s["tensor_bytes"] == loads[0]["tensor_bytes"]
        assert s["bytes_read"] >= s["tensor_bytes"]
        assert s["device"] == loads[0]["device"]


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_keep_holds_every_load(run_ferry, model, device):
    loads = runs(run_ferry, model, "--device", device, "--repeat", "3", "--keep")
    assert [s["loads_held"] for s in loads] == [0, 1, 2]
    assert all(s["into"] == "new memory" and s["allocated_bytes"] > 0 for s in loads)
    default = runs(run_ferry, model, "--device", device, "--repeat", "2")
    assert [s["loads_held"] for s in default] == [0, 0]  # the previous load freed before


def test_refill_keeps_the_first_loads_tensor_selection(run_ferry, model):
    want = hashes(run_ferry, model, "--device", "cpu", "--tensor", "proj", "--tensor", "norm")
    assert len(want.splitlines()) == 2
    got = hashes(run_ferry, model, "--device", "auto", "--repeat", "2", "--refill",
                 "--tensor", "proj", "--tensor", "norm")
    assert got == want
    loads = runs(run_ferry, model, "--device", "auto", "--repeat", "2", "--refill",
                 "--tensor", "proj")
    assert loads[1]["tensor_bytes"] == loads[0]["tensor_bytes"] == 48 * 96 * 2


def test_keep_and_refill_exclude_each_other(run_ferry, model):
    r = run_ferry("load", model, "--device", "cpu", "--repeat", "2", "--keep", "--refill")
    assert r.returncode != 0
    assert "--keep excludes --refill" in r.stderr or "--refill excludes --keep" in r.stderr


def test_refill_needs_one_device(run_ferry, model):
    r = run_ferry("load", model, "--device", "cuda:0,cuda:1", "--repeat", "2", "--refill")
    assert r.returncode == 1
    assert "--refill" in r.stderr and "not with several devices" in r.stderr


def test_cache_device_memory_needs_one_device(run_ferry, model):
    r = run_ferry("load", model, "--device", "cuda:0,cuda:1", "--cache-device-memory")
    assert r.returncode == 1
    assert "--cache-device-memory" in r.stderr and "not with several devices" in r.stderr
