"""ferry.prepare_load / ferry.torch.prepare: a first load's set-up made ahead, then used."""
import pytest
import torch

import ferry
import ferry.torch


def test_preparation_makes_one_staging_slab_per_reader():
    ferry.release_staging_memory()
    report = ferry.prepare_load("cpu", threads=3, chunk_bytes="1MiB").wait()
    assert report["slabs"] == 3
    assert report["pinned"] is False  # host memory: nothing to pin
    assert report["threads"] >= 3
    assert report["staging_bytes"] > 3 * 2 * (1 << 20)
    assert report["seconds"] >= 0


def test_a_prepared_load_is_bit_exact(tmp_path):
    from safetensors.torch import save_file
    tensors = {"a": torch.arange(3 << 18, dtype=torch.float32), "b": torch.ones(7, 5)}
    save_file(tensors, tmp_path / "m.safetensors")
    preparation = ferry.torch.prepare("cpu", threads=2, chunk_bytes="1MiB")
    loaded = ferry.torch.load_file(tmp_path / "m.safetensors")  # need not wait for it
    preparation.wait()
    assert preparation.done
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t)


def test_bad_settings_are_refused_at_once():
    with pytest.raises(ValueError, match="threads"):
        ferry.prepare_load("cpu", threads="many")
    with pytest.raises(ValueError, match="cannot hold"):
        ferry.prepare_load("cpu", chunk_bytes="1MiB", staging_bytes=4096)


@pytest.mark.skipif(ferry.cuda_available(), reason="a GPU is usable here")
def test_a_gpu_without_a_driver_fails_on_wait():
    preparation = ferry.torch.prepare(0)
    with pytest.raises(Exception, match="warm-up for cuda:0"):
        preparation.wait()


def test_a_checkpoint_given_is_registered_only_where_page_cache_dma_serves(tmp_path):
    from safetensors.torch import save_file
    save_file({"a": torch.ones(1000)}, tmp_path / "m.safetensors")
    report = ferry.torch.prepare("cpu", tmp_path / "m.safetensors", page_cache_pin="1GiB").wait()
    assert report["page_cache_bytes"] == 0
    assert "does not serve cpu" in report["page_cache_why_not"]
    assert ferry.torch.prepare("cpu", tmp_path).wait()["page_cache_why_not"] == ""  # not asked
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        ferry.torch.prepare("cpu", tmp_path / "missing.safetensors")


def test_the_raw_binding_takes_a_checkpoint_object_not_a_path(tmp_path):
    with pytest.raises(TypeError, match="checkpoint"):
        ferry.prepare_load("cpu", str(tmp_path))
