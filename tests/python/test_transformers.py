"""ferry.transformers.from_pretrained against transformers' own from_pretrained: the same
parameters and bit-identical logits for a Llama (untied), a Qwen2 (tied embeddings, biases) and
two MoE models (Mixtral; Qwen2-MoE with a shared expert), each saved by save_pretrained as shards
with an index. On the CPU everywhere transformers imports; on cuda:0 too where a GPU is present.
With transformers 5 the MoE models' per-expert tensors are read by ferry into transformers'
fused expert parameters."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (tools/install_deps.sh installs 4.40.2)")

import ferry.transformers  # noqa: E402

V5 = int(transformers.__version__.split(".")[0]) >= 5

DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, tie_word_embeddings=False),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, tie_word_embeddings=True),  # q/k/v have biases
    "mixtral": lambda: transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=48,
                                                     shared_expert_intermediate_size=80),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    config.torch_dtype = torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with torch.no_grad():  # biases are zero at init: make every parameter distinct
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, max_shard_size="100KB", safe_serialization=True)
    assert (path / "model.safetensors.index.json").exists(), "sharded with an index"
    return request.param, path


def _theirs(path, device, dtype):
    kwarg = "dtype" if V5 else "torch_dtype"  # transformers 5 renamed it
    return transformers.AutoModelForCausalLM.from_pretrained(path, **{kwarg: dtype}).to(device).eval()


def _expected_route(arch):
    """ferry's tensors become the parameters for every model here: in transformers 5 the MoE
    models' per-expert tensors are read into the blocks of the fused expert parameters."""
    return ferry.transformers.FERRY


def _fused_experts(model):
    """Names of 3-D expert parameters (transformers 5 fuses experts into them)."""
    return [n for n, p in model.named_parameters() if "experts" in n and p.dim() == 3]


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_and_logits_equal_transformers(saved, device):
    arch, path = saved
    theirs = _theirs(path, device, torch.bfloat16)
    ours = ferry.transformers.from_pretrained(transformers.AutoModelForCausalLM, path, device=device,
                                              torch_dtype=torch.bfloat16)
    assert type(ours) is type(theirs)
    assert not ours.training
    assert ferry.transformers.loaded_by(ours) == _expected_route(arch)
    assert ours._ferry_stats is not None  # ferry read the checkpoint on either route
    if V5 and arch in ("mixtral", "qwen2_moe"):
        assert _fused_experts(ours), "transformers 5 fuses the experts"
        checkpoint_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        # Every tensor read once, into its place: no more than the files hold.
        assert ours._ferry_stats["tensor_bytes"] <= checkpoint_bytes
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state.keys() == theirs_state.keys()
    for name, tensor in theirs_state.items():
        assert ours_state[name].device == tensor.device, name
        assert ours_state[name].dtype == tensor.dtype and torch.equal(ours_state[name], tensor), name
    tied = ours.config.tie_word_embeddings
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    assert (theirs.lm_head.weight is theirs.model.embed_tokens.weight) == tied
    tokens = torch.randint(0, ours.config.vocab_size, (2, 24), device=device)
    with torch.no_grad():
        assert torch.equal(ours(tokens).logits, theirs(tokens).logits)


def test_concrete_class_default_dtype_and_a_cast(saved):
    arch, path = saved
    cls = type(transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]()))
    ours = ferry.transformers.from_pretrained(cls, path)  # dtype: the checkpoint's (config.torch_dtype)
    assert type(ours) is cls
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    assert ferry.transformers.loaded_by(ours) == _expected_route(arch)
    as_float = ferry.transformers.from_pretrained(cls, path, torch_dtype=torch.float32)
    assert {p.dtype for p in as_float.parameters()} == {torch.float32}
    assert ferry.transformers.loaded_by(as_float) == _expected_route(arch)
    theirs = _theirs(path, "cpu", torch.float32)
    tokens = torch.randint(0, theirs.config.vocab_size, (1, 16))
    with torch.no_grad():
        assert torch.equal(as_float(tokens).logits, theirs(tokens).logits)


def test_a_missing_weight_is_an_error_naming_it(tmp_path):
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(CONFIGS["llama"]())
    state = {k: v for k, v in model.state_dict().items() if k != "model.norm.weight"}
    model.save_pretrained(tmp_path, state_dict=state, safe_serialization=True)
    with pytest.raises(RuntimeError, match="model.norm.weight"):
        ferry.transformers.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)


def test_from_pretrained_benchmark_smoke_run(tmp_path):
    """bench/load/from_pretrained_bench.py end to end on a tiny model on the CPU; timing is not checked."""
    import json
    import pathlib
    import subprocess
    import sys

    bench = pathlib.Path(__file__).resolve().parents[2] / "bench" / "load" / "from_pretrained_bench.py"
    out = tmp_path / "runs.json"
    done = subprocess.run([sys.executable, str(bench), str(tmp_path), "--model", "tiny-llama", "--device", "cpu",
                           "--runs", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parameters equal bit for bit" in done.stdout
    assert {r["loader"] for r in json.loads(out.read_text())} == {"ferry", "transformers"}


def test_names_that_need_transformers_renames_go_through_its_loader(tmp_path):
    """A checkpoint with legacy names (LayerNorm.gamma/beta): ferry reads it and transformers
    renames, so the model still equals transformers' own load."""
    import ferry.torch

    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=128)
    torch.manual_seed(2)
    model = transformers.BertForMaskedLM(config)
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in model.state_dict().items() if k != "cls.predictions.decoder.weight"}  # tied
    state = {k: v.clone().contiguous() for k, v in state.items()}
    ferry.torch.save_file(state, tmp_path / "model.safetensors", {"format": "pt"})
    config.save_pretrained(tmp_path)
    ours = ferry.transformers.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path, torch_dtype=torch.float32)
    assert ferry.transformers.loaded_by(ours) == ferry.transformers.CONVERTED  # never transformers alone
    assert ours._ferry_stats is not None
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        assert torch.equal(ours(tokens).logits, theirs(tokens).logits)
