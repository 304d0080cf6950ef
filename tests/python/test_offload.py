"""ferry.torch.offload on the host (no GPU: host memory stands in for slots): which blocks stream,
outputs equal to the model without offload (from the arena and from a checkpoint on disk, over
several passes), parameters as views of slot memory, undo, and the errors for bad settings."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")

import ferry.torch  # noqa: E402
from ferry import _ferry  # noqa: E402
from ferry.offload import choose_layers, find_blocks  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width, bias=False)

    def forward(self, x, scale=1.0):
        return x + self.down(torch.relu(self.up(self.norm(x)))) * scale


class Net(torch.nn.Module):
    def __init__(self, layers=6, width=32, hidden=96):
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.layers = torch.nn.ModuleList(Block(width, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(width, 5)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, scale=0.5)
        return self.head(h)


def make(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw).eval()


def inputs(n=3):
    g = torch.Generator().manual_seed(42)
    return [torch.randn(4, 8, generator=g) for _ in range(n)]


def test_choose_layers():
    assert choose_layers([10] * 8) == list(range(8))
    assert choose_layers([10] * 8, group_size=4, last=2) == [2, 3, 6, 7]
    assert choose_layers([10] * 8, group_size=2, last=1) == [1, 3, 5, 7]
    # Saving 30 bytes with one slot of 10: four blocks (40 - 10).
    assert len(choose_layers([10] * 8, budget_bytes=30, prefetch=1)) == 4
    assert len(choose_layers([10] * 8, budget_bytes=30, prefetch=2)) == 5
    with pytest.raises(ValueError, match="more than streaming can save"):
        choose_layers([10] * 8, budget_bytes=100)
    with pytest.raises(ValueError, match="last"):
        choose_layers([10] * 8, group_size=2, last=3)
    with pytest.raises(ValueError, match="not both"):
        choose_layers([10] * 8, group_size=2, budget_bytes=5)


def test_plan_offload_times_blocks_and_simulates():
    model = make()
    x = inputs(1)[0]
    fast = ferry.torch.plan_offload(model, lambda: model(x), group_size=2, last=1, prefetch=1,
                                    link_bytes_per_second=1e15)
    assert fast["layers"] == [1, 3, 5]
    assert fast["compute_seconds"] > 0
    assert fast["streamed_bytes"] == 3 * sum(p.numel() * 4 for p in model.layers[0].parameters())
    assert fast["gpu_bytes"] < sum(p.numel() * 4 for p in model.parameters())
    # A link of 1 byte/s: every step waits for copies far longer than its compute.
    slow = ferry.torch.plan_offload(model, lambda: model(x), group_size=2, last=1, prefetch=1,
                                    link_bytes_per_second=1.0)
    assert slow["stall_seconds"] > 1000 * slow["compute_seconds"]
    assert "forward" not in model.layers[0].__dict__ and not model.layers[0]._forward_hooks
    with pytest.raises(ValueError, match="link"):
        ferry.torch.plan_offload(model, lambda: model(x))


def test_find_blocks():
    model = make()
    assert find_blocks(model) is model.layers


@pytest.mark.parametrize("prefetch", [1, 2, 3])
@pytest.mark.parametrize("selection", [{}, {"group_size": 2, "last": 1}, {"layers": [0, 4, 5]}])
def test_outputs_equal_resident_from_cpu(prefetch, selection):
    reference = make()
    model = make()
    want = [reference(x) for x in inputs()]
    off = ferry.torch.offload(model, device="cpu", prefetch=prefetch, **selection)
    with torch.no_grad():
        for _ in range(2):
            for x, w in zip(inputs(), want):
                assert torch.equal(model(x), w)
    stats = off.stats()
    # One more where block 0 streams: its wait is made at the end of every pass, for the next
    # (no block before it can), and once by offload() for the first.
    assert stats["hits"] == 2 * 3 * len(off.layers) + (off.layers[0] == 0)
    assert stats["demand_fills"] == 0
    # Streamed parameters are views of slot memory; shared slots are really shared.
    first = model.layers[off.layers[0]].up.weight
    assert any(first.data_ptr() >= s.data_ptr() and first.data_ptr() < s.data_ptr() + s.numel()
               for s in off._slots)
    if len(off.layers) > prefetch:
        later = model.layers[off.layers[prefetch]].up.weight
        assert later.data_ptr() == first.data_ptr()
    assert off.saved_bytes == off.streamed_bytes - off.slot_bytes


def test_forward_with_autograd_enabled():
    reference = make()
    model = make()
    ferry.torch.offload(model, device="cpu", prefetch=2)
    x = inputs(1)[0]
    out = model(x)  # parameters require grad: the stream's ops must not get in the way
    assert torch.equal(out.detach(), reference(x).detach())


def test_undo_restores_resident_parameters():
    reference = make()
    model = make()
    off = ferry.torch.offload(model, device="cpu", prefetch=2)
    off.undo()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), n
    pointers = {p.data_ptr() for p in model.parameters()}
    assert len(pointers) == len(list(model.parameters())), "no parameter aliases a slot any more"
    assert "forward" not in model.layers[0].__dict__
    x = inputs(1)[0]
    assert torch.equal(model(x), reference(x))


class NormLast(Block):
    """Reads its norm after its down projection, which offload takes for its last weight use."""

    def forward(self, x, scale=1.0):
        return self.norm(x + self.down(torch.relu(self.up(x))) * scale)


class SkipsMlp(Block):
    """Its tail (down) does not run on every call."""

    def forward(self, x, scale=1.0):
        if x.shape[0] == 1:
            return self.norm(x)
        return x + self.down(torch.relu(self.up(self.norm(x)))) * scale


def swap_blocks(model, cls):
    for i, old in enumerate(model.layers):
        new = cls(32, 96)
        new.load_state_dict(old.state_dict())
        model.layers[i] = new
    return model


def test_a_blocks_tail_is_its_last_matrix_without_a_bias():
    from ferry.offload._order import _tail_of
    assert _tail_of(Block(32, 96))[0] == "down"  # registered after the norm and up
    biased = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4))
    assert _tail_of(biased) is None  # ordered at its edges
    own = Block(32, 96)
    own.scale = torch.nn.Parameter(torch.ones(32))  # read by its own forward, at any time
    assert _tail_of(own) is None


def test_copies_are_ordered_after_each_blocks_tail():
    reference = make()
    model = make()
    off = ferry.torch.offload(model, device="cpu", group_size=2, last=1, prefetch=1)
    # Streamed blocks release right after their down projection; the resident block before
    # each makes its wait there too (nothing at the blocks' edges).
    assert all(model.layers[i].down._forward_hooks for i in range(6))
    with torch.no_grad():
        for x in inputs():
            assert torch.equal(model(x), reference(x))
    assert off.stats()["demand_fills"] == 0
    off.undo()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_weight_use_after_the_tail_is_an_error_not_stale_bytes():
    reference = swap_blocks(make(), NormLast)
    model = swap_blocks(make(), NormLast)
    ferry.torch.offload(model, device="cpu", prefetch=1)
    with torch.no_grad(), pytest.raises(RuntimeError, match="norm runs after down"):
        model(inputs(1)[0])
    model = swap_blocks(make(), NormLast)
    ferry.torch.offload(model, device="cpu", prefetch=1, tails=False)  # at the blocks' edges
    with torch.no_grad():
        for x in inputs():
            assert torch.equal(model(x), reference(x))


def test_a_block_whose_tail_does_not_run_is_ordered_at_its_output():
    reference = swap_blocks(make(), SkipsMlp)
    model = swap_blocks(make(), SkipsMlp)
    off = ferry.torch.offload(model, device="cpu", prefetch=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for rows in (4, 1, 3, 1, 1, 2):
            x = torch.randn(rows, 8, generator=g)
            assert torch.equal(model(x), reference(x))
    assert off.stats()["demand_fills"] == 0


class Fails(Block):
    """Raises while `fail` is set: a pass that ends early."""
    fail = False

    def forward(self, x, scale=1.0):
        if Fails.fail:
            raise KeyError("on purpose")
        return super().forward(x, scale)


def test_a_pass_after_an_interrupted_one_is_refused_then_right():
    reference = make()
    model = make()
    model.layers[3] = Fails(32, 96)
    model.layers[3].load_state_dict(reference.layers[3].state_dict())
    ferry.torch.offload(model, device="cpu", prefetch=1)
    x = inputs(1)[0]
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
        Fails.fail = True
        try:
            with pytest.raises(KeyError):
                model(x)  # blocks 0-2 refilled their slot; the first block's wait never made
        finally:
            Fails.fail = False
        with pytest.raises(RuntimeError, match="did not finish"):
            model(x)
        for _ in range(2):
            assert torch.equal(model(x), reference(x))


class RMSNorm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class Decoder(torch.nn.Module):
    """A Llama-style layer without attention: norms, residual adds, a gated MLP."""

    def __init__(self, width=64, hidden=176):
        super().__init__()
        self.norm = RMSNorm(width)
        self.mix = torch.nn.Linear(width, width, bias=False)
        self.norm2 = RMSNorm(width)
        self.gate = torch.nn.Linear(width, hidden, bias=False)
        self.up = torch.nn.Linear(width, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        x = x + self.mix(self.norm(x))
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class TinyLm(torch.nn.Module):
    def __init__(self, layers=4, width=64):
        super().__init__()
        self.embed = torch.nn.Embedding(100, width)
        self.layers = torch.nn.ModuleList(Decoder(width) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = torch.nn.Linear(width, 100, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def tiny_lm():
    torch.manual_seed(0)
    return TinyLm().to(torch.bfloat16).eval()


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch 2")
def test_torch_compile_on_the_host_equals_the_resident_compile():
    # bf16: Inductor fuses each layer's residual add into the next layer's input norm, keeping
    # the sum in fp32. The stream's ops stand after the down projections and the first layer's
    # wait at the end of the pass before, so the offloaded compile fuses the same (with the ops
    # at the layers' edges, tails=False, its logits differ).
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 100, (4, 16), generator=g) for _ in range(2)]
    with torch.inference_mode():
        resident = torch.compile(tiny_lm())
        want = [resident(ids) for ids in batches]
        for selection in ({"prefetch": 1}, {"group_size": 2, "last": 1, "prefetch": 1}):
            model = tiny_lm()
            off = ferry.torch.offload(model, device="cpu", **selection)
            compiled = torch.compile(model)
            for _ in range(2):
                for ids, w in zip(batches, want):
                    assert torch.equal(compiled(ids), w)
            assert off.stats()["fills"] > len(off.layers) and off.stats()["demand_fills"] == 0


def test_a_dropped_model_frees_its_stream():
    import gc
    from ferry.offload import _ops as _offload

    model = make()
    handle = ferry.torch.offload(model, device="cpu").handle
    assert handle in _offload._live
    del model
    gc.collect()
    assert handle not in _offload._live


def test_disk_source_with_other_weights_gives_the_checkpoints_outputs(tmp_path):
    reference = make()
    path = tmp_path / "model.safetensors"
    ferry.torch.save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    for selection in ({"prefetch": 3}, {"group_size": 3, "last": 2, "prefetch": 1}):
        model = make(seed=7)
        for name in ("embed", "head"):
            getattr(model, name).load_state_dict(getattr(reference, name).state_dict())
        for i in range(6):
            model.layers[i].load_state_dict(reference.layers[i].state_dict())
            if i % 3 or "group_size" not in selection:  # streamed: the model's bytes are not used
                for p in model.layers[i].parameters():
                    p.data.fill_(7.0)
        off = ferry.torch.offload(model, device="cpu", source="disk", checkpoint=path,
                                  io="buffered", **selection)
        with torch.no_grad():
            for _ in range(2):
                for x in inputs():
                    assert torch.equal(model(x), reference(x))
        assert off.stats()["bytes"] >= 2 * off.streamed_bytes


def test_disk_source_takes_blocks_on_the_meta_device(tmp_path):
    reference = make()
    path = tmp_path / "model.safetensors"
    ferry.torch.save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    model = make()
    model.layers.to("meta")  # never materialised: the blocks come from the file only
    ferry.torch.offload(model, device="cpu", source="disk", checkpoint=path, prefetch=2)
    with torch.no_grad():
        for x in inputs():
            assert torch.equal(model(x), reference(x))
    with pytest.raises(ValueError, match="meta"):
        other = make()
        other.layers.to("meta")
        ferry.torch.offload(other, device="cpu")


def test_disk_source_shape_mismatch_is_refused(tmp_path):
    other = make(hidden=64)
    path = tmp_path / "model.safetensors"
    ferry.torch.save_file({k: v.contiguous() for k, v in other.state_dict().items()}, path)
    with pytest.raises(ValueError, match=r'"layers.0.up.weight" is F32 \[64, 32\]'):
        ferry.torch.offload(make(), device="cpu", source="disk", checkpoint=path)
    with pytest.raises(ValueError, match="has no tensor"):
        ferry.torch.offload(make(), device="cpu", source="disk", checkpoint=path, prefix="model.")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="prefetch distance of 0"):
        ferry.torch.offload(make(), device="cpu", prefetch=0)
    with pytest.raises(ValueError, match="prefetch distance of 7"):
        ferry.torch.offload(make(), device="cpu", prefetch=7)
    with pytest.raises(ValueError, match="more than streaming can save"):
        ferry.torch.offload(make(), device="cpu", budget_bytes=10**9)
    with pytest.raises(ValueError, match="source"):
        ferry.torch.offload(make(), device="cpu", source="gpu")
    with pytest.raises(ValueError, match="checkpoint="):
        ferry.torch.offload(make(), device="cpu", source="disk")
    with pytest.raises(ValueError, match="not indices"):
        ferry.torch.offload(make(), device="cpu", layers=[6])
    model = make()
    model.layers[1].up.weight = model.layers[0].up.weight
    with pytest.raises(ValueError, match="shared"):
        ferry.torch.offload(model, device="cpu")
    model = make()
    model.head.weight = torch.nn.Parameter(torch.zeros(5, 32))
    model.extra = torch.nn.Linear(96, 32, bias=False)
    model.extra.weight = model.layers[2].down.weight
    with pytest.raises(ValueError, match="outside the streamed blocks"):
        ferry.torch.offload(model, device="cpu")


def test_expert_cache_from_python():
    experts = [[torch.full((64,), float(e)) for _ in range(2)] for e in range(5)]
    groups = [[(t.numel() * 4, t.data_ptr(), 0, 0) for t in ts] for ts in experts]
    cache = _ferry.ExpertCache(groups, 2, "cpu", policy="lru")
    for e in (0, 1, 0, 3, 4, 0):
        (slot,) = cache.acquire([e], 0)
        addr = cache.slot_address(slot)
        import ctypes
        view = torch.frombuffer((ctypes.c_uint8 * 256).from_address(addr), dtype=torch.float32)
        assert torch.equal(view, experts[e][0])
        cache.release([e])
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (1, 5)
    with pytest.raises(ValueError, match="policy"):
        _ferry.ExpertCache(groups, 2, "cpu", policy="random")
