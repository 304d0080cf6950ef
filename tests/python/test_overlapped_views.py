"""ferry.torch builds a load's tensors while its reads run (_ferry.start_load): the tensors equal
safetensors' own, none is handed out before every byte landed or when the load fails, and the
statistics say when each phase of the load was reached."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")
from safetensors.torch import load_file as reference_load, save_file  # noqa: E402

import ferry  # noqa: E402
import ferry.torch  # noqa: E402
from ferry import _ferry  # noqa: E402


@pytest.fixture
def many_tensors(tmp_path):
    """600 small tensors of several dtypes (bool and bf16 among them) and one larger one."""
    g = torch.Generator().manual_seed(5)
    tensors = {"big": torch.randn(512, 1031, generator=g)}
    makers = [lambda n: torch.randn(n, 3, generator=g).bfloat16(),
              lambda n: torch.randint(-9, 9, (n,), generator=g, dtype=torch.int32),
              lambda n: torch.randint(0, 2, (n, 2), generator=g).bool(),
              lambda n: torch.randn(2, n, generator=g).half(),
              lambda n: torch.randn(n, generator=g)]
    for i in range(600):
        tensors[f"layers.{i}.w"] = makers[i % len(makers)](1 + i % 37)
    path = tmp_path / "many.safetensors"
    save_file(tensors, str(path))
    return path


def equal(ours, theirs):
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and ours[name].shape == t.shape, name
        assert torch.equal(ours[name], t), name


DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_built_during_the_reads_equal_safetensors(many_tensors, device):
    want = reference_load(str(many_tensors))
    for chunk in (None, 4096):  # one read, and hundreds of small ones
        tensors, stats = ferry.torch.load_with_stats(many_tensors, device=device, chunk_bytes=chunk)
        assert all(str(t.device) == device for t in tensors.values())
        equal({name: t.cpu() for name, t in tensors.items()}, want)
        engine = [name for name, _ in stats["timeline"]]
        assert engine[:3] == ["planned", "allocated", "submitted"] and engine[-1] == "done"
        assert {"first_worker", "staging_ready", "streams_ready", "first_read"} <= set(engine)
        assert [t for _, t in stats["timeline"]] == sorted(t for _, t in stats["timeline"])
        python = stats["python_timeline"]
        assert [name for name, _ in python] == ["opened", "load_started", "tensors_built",
                                                "load_waited", "returned"]
        assert [t for _, t in python] == sorted(t for _, t in python)
    equal(ferry.torch.load_file(many_tensors), want)
    with ferry.safe_open(many_tensors, "pt") as f:
        equal(f.get_tensors(), want)


def test_a_started_load_hands_out_views_before_its_bytes_and_results_once(many_tensors):
    checkpoint = _ferry.Checkpoint.open(str(many_tensors))
    pending = _ferry.start_load(checkpoint, "cpu", ["big", "layers.3.w"], chunk_bytes=4096)
    views = dict(pending.views())
    assert set(views) == {"big", "layers.3.w"}
    big = torch.from_dlpack(views["big"])  # the memory the load fills
    loaded = pending.wait()
    want = reference_load(str(many_tensors))
    assert torch.equal(big, want["big"])
    assert big.data_ptr() == loaded.address("big")
    with pytest.raises(RuntimeError, match="waited for already"):
        pending.wait()
    with pytest.raises(RuntimeError, match="waited for already"):
        pending.views()


def test_a_started_load_dropped_without_a_wait_stops_and_the_next_one_loads(many_tensors):
    checkpoint = _ferry.Checkpoint.open(str(many_tensors))
    for _ in range(5):
        pending = _ferry.start_load(checkpoint, "cpu", chunk_bytes=4096, threads=2)
        pending.views()
        del pending  # cancelled; its copies stop before its memory goes
    equal(ferry.torch.load_file(many_tensors), reference_load(str(many_tensors)))


def test_a_failed_load_hands_out_no_tensor(many_tensors, monkeypatch):
    """The file shrinks after it was opened: the reads fail, and so does the call, naming it."""
    real_open = ferry.torch.open_checkpoint

    def open_then_truncate(path):
        checkpoint = real_open(path)
        os.truncate(path, os.path.getsize(path) // 2)
        return checkpoint

    monkeypatch.setattr(ferry.torch, "open_checkpoint", open_then_truncate)
    with pytest.raises(Exception, match="many.safetensors") as failure:
        ferry.torch.load_with_stats(many_tensors)
    assert not isinstance(failure.value, AssertionError)
