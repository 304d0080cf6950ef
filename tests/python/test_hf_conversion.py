"""The placement behind ferry.transformers' fused experts (transformers 5): each expert's tensor
goes to one contiguous block of the fused parameter, and the blocks filled from the checkpoint
equal transformers' conversion (stack the experts, then concatenate gate and up on dim 1),
computed here with torch itself. Needs no transformers (its end-to-end check against
transformers' own loader is in test_transformers.py)."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import ferry  # noqa: E402
from ferry import _ferry, _hf_conversion  # noqa: E402
from ferry._dtypes import tensor_table  # noqa: E402


def _experts(count, rows, cols, seed, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn((rows, cols), generator=generator).to(dtype) for _ in range(count)]


def test_expert_blocks_equal_stack_then_concatenate(tmp_path):
    experts, inter, hidden = 5, 6, 8
    gate, up, down = _experts(experts, inter, hidden, 1), _experts(experts, inter, hidden, 2), \
        _experts(experts, hidden, inter, 3)
    state = {f"l.experts.{e}.{kind}": t for kind, group in (("w1", gate), ("w3", up), ("w2", down))
             for e, t in enumerate(group)}
    path = tmp_path / "experts.safetensors"
    safetensors_torch.save_file(state, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    table = tensor_table(checkpoint)
    names = lambda kind: [f"l.experts.{e}.{kind}" for e in range(experts)]  # noqa: E731
    want = {"gate_up": torch.cat([torch.stack(gate), torch.stack(up)], dim=1),
            "down": torch.stack(down)}
    plans = {"gate_up": _hf_conversion._blocks(want["gate_up"], [names("w1"), names("w3")], table),
             "down": _hf_conversion._blocks(want["down"], [names("w2")], table)}
    for key, blocks in plans.items():
        assert blocks is not None and len({n for n, _ in blocks}) == len(blocks) == len(table) - (
            experts if key == "gate_up" else 2 * experts)
        fused = torch.full_like(want[key], float("nan"))
        destinations = [(name, fused.data_ptr() + offset * fused.element_size(), table[name][2])
                        for name, offset in blocks]
        _ferry.load_into(checkpoint, destinations, "cpu")
        assert torch.equal(fused.view(torch.int16), want[key].view(torch.int16)), key


def test_blocks_that_do_not_fit_are_left_to_transformers(tmp_path):
    """A missing expert, rows that do not add up, mixed dtypes or shapes: no plan (None)."""
    tensors = {f"e.{i}": t for i, t in enumerate(_experts(3, 4, 8, 4))}
    tensors["odd"] = torch.zeros((5, 8), dtype=torch.bfloat16)
    tensors["f32"] = torch.zeros((4, 8), dtype=torch.float32)
    path = tmp_path / "some.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    table = tensor_table(_ferry.Checkpoint.open(str(path)))
    fused = torch.empty((3, 4, 8), dtype=torch.bfloat16, device="meta")
    assert _hf_conversion._blocks(fused, [["e.0", "e.1", "e.2"]], table) is not None
    assert _hf_conversion._blocks(fused, [["e.0", "e.1"]], table) is None  # an expert missing
    assert _hf_conversion._blocks(fused, [["e.0", "e.1", "odd"]], table) is None  # shapes differ
    assert _hf_conversion._blocks(fused, [["e.0", "e.1", "f32"]], table) is None  # dtypes differ
    wider = torch.empty((3, 8, 8), dtype=torch.bfloat16, device="meta")
    assert _hf_conversion._blocks(wider, [["e.0", "e.1", "e.2"]], table) is None  # 4 of 8 rows
    assert _hf_conversion._blocks(wider, [["e.0", "e.1", "e.2"], None], table) is None


def test_natural_order_puts_expert_2_before_10():
    names = ["m.experts.10.w", "m.experts.2.w", "m.experts.1.w", "m.norm"]
    assert sorted(names, key=_hf_conversion._natural) == \
        ["m.experts.1.w", "m.experts.2.w", "m.experts.10.w", "m.norm"]


def test_without_transformers_5_there_is_no_plan():
    """transformers 4 (or none) has no conversion mapping: the caller keeps its own route."""
    try:
        import transformers.conversion_mapping  # noqa: F401
        pytest.skip("transformers 5 is installed: test_transformers.py covers its route")
    except ImportError:
        pass
    model = torch.nn.Linear(2, 2)
    assert _hf_conversion.plan(model, {}) is None


def test_a_plan_fills_fused_parameters_and_casts_like_transformers(tmp_path):
    """from_pretrained's fused route on a hand-made plan (what plan() makes from transformers
    5's mapping): every parameter gets its memory, one load fills the blocks, the checkpoint's
    bf16 is cast to the model's float32 after (elementwise: the same as casting each expert
    before the stack), and nothing is left on meta."""
    import ferry.transformers as front

    experts, inter, hidden = 3, 4, 8

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(experts, 2 * inter, hidden))
            self.down_proj = torch.nn.Parameter(torch.empty(experts, hidden, inter))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = Experts()
            self.norm = torch.nn.Parameter(torch.empty(hidden))

    with front._parameters_on_meta():
        model = Model()
    gate, up, down = _experts(experts, inter, hidden, 5), _experts(experts, inter, hidden, 6), \
        _experts(experts, hidden, inter, 7)
    state = {f"e.{i}.{kind}": t for kind, group in (("w1", gate), ("w3", up), ("w2", down))
             for i, t in enumerate(group)}
    state["n"] = torch.randn(hidden).to(torch.bfloat16)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(state, str(path))
    checkpoint = _ferry.Checkpoint.open(str(path))
    table = tensor_table(checkpoint)
    plan = _hf_conversion.Plan()
    plan.direct = {"n": "norm"}
    names = lambda kind: [f"e.{i}.{kind}" for i in range(experts)]  # noqa: E731
    plan.fused = {
        "experts.gate_up_proj": _hf_conversion._blocks(model.experts.gate_up_proj, [names("w1"), names("w3")], table),
        "experts.down_proj": _hf_conversion._blocks(model.experts.down_proj, [names("w2")], table)}
    loaded = front._load_converted(model, plan, checkpoint, table, str(path), "cpu",
                                   front._tied_names(model), True)
    assert loaded is model and front.loaded_by(model) == front.FERRY and not model.training
    want_gate_up = torch.cat([torch.stack([t.float() for t in gate]), torch.stack([t.float() for t in up])], 1)
    assert model.experts.gate_up_proj.dtype == torch.float32
    assert torch.equal(model.experts.gate_up_proj, want_gate_up)
    assert torch.equal(model.experts.down_proj, torch.stack([t.float() for t in down]))
    assert torch.equal(model.norm, state["n"].float())
    assert isinstance(model.norm, torch.nn.Parameter)
    assert model._ferry_stats["tensor_bytes"] == sum(t.numel() * 2 for t in state.values())
    with front._parameters_on_meta():
        partial = Model()
    plan.direct = {}
    with pytest.raises(RuntimeError, match="norm"):  # strict: a parameter nothing fills
        front._load_converted(partial, plan, checkpoint, table, str(path), "cpu",
                              front._tied_names(partial), True)
