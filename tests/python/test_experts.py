"""ferry.torch.offload_experts on the host (GPU runs the same tests on cuda:0 where one exists):
Mixtral-style MoEs (router + ModuleList of experts, as transformers 4 builds them; fused
[experts, ...] parameters, as transformers 5 does) whose expert caches hold fewer experts than
the model has give outputs equal to the resident model, from the arena and from a checkpoint,
with either policy; transformers' own Mixtral likewise; undo; bad settings are refused."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")

import ferry.torch  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])


class Expert(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.w1 = torch.nn.Linear(width, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, width, bias=False)
        self.w3 = torch.nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class Moe(torch.nn.Module):
    """transformers 4's Mixtral block, in its own words: route, then loop over the hit experts."""

    def __init__(self, width=32, hidden=64, experts=8, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = torch.nn.Linear(width, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert(width, hidden) for _ in range(experts))

    def forward(self, x):
        logits = self.gate(x)
        weights = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist():
            idx, rows = torch.where(mask[e])
            out.index_add_(0, rows, self.experts[e](x[rows]) * weights[rows, idx, None])
        return out


class Net(torch.nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.embed = torch.nn.Linear(8, 32)
        self.moes = torch.nn.ModuleList(Moe() for _ in range(layers))

    def forward(self, x):
        h = self.embed(x)
        for moe in self.moes:
            h = h + moe(h)
        return h


class FusedExperts(torch.nn.Module):
    """transformers 5's fused experts (their eager forward), in its own words: [experts, ...]
    parameters, and a forward given the router's top-k indices and weights."""

    def __init__(self, width=32, hidden=64, experts=8):
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 2 * hidden, width) / width ** 0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(experts, width, hidden) / hidden ** 0.5)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist():
            pos, rows = torch.where(mask[e])
            gate, up = torch.nn.functional.linear(hidden_states[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, self.down_proj[e])
            out.index_add_(0, rows, h * top_k_weights[rows, pos, None])
        return out


class GroupedExperts(FusedExperts):
    """transformers 5's default (grouped_mm) forward, in its own words: the token-expert pairs
    sorted by expert, one matmul per expert's run of rows, the top-k terms summed per token."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        k = top_k_index.shape[-1]
        ids = top_k_index.reshape(-1)
        ids_sorted, order = torch.sort(ids, stable=True)
        rows = hidden_states[order // k]
        counts = torch.bincount(ids_sorted, minlength=self.num_experts).tolist()
        h = torch.zeros(ids.numel(), hidden_states.shape[-1], dtype=hidden_states.dtype,
                        device=hidden_states.device)
        start = 0
        for e, n in enumerate(counts):
            if n:
                gate, up = torch.nn.functional.linear(rows[start:start + n],
                                                      self.gate_up_proj[e]).chunk(2, dim=-1)
                h[start:start + n] = torch.nn.functional.linear(
                    torch.nn.functional.silu(gate) * up, self.down_proj[e])
            start += n
        weighted = torch.empty_like(h)
        weighted[order] = h * top_k_weights.reshape(-1)[order, None]
        return weighted.view(-1, k, h.shape[-1]).sum(dim=1)


class FusedMoe(torch.nn.Module):
    def __init__(self, width=32, experts=8, top_k=2, experts_cls=FusedExperts):
        super().__init__()
        self.top_k = top_k
        self.router = torch.nn.Linear(width, experts, bias=False)
        self.experts = experts_cls(width, experts=experts)

    def forward(self, x):
        weights = torch.softmax(self.router(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.experts(x, chosen, weights)


class FusedNet(Net):
    def __init__(self, layers=3, experts_cls=FusedExperts):
        super().__init__(0)
        self.moes = torch.nn.ModuleList(FusedMoe(experts_cls=experts_cls) for _ in range(layers))


class GroupedNet(FusedNet):
    def __init__(self):
        super().__init__(experts_cls=GroupedExperts)


def make(device, seed=0, cls=Net):
    torch.manual_seed(seed)
    return cls().to(device).eval()


def batches(device, n=6):
    g = torch.Generator().manual_seed(9)
    return [torch.randn(5, 8, generator=g).to(device) for _ in range(n)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["lru", "frequency"])
@pytest.mark.parametrize("slots,speculative", [(2, 0), (3, 1), (5, 2)])
def test_outputs_equal_resident(device, policy, slots, speculative):
    reference = make(device)
    model = make(device)
    off = ferry.torch.offload_experts(model, slots=slots, policy=policy, speculative=speculative,
                                      device=device)
    with torch.no_grad():
        for _ in range(2):
            for x in batches(device):
                assert torch.equal(model(x), reference(x))
    stats = off.stats()
    assert stats["misses"] > 0 and stats["hits"] > 0
    assert stats["bytes"] >= stats["misses"] * 3 * 32 * 64 * 4


@pytest.mark.parametrize("device", DEVICES)
def test_disk_source_and_undo(device, tmp_path):
    reference = make(device)
    path = tmp_path / "moe.safetensors"
    ferry.torch.save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    model = make(device, seed=3)
    model.embed.load_state_dict(reference.embed.state_dict())
    for a, b in zip(model.moes, reference.moes):
        a.gate.load_state_dict(b.gate.state_dict())  # experts: only the file's bytes are used
    off = ferry.torch.offload_experts(model, slots=3, source="disk", checkpoint=path,
                                      device=device, io="buffered")
    with torch.no_grad():
        for x in batches(device):
            assert torch.equal(model(x), reference(x))
    off.undo()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), n
    assert "forward" not in model.moes[0].experts[0].__dict__


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slots", [2, 3, 8])
@pytest.mark.parametrize("cls", [FusedNet, GroupedNet])
def test_fused_experts_equal_resident(device, slots, cls):
    reference = make(device, cls=cls)
    model = make(device, cls=cls)
    off = ferry.torch.offload_experts(model, slots=slots, speculative=1, device=device)
    # Outside forward the parameters keep their shapes (every expert reads slot 0 there).
    assert model.moes[0].experts.gate_up_proj.shape == (8, 128, 32)
    with torch.no_grad():
        for _ in range(2):
            for x in batches(device):  # 5 tokens x top-2: up to 8 experts hit, over 2 slots too
                assert torch.equal(model(x), reference(x))
    assert off.stats()["misses"] > 0
    off.undo()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("device", DEVICES)
def test_fused_experts_from_disk(device, tmp_path):
    reference = make(device, cls=FusedNet)
    path = tmp_path / "fused.safetensors"
    ferry.torch.save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    model = make(device, seed=4, cls=FusedNet)
    model.embed.load_state_dict(reference.embed.state_dict())
    for a, b in zip(model.moes, reference.moes):
        a.router.load_state_dict(b.router.state_dict())
    ferry.torch.offload_experts(model, slots=3, source="disk", checkpoint=path, device=device,
                                io="buffered")
    with torch.no_grad():
        for x in batches(device):
            assert torch.equal(model(x), reference(x))


class RecordingExperts(FusedExperts):
    """Records what each expert computes on: (its gate_up_proj bytes, the rows it multiplies)
    for every expert given a token at a nonzero routing weight."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist():
            pos, rows = torch.where(mask[e])
            if bool((top_k_weights[rows, pos] != 0).any()):
                self.log.append((self.gate_up_proj[e].cpu().numpy().tobytes(),
                                 hidden_states[rows].cpu().numpy().tobytes()))
        return super().forward(hidden_states, top_k_index, top_k_weights)


@pytest.mark.parametrize("slots", [2, 3])
def test_fused_experts_compute_on_resident_rows(slots):
    """Bitwise equality rests on each expert's matmuls running on exactly the rows they run on
    resident (a GEMM's result for a row may depend on how many rows it multiplies at once):
    where more experts are hit than there are slots, no expert gets another's tokens."""
    nets = [make("cpu", cls=FusedNet) for _ in range(2)]
    for net in nets:
        for moe in net.moes:
            moe.experts.__class__ = RecordingExperts
            moe.experts.log = []
    model, reference = nets
    off = ferry.torch.offload_experts(model, slots=slots, device="cpu")
    with torch.no_grad():
        for x in batches("cpu"):
            assert torch.equal(model(x), reference(x))
    for a, b in zip(model.moes, reference.moes):
        assert sorted(a.experts.log) == sorted(b.experts.log)
    assert off.stats()["misses"] > 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slots"):
        ferry.torch.offload_experts(make("cpu"), slots=9, device="cpu")
    with pytest.raises(ValueError, match="park"):
        ferry.torch.offload_experts(make("cpu", cls=FusedNet), slots=1, device="cpu")
    with pytest.raises(ValueError, match="no MoE block"):
        ferry.torch.offload_experts(torch.nn.Linear(2, 2), slots=1, device="cpu")
    model = make("cpu")
    model.moes[1].experts[3].w1 = torch.nn.Linear(32, 65, bias=False)
    with pytest.raises(ValueError, match="differ"):
        ferry.torch.offload_experts(model, slots=2, device="cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_transformers_mixtral(device):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=6, num_experts_per_tok=2,
                                        vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    reference = transformers.MixtralForCausalLM(config).to(device).eval()
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).to(device).eval()
    off = ferry.torch.offload_experts(model, slots=3, device=device)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(ids).logits, reference(ids).logits)
    assert off.stats()["misses"] > 0
