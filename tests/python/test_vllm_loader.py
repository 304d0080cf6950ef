"""Load format "ferry" in the real vllm (skipped without it): the plugin is found through vLLM's
entry points, get_model_loader gives ferry's loader, and vLLM's own model classes built on the
CPU through load_format="ferry" hold every parameter bit for bit as through "safetensors"."""
import os
import socket

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
pytest.importorskip("vllm")

import vllm_helpers  # noqa: E402,F401  (VLLM_TARGET_DEVICE=cpu)
import torch  # noqa: E402
import transformers  # noqa: E402


def test_entry_point_registers_everything():
    from importlib.metadata import entry_points

    import vllm.plugins
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    names = [e.value for e in entry_points(group="vllm.general_plugins")]
    assert "ferry.vllm:register" in names
    vllm.plugins.load_general_plugins()
    from ferry.vllm.loader import FerryModelLoader
    assert type(get_model_loader(LoadConfig(load_format="ferry"))) is FerryModelLoader
    assert SecondaryTierFactory.get_tier_class({"type": "ferry"}).__name__ == "FerryTierManager"
    spec = OffloadingSpecFactory.get_spec_cls({"spec_name": "FerryOffloadingSpec"})
    assert spec.__name__ == "FerryOffloadingSpec"
    import ferry.vllm
    ferry.vllm.register()  # again: vLLM may call it more than once per process


def test_loader_options_are_checked():
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    import ferry.vllm
    ferry.vllm.register()
    loader = get_model_loader(LoadConfig(load_format="ferry",
                                         model_loader_extra_config={"threads": 4}))
    assert loader.options == {"threads": 4}
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['thread'\]"):
        get_model_loader(LoadConfig(load_format="ferry", model_loader_extra_config={"thread": 4}))
    with pytest.raises(ValueError, match="threads must be int"):
        get_model_loader(LoadConfig(load_format="ferry",
                                    model_loader_extra_config={"threads": "many"}))
    with pytest.raises(ValueError, match=r"tp_mode 'sliced' is not one of \['process_group', "
                                         r"'slices', 'group_slices', 'each_rank_reads_all', "
                                         r"'auto'\]"):
        get_model_loader(LoadConfig(load_format="ferry",
                                    model_loader_extra_config={"tp_mode": "sliced"}))
    # The slices' reader takes no engine options; auto's group load does.
    with pytest.raises(ValueError, match='tp_mode "slices" reads slices .*threads'):
        get_model_loader(LoadConfig(load_format="ferry",
                                    model_loader_extra_config={"tp_mode": "slices", "threads": 4}))
    loader = get_model_loader(LoadConfig(load_format="ferry",
                                         model_loader_extra_config={"tp_mode": "auto", "threads": 4}))
    assert loader.tp_mode == "auto" and loader.options == {"threads": 4}


def test_checkpoint_path_errors(tmp_path):
    from ferry.vllm.loader import checkpoint_path
    with pytest.raises(RuntimeError, match="no \\*.safetensors"):
        checkpoint_path(str(tmp_path))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="GGUF"):
        checkpoint_path(str(tmp_path))


@pytest.fixture(scope="module")
def distributed():
    from vllm.distributed import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        from vllm.config import VllmConfig, set_current_vllm_config
        with set_current_vllm_config(VllmConfig()):
            parallel_state.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
            parallel_state.initialize_model_parallel(1, 1)
    yield


def build(folder, load_format, extra=None, process=True):
    """vLLM's model through get_model (process=False: created and filled by the loader, without
    vLLM's post-processing of the weights)."""
    from vllm.config import (DeviceConfig, LoadConfig, ModelConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.model_executor.model_loader import get_model, get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype
    import ferry.vllm
    ferry.vllm.register()
    config = VllmConfig(model_config=ModelConfig(model=str(folder), dtype="bfloat16",
                                                 skip_tokenizer_init=True),
                        load_config=LoadConfig(load_format=load_format,
                                               model_loader_extra_config=extra or {}),
                        device_config=DeviceConfig("cpu"))
    with set_current_vllm_config(config):
        if process:
            model = get_model(vllm_config=config)
        else:
            loader = get_model_loader(config.load_config)
            with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
                model = loader.create_model(vllm_config=config, model_config=config.model_config)
            loader.load_weights(model, config.model_config)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name


def save(model, folder, **kw):
    model.to(torch.bfloat16).save_pretrained(folder, **kw)
    return folder


def test_llama_one_file(tmp_path, distributed):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128)
    folder = save(transformers.LlamaForCausalLM(config), tmp_path / "llama")
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    reference = build(folder, "safetensors")
    assert_same(build(folder, "ferry", {"threads": 2, "group_bytes": 64 << 10}), reference)


def test_qwen2_shards_with_index_biases_tied(tmp_path, distributed):
    torch.manual_seed(1)
    config = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=True)
    folder = save(transformers.Qwen2ForCausalLM(config), tmp_path / "qwen2",
                  max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 2
    reference = build(folder, "safetensors")
    assert any(name.endswith("q_proj.bias") or name.endswith("qkv_proj.bias")
               for name in reference)
    assert_same(build(folder, "ferry"), reference)


def test_moe(tmp_path, distributed):
    torch.manual_seed(2)
    config = transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=128)
    folder = save(transformers.MixtralForCausalLM(config), tmp_path / "mixtral")
    # The weights as the loaders leave them: vLLM's CPU MoE then repacks them with a kernel
    # (_C.prepack_moe_weight) that this wheel, built without CPU kernels, lacks.
    reference = build(folder, "safetensors", process=False)
    assert any(".experts." in name for name in reference)
    assert_same(build(folder, "ferry", process=False), reference)
