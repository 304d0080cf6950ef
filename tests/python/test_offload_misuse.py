"""Misuse of ferry.torch.offload and offload_experts is refused clearly, never silently wrong:
a second offload of one model, parameters changed in place after offloading (load_state_dict, an
optimizer step), stats after undo, the meta device, settings that choose no block; and a MoE
block that calls its experts token by token runs right with fewer slots than experts."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")

import ferry.torch  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width, bias=False)
        self.down = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Expert(torch.nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.w1 = torch.nn.Linear(width, 32, bias=False)
        self.w2 = torch.nn.Linear(32, width, bias=False)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


class Moe(torch.nn.Module):
    """A router and experts; `per_token`: the experts run token by token, in the order each
    token chose them (as many custom MoE layers do), not in ascending expert order."""

    def __init__(self, per_token=False, experts=8, top_k=2, width=16):
        super().__init__()
        self.gate = torch.nn.Linear(width, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert(width) for _ in range(experts))
        self.top_k, self.per_token = top_k, per_token

    def forward(self, x):
        weights, chosen = torch.topk(torch.softmax(self.gate(x), -1), self.top_k, dim=-1)
        out = torch.zeros_like(x)
        if self.per_token:
            for i in range(x.shape[0]):
                for j in range(self.top_k):
                    out[i] += weights[i, j] * self.experts[int(chosen[i, j])](x[i:i + 1])[0]
            return out
        for e in range(len(self.experts)):
            rows, k = torch.where(chosen == e)
            if len(rows):
                out[rows] += weights[rows, k, None] * self.experts[e](x[rows])
        return out


def make(cls=Net, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(**kw).eval()


def x_in():
    return torch.randn(6, 16, generator=torch.Generator().manual_seed(3))


def test_a_second_offload_of_one_model_is_refused():
    model = make()
    ferry.torch.offload(model, device="cpu")
    with pytest.raises(RuntimeError, match="offloaded already"):
        ferry.torch.offload(model, device="cpu")
    moe = make(Moe)
    ferry.torch.offload_experts(moe, slots=2, device="cpu")
    with pytest.raises(RuntimeError, match="offloaded already"):
        ferry.torch.offload_experts(moe, slots=2, device="cpu")


def test_after_undo_the_model_can_be_offloaded_again():
    reference, model = make(), make()
    ferry.torch.offload(model, device="cpu").undo()
    ferry.torch.offload(model, device="cpu")
    with torch.no_grad():
        assert torch.equal(model(x_in()), reference(x_in()))
    moe_reference, moe = make(Moe), make(Moe)
    ferry.torch.offload_experts(moe, slots=2, device="cpu").undo()
    ferry.torch.offload_experts(moe, slots=2, device="cpu")
    with torch.no_grad():
        assert torch.equal(moe(x_in()), moe_reference(x_in()))


def test_load_state_dict_after_offload_is_refused_at_the_next_pass():
    model, other = make(), make(seed=1)
    ferry.torch.offload(model, device="cpu")
    model.load_state_dict(other.state_dict())
    with pytest.raises(RuntimeError, match="changed in place after offloading"):
        with torch.no_grad():
            model(x_in())


def test_an_optimizer_step_after_offload_is_refused_at_the_next_pass():
    model = make()
    ferry.torch.offload(model, device="cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x_in()).sum().backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match="changed in place after offloading"):
        model(x_in())


def test_load_state_dict_after_offload_experts_is_refused():
    moe, other = make(Moe), make(Moe, seed=1)
    ferry.torch.offload_experts(moe, slots=2, device="cpu")
    moe.load_state_dict(other.state_dict())
    with pytest.raises(RuntimeError, match="changed in place after offloading"):
        with torch.no_grad():
            moe(x_in())


@pytest.mark.parametrize("slots", [1, 2, 3, 8])
def test_experts_called_token_by_token_equal_resident(slots):
    reference, moe = make(Moe, per_token=True), make(Moe, per_token=True)
    ferry.torch.offload_experts(moe, slots=slots, device="cpu")
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(moe(x_in()), reference(x_in()))


def test_stats_after_undo_say_so():
    off = ferry.torch.offload(make(), device="cpu")
    off.undo()
    with pytest.raises(RuntimeError, match="after undo"):
        off.stats()


def test_the_meta_device_is_refused_by_name():
    with pytest.raises(ValueError, match="meta device"):
        ferry.torch.offload(make(), device="meta")
    with pytest.raises(ValueError, match="meta device"):
        ferry.torch.offload_experts(make(Moe), slots=2, device="meta")


def test_a_group_larger_than_the_blocks_is_named():
    with pytest.raises(ValueError, match="group_size 10 is more than the 4 blocks"):
        ferry.torch.offload(make(), device="cpu", group_size=10)


def test_plan_offload_refuses_zero_steps_and_bad_layers():
    with pytest.raises(ValueError, match="steps must be 1 or more"):
        ferry.torch.plan_offload(make(), lambda: None, link_bytes_per_second=1e9, steps=0)
    with pytest.raises(ValueError, match="not indices"):
        ferry.torch.plan_offload(make(), lambda: None, link_bytes_per_second=1e9, layers=[-1])
