"""Loading across the processes of a torch.distributed group (gloo on the CPU, 2-4 processes):
every rank's tensors equal safetensors' own load, sliced as torch.tensor_split slices them; the
group reads each byte once; ranks that disagree on the plan all fail with the same error."""
import datetime
import os
import traceback

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file as reference_load, save_file  # noqa: E402

from ferry._collectives import TorchCollectives  # noqa: E402


def llama_like(path):
    g = torch.Generator().manual_seed(3)
    t = {"model.embed_tokens.weight": torch.randn(37, 24, generator=g).bfloat16(),
         "model.norm.weight": torch.randn(24, generator=g),
         "model.tiny.q_proj.weight": torch.arange(3, dtype=torch.uint8),
         "lm_head.weight": torch.randn(37, 24, generator=g).half()}
    for layer in range(2):
        p = f"model.layers.{layer}."
        t[p + "self_attn.q_proj.weight"] = torch.randn(25, 24, generator=g).bfloat16()
        t[p + "self_attn.o_proj.weight"] = torch.randn(24, 25, generator=g).bfloat16()
        t[p + "mlp.down_proj.weight"] = torch.randn(24, 53, generator=g)
        t[p + "mlp.up_proj.weight"] = torch.randn(53, 24, generator=g)
        t[p + "input_layernorm.weight"] = torch.randn(24, generator=g)
    save_file(t, str(path))


def expected_slice(name, tensor, rank, world, shard):
    """The reference: torch.tensor_split's slices (the first len % N ranks one longer)."""
    if shard == "tensor_parallel":
        rows = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
        if any(f".{r}." in f".{name}" for r in rows):
            dim = 0
        elif any(c in name for c in ("o_proj", "down_proj")) and tensor.dim() >= 2:
            dim = 1
        else:
            return tensor
    elif isinstance(shard, dict):
        spec = shard.get(name)
        if spec is None:
            return tensor
        dim, sizes = spec if isinstance(spec, tuple) else (spec, None)
        if sizes:
            return torch.split(tensor, sizes, dim)[rank]
    else:
        return tensor
    return torch.tensor_split(tensor, world, dim)[rank]


class _RecordingCollectives(TorchCollectives):
    """TorchCollectives on the default group that records the interface's calls, and any
    torch.distributed collective issued outside them (a load must run every collective through
    the interface: that is what lets it run on a communicator the caller holds, as vLLM's)."""

    def __init__(self):
        super().__init__(dist.group.WORLD)
        self.calls, self.outside, self._inside = [], [], False
        for name in ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor"):
            original = getattr(dist, name)

            def watched(*args, _original=original, _name=name, **kwargs):
                if not self._inside:
                    self.outside.append(_name)
                return _original(*args, **kwargs)
            setattr(dist, name, watched)

    def _call(self, name, *args):
        self.calls.append(name)
        self._inside = True
        try:
            return getattr(super(), name)(*args)
        finally:
            self._inside = False

    def broadcast(self, tensor, src):
        return self._call("broadcast", tensor, src)

    def all_gather_into(self, region, own):
        return self._call("all_gather_into", region, own)

    def max_of(self, values, device):
        return self._call("max_of", values, device)

    def every_rank(self, values, device):
        return self._call("every_rank", values, device)


def _worker(rank, world, init, path, shard, result_dir, mode, backend="gloo"):
    try:
        # NVLink multicast stays off in every process (see ferry/_distributed.py).
        os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                           "NVSHMEM_DISABLE_NVLS": "1"})
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
        try:
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=60), **kwargs)
        except TypeError:  # torch < 2.3 has no device_id
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=60))
        import ferry.torch
        from ferry._distributed import load_sharded
        want = reference_load(path)
        if mode == "disagree":
            shard = "tensor_parallel" if rank == 0 else None
        if mode == "die" and rank == 1:  # dies in the middle of its second round's reads
            import ferry._ferry
            real = ferry._ferry.start_fanout_round
            ferry._ferry.start_fanout_round = (
                lambda plan, k, *a, **kw: os._exit(3) if k == 1 else real(plan, k, *a, **kw))
        if mode == "load_into":
            plan = ferry.torch.slice_plan(path, world, shard)[rank]
            targets = {n: torch.empty(s, dtype=want[n].dtype, device=device)
                       for n, (_, _, _, s) in plan.items()}
            ferry.torch.load_into(targets, path, process_group=dist.group.WORLD, shard=shard)
            got, stats = targets, None
        elif mode == "collectives":
            recorder = _RecordingCollectives()
            got, stats = load_sharded(path, device, recorder, shard, return_stats=True,
                                      round_bytes=512)
            assert recorder.outside == [], recorder.outside
            assert {"max_of", "broadcast", "all_gather_into"} <= set(recorder.calls), recorder.calls
        elif mode == "machine":  # the ranks share the machine's readers (given, or torchrun's)
            given = world if rank == 0 else None
            if given is None:
                os.environ["LOCAL_WORLD_SIZE"] = str(world)
            got, stats = load_sharded(path, device, dist.group.WORLD, shard, return_stats=True,
                                      round_bytes=512, ranks_on_machine=given)
            with open(os.path.join(result_dir, f"{rank}.why"), "w") as f:
                f.write("\n".join(r["settings_source"] for r in stats["reads"]))
        else:
            got, stats = load_sharded(path, device, dist.group.WORLD, shard, return_stats=True,
                                      round_bytes=512)
        got = {n: t.cpu() for n, t in got.items()}
        assert set(got) == set(want), (set(got) ^ set(want))
        for name, tensor in want.items():
            exp = expected_slice(name, tensor, rank, world, shard)
            assert got[name].dtype == exp.dtype, name
            assert got[name].shape == exp.shape, (name, got[name].shape, exp.shape)
            assert torch.equal(got[name].view(torch.uint8) if exp.dim() else got[name],
                               exp.contiguous().view(torch.uint8) if exp.dim() else exp), name
        read = sum(r["bytes_read"] for r in stats["reads"]) if stats else 0
        with open(os.path.join(result_dir, f"{rank}.txt"), "w") as f:
            f.write(f"ok {read}")
    except Exception as e:  # reported to the parent, which asserts
        with open(os.path.join(result_dir, f"{rank}.txt"), "w") as f:
            f.write(f"error {type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_group(tmp_path, world, shard, mode="load", backend="gloo"):
    path = tmp_path / "m.safetensors"
    if not path.exists():
        llama_like(path)
    results = tmp_path / f"results-{world}-{mode}-{abs(hash(str(shard)))}"
    results.mkdir()
    init = f"file://{tmp_path / ('rendezvous-' + results.name)}"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker,
                         args=(r, world, init, str(path), shard, str(results), mode, backend))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == (3 if mode == "die" and p is procs[1] else 0), p.exitcode
    return [(results / f"{r}.txt").read_text() if (results / f"{r}.txt").exists() else "died"
            for r in range(world)], path


def checkpoint_bytes(path):
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
               if k != "__metadata__")


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("shard", [None, "tensor_parallel"])
def test_every_rank_holds_its_tensors_and_the_group_reads_each_byte_once(tmp_path, world, shard):
    outcomes, path = run_group(tmp_path, world, shard)
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)
    read = sum(int(o.split()[1]) for o in outcomes)
    assert read == checkpoint_bytes(path)


def test_the_ranks_of_one_machine_share_its_readers(tmp_path):
    outcomes, path = run_group(tmp_path, 3, "tensor_parallel", mode="machine")
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)
    results = next(tmp_path.glob("results-3-machine-*"))
    for rank in range(3):
        why = (results / f"{rank}.why").read_text().splitlines()
        assert why, rank
        # several rounds (round_bytes=512): two read at once
        assert all("this rank's share of" in w and "(3 ranks, 2 rounds each reading at once"
                   in w for w in why), why


def test_ranks_on_machine_must_be_a_count():
    from ferry._distributed import ranks_on_this_machine
    assert ranks_on_this_machine(4) == 4
    for bad in (0, -3, 10 ** 12, "x", None.__class__):
        with pytest.raises(ValueError, match="ranks_on_machine must be a whole number from 1"):
            ranks_on_this_machine(bad)
    old = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        os.environ["LOCAL_WORLD_SIZE"] = "two"
        with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be a whole number.*'two'"):
            ranks_on_this_machine()
        os.environ["LOCAL_WORLD_SIZE"] = "8"
        assert ranks_on_this_machine() == 8
        del os.environ["LOCAL_WORLD_SIZE"]
        assert ranks_on_this_machine() == 1
    finally:
        if old is not None:
            os.environ["LOCAL_WORLD_SIZE"] = old


def test_explicit_slice_plan_with_uneven_sizes(tmp_path):
    shard = {"model.layers.0.mlp.down_proj.weight": (1, [50, 3]),
             "model.embed_tokens.weight": 0,
             "model.layers.1.self_attn.o_proj.weight": (0, [0, 24])}
    outcomes, _ = run_group(tmp_path, 2, shard)
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)


def test_load_into_sharded_targets(tmp_path):
    outcomes, _ = run_group(tmp_path, 2, "tensor_parallel", mode="load_into")
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)


def test_a_load_runs_every_collective_through_the_collectives_it_is_given(tmp_path):
    outcomes, path = run_group(tmp_path, 2, "tensor_parallel", mode="collectives")
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)
    assert sum(int(o.split()[1]) for o in outcomes) == checkpoint_bytes(path)


def test_ranks_that_disagree_all_fail_with_the_same_error(tmp_path):
    outcomes, path = run_group(tmp_path, 2, None, mode="disagree")
    assert all(o.startswith("error ValueError") for o in outcomes), "\n".join(outcomes)
    first_lines = {o.splitlines()[0] for o in outcomes}
    assert len(first_lines) == 1, first_lines
    assert "disagree" in outcomes[0] and str(path) in outcomes[0]


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_a_rank_that_dies_mid_load_fails_the_others_in_bounded_time(tmp_path):
    outcomes, path = run_group(tmp_path, 2, None, mode="die")
    assert outcomes[1] == "died"
    assert outcomes[0].startswith("error RuntimeError"), outcomes[0]
    assert "did another rank stop or fail" in outcomes[0] and str(path) in outcomes[0]


@pytest.mark.skipif(_gpus() < 2 or not dist.is_nccl_available(), reason="needs 2 GPUs and NCCL")
@pytest.mark.parametrize("shard", [None, "tensor_parallel"])
def test_nccl_on_every_gpu(tmp_path, shard):
    outcomes, path = run_group(tmp_path, _gpus(), shard, backend="nccl")
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)
    assert sum(int(o.split()[1]) for o in outcomes) == checkpoint_bytes(path)


@pytest.mark.skipif(_gpus() < 2 or not dist.is_nccl_available(), reason="needs 2 GPUs and NCCL")
def test_nccl_load_into_sharded_targets(tmp_path):
    outcomes, _ = run_group(tmp_path, 2, "tensor_parallel", mode="load_into", backend="nccl")
    assert all(o.startswith("ok") for o in outcomes), "\n".join(outcomes)
