"""Hugging Face transformers models filled by ferry instead of transformers' own loader.

    model = ferry.transformers.from_pretrained(AutoModelForCausalLM, "path/to/model", device="cuda:0")

The model is built with its parameters on the meta device (no memory, no random init), ferry
loads the checkpoint (one file, or shards with their index) straight into `device`, and the
loaded tensors become the parameters without a copy. Tied weights are tied the way transformers
ties them (`tie_word_embeddings`: the output embedding is the input embedding), buffers the
checkpoint does not hold (rotary frequencies) keep the values the model computed, and the model
comes back in eval mode.

Where the checkpoint's names do not match the model's (transformers 5 fuses MoE experts that
checkpoints store one by one, and converts them while loading), ferry still reads the tensors
and hands them to transformers' own from_pretrained as its `state_dict`, which applies its
conversions; `loaded_by(model)` says which route ran.
"""
import contextlib
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import _ferry
from ._dtypes import normalize_device, tensor_table, torch_dtype as _torch_dtype

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def _parameters_on_meta():
    """Every parameter registered while this runs lives on the meta device (its initialisation
    then costs nothing); buffers stay real, so values computed at construction are kept."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


@contextlib.contextmanager
def _default_dtype(dtype):
    """transformers builds a model in the dtype asked for by making it torch's default."""
    previous = torch.get_default_dtype()
    if dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _model_class(cls_or_auto, config):
    """The concrete model class: `cls_or_auto` itself, or what an Auto class maps the config to."""
    mapping = getattr(cls_or_auto, "_model_mapping", None)
    if mapping is None:
        return cls_or_auto
    try:
        from transformers.models.auto.auto_factory import _get_model_class

        return _get_model_class(config, mapping)
    except ImportError:
        return mapping[type(config)]


def _resolve_dtype(dtype, config):
    """None or "auto": the checkpoint's dtype as its config states it, else float32."""
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype


def _checkpoint_path(path: str) -> str:
    """A model directory holds config.json beside the weights; ferry opens the directory's
    safetensors (one file, or the shards of its index)."""
    if os.path.isdir(path):
        for index in ("model.safetensors.index.json",):
            if os.path.isfile(os.path.join(path, index)):
                return os.path.join(path, index)
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(single):
            return single
    return path


def _key_map(model, checkpoint_names: List[str]) -> Dict[str, str]:
    """checkpoint name -> model name, adding or removing the base model prefix as transformers
    does when a checkpoint of the bare model is loaded into a model with a head (or back)."""
    expected = set(model.state_dict().keys())
    prefix = getattr(model, "base_model_prefix", "") or ""
    mapping = {}
    for name in checkpoint_names:
        if name in expected:
            mapping[name] = name
        elif prefix and f"{prefix}.{name}" in expected:
            mapping[name] = f"{prefix}.{name}"
        elif prefix and name.startswith(prefix + ".") and name[len(prefix) + 1:] in expected:
            mapping[name] = name[len(prefix) + 1:]
    return mapping


def _tied_names(model) -> Dict[str, List[str]]:
    """Parameter name -> every name it goes by (tied weights share one Parameter)."""
    by_id: Dict[int, List[str]] = {}

    def walk(module, prefix):  # named_parameters(remove_duplicate=False) needs torch >= 2.0
        for leaf, param in module._parameters.items():
            if param is not None:
                by_id.setdefault(id(param), []).append(prefix + leaf)
        for child_name, child in module._modules.items():
            if child is not None:
                walk(child, f"{prefix}{child_name}.")

    walk(model, "")
    return {name: names for names in by_id.values() for name in names}


def _assign(model, name: str, tensor: torch.Tensor) -> None:
    """Makes `tensor` the parameter or buffer `name` (cast to its dtype where they differ, as
    transformers casts floating weights to the dtype asked for)."""
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    if leaf in module._parameters:
        old = module._parameters[leaf]
        table = module._parameters
    elif leaf in module._buffers:
        old = module._buffers[leaf]
        table = module._buffers
    else:
        raise KeyError(name)
    if tuple(tensor.shape) != tuple(old.shape):
        raise ValueError(f"{name}: the checkpoint has shape {list(tensor.shape)}, the model {list(old.shape)}")
    if tensor.dtype != old.dtype and (tensor.is_floating_point() or old.is_floating_point()):
        tensor = tensor.to(old.dtype)
    if table is module._parameters:
        table[leaf] = type(old)(tensor, requires_grad=old.requires_grad)
    else:
        table[leaf] = tensor


def _build(model_class, config, dtype):
    """_from_config picks the attention implementation as from_pretrained does (sdpa where torch
    has it); the dtype reaches it as torch's default, the one spelling every version reads."""
    with _default_dtype(dtype), _parameters_on_meta():
        if hasattr(model_class, "_from_config"):
            return model_class._from_config(config)
        return model_class(config)


def from_pretrained(cls_or_auto, path: PathLike, device: Any = "cpu", torch_dtype: Any = None,
                    strict: bool = True, config: Any = None, **config_kwargs) -> "torch.nn.Module":
    """A transformers model for the checkpoint in `path` (a model directory with config.json),
    on `device`, in eval mode. `cls_or_auto` is a model class or an Auto class
    (AutoModelForCausalLM...). `torch_dtype` defaults to the checkpoint's (config.torch_dtype),
    as transformers 5 does. With `strict`, a parameter that neither the checkpoint nor a tied
    alias fills is an error (transformers would initialise it randomly). Other keywords go to
    the config (e.g. attn_implementation)."""
    import transformers

    path = os.fspath(path)
    if config is None:
        config = transformers.AutoConfig.from_pretrained(path, **config_kwargs)
    dtype = _resolve_dtype(torch_dtype, config)
    dev = normalize_device(device)
    checkpoint = _ferry.Checkpoint.open(_checkpoint_path(path))
    table = tensor_table(checkpoint)

    model = _build(_model_class(cls_or_auto, config), config, dtype)
    mapping = _key_map(model, list(table))
    aliases = _tied_names(model)
    covered = set(mapping.values())
    # Tied parameters count as present when any alias is in the checkpoint.
    missing = sorted(n for n in aliases if not any(a in covered for a in aliases[n]))
    if missing and set(table) - set(mapping):
        return _through_transformers(cls_or_auto, path, checkpoint, dev, dtype, config, config_kwargs)
    if missing and strict:
        raise RuntimeError(f"{path}: no tensor in the checkpoint for {', '.join(missing[:8])}"
                           + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))

    for name, dtype_name in ((n, table[n][0]) for n in mapping):
        _torch_dtype(dtype_name, name)  # refuse dtypes this torch lacks before loading
    loaded = _ferry.load(checkpoint, dev, list(mapping))
    from .torch import _tensors

    tensors = _tensors(loaded, table)
    with torch.no_grad():
        for name, target in mapping.items():
            _assign(model, target, tensors.pop(name))
    del tensors
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if left:
        raise RuntimeError(f"{path}: parameters left without weights: {', '.join(left[:8])}")
    model.to(dev)  # the buffers the model computed; the loaded parameters are there already
    _generation_config(model, path)
    model.eval()
    model._ferry_loaded_by = "ferry"
    model._ferry_stats = loaded.stats()
    return model


def _through_transformers(cls_or_auto, path, checkpoint, dev, dtype, config, config_kwargs):
    """Names that need transformers' conversions: ferry reads, transformers converts."""
    from .torch import _tensors

    loaded = _ferry.load(checkpoint, dev)
    state = _tensors(loaded, tensor_table(checkpoint))
    model = cls_or_auto.from_pretrained(path, config=config, state_dict=state, torch_dtype=dtype)
    model.to(dev)
    model.eval()
    model._ferry_loaded_by = "transformers(state_dict from ferry)"
    model._ferry_stats = loaded.stats()
    return model


def _generation_config(model, path: str) -> None:
    if not os.path.isfile(os.path.join(path, "generation_config.json")):
        return
    try:
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(path)
    except (ImportError, OSError, ValueError):
        pass  # the model keeps the generation settings derived from its config


def loaded_by(model) -> Optional[str]:
    """"ferry" when ferry's tensors became the parameters directly; "transformers(state_dict from
    ferry)" when transformers converted names first; None for a model ferry did not load."""
    return getattr(model, "_ferry_loaded_by", None)
