"""A real architecture from transformers, saved as sharded safetensors by save_pretrained: ferry's
tensors and logits equal transformers' own loader's. Needs a GPU and transformers."""
import os

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import ferry.torch  # noqa: E402


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, vocab_size=4096,
                                      torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, max_shard_size="2MB", safe_serialization=True)
    assert (path / "model.safetensors.index.json").exists(), "sharded with an index"
    return path


def test_state_dict_and_logits_equal_transformers(saved_llama):
    reference = transformers.AutoModelForCausalLM.from_pretrained(saved_llama, torch_dtype=torch.bfloat16).to("cuda:0").eval()
    ours = ferry.torch.load_file(saved_llama, device="cuda:0")
    theirs = reference.state_dict()
    for name, tensor in ours.items():
        assert tensor.device.type == "cuda"
        assert torch.equal(tensor, theirs[name]), name

    # A second copy of the model with every weight destroyed, then refilled in place by ferry:
    # the same modules and buffers as transformers builds them, so logits must match exactly.
    model = transformers.AutoModelForCausalLM.from_pretrained(saved_llama, torch_dtype=torch.bfloat16).to("cuda:0").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0)
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    stats = ferry.torch.load_into(model, saved_llama)
    assert stats["missing"] == [] and stats["unexpected"] == []
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == pointers
    tokens = torch.randint(0, model.config.vocab_size, (2, 32), device="cuda:0")
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, reference(tokens).logits)
