"""Engine settings from Python go through the same mapping as the CLI's flags and the C ABI."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the Python package's tests are skipped in this run", allow_module_level=True)
torch = pytest.importorskip("torch")
import ferry  # noqa: E402
import ferry.torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3, 5)}, str(path))
    return path


def test_every_engine_setting_is_accepted(checkpoint):
    tensors, stats = ferry.torch.load_with_stats(checkpoint, backend="posix", allow_compat=False, io="buffered",
                                      staging_bytes="8MiB", chunk_bytes=8192, threads=2, slots=1)
    assert torch.equal(tensors["a"], torch.arange(4096, dtype=torch.float32))
    assert stats["reader_threads"] <= 2 and stats["slots_per_thread"] == 1
    assert stats["chunk_bytes"] == 8192
    assert {f["io_path"] for f in stats["files"]} == {"buffered"}


def test_page_cache_pin_is_accepted_and_each_file_says_which_path_it_took(checkpoint):
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    for round in range(2):
        tensors, stats = ferry.torch.load_with_stats(checkpoint, device=device, page_cache_pin="1GiB")
        assert torch.equal(tensors["a"].cpu(), torch.arange(4096, dtype=torch.float32))
        assert torch.equal(tensors["b"].cpu(), torch.ones(3, 5))
        [f] = stats["files"]
        if device == "cpu":
            assert f["io_path"] != "page-cache-dma"
            assert "page-cache DMA not used" in f["reason"]
            assert stats["bytes_from_registered_page_cache"] == 0
        else:
            assert f["io_path"] == "page-cache-dma", f["reason"]
            assert stats["bytes_from_registered_page_cache"] == stats["bytes_read"] > 0
            if round == 1:  # the first load's registration was kept
                assert stats["page_cache_register_seconds"] == 0
                assert "registered by an earlier transfer" in f["reason"]
    del tensors
    assert ferry.release_page_cache_registrations() == 0  # no load holds one now


def test_cache_device_memory_keeps_freed_memory_until_released(checkpoint):
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    for _ in range(2):
        tensors, stats = ferry.torch.load_with_stats(checkpoint, device=device,
                                                     cache_device_memory=True)
        assert torch.equal(tensors["a"].cpu(), torch.arange(4096, dtype=torch.float32))
        assert torch.equal(tensors["b"].cpu(), torch.ones(3, 5))
        if device != "cpu":  # held by the tensors alive
            assert ferry.release_cached_device_memory() >= stats["allocated_bytes"]
        del tensors
    assert ferry.release_cached_device_memory() == 0  # no load holds any now


def test_cufile_without_gds_is_refused_unless_allowed(checkpoint):
    with pytest.raises(Exception, match="(?i)cufile|gpu|cuda"):
        ferry.torch.load_with_stats(checkpoint, device="cuda:0" if torch.cuda.is_available() else "cpu",
                         backend="cufile")


@pytest.mark.parametrize("key,value,words", [
    ("threads", 10**10, "at most 256"),
    ("staging_bytes", float("nan"), "staging_bytes"),
    ("slots", -1, "slots"),
    ("speed", 3, "unknown load option"),
    ("backend", "gds", "gds"),
    ("page_cache_pin", "lots", "page_cache_pin"),
    ("cache_device_memory", "maybe", "cache_device_memory"),
])
def test_bad_settings_raise_naming_them(checkpoint, key, value, words):
    with pytest.raises(ValueError, match=words):
        ferry.torch.load_with_stats(checkpoint, **{key: value})
