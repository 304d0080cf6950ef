"""Hugging Face transformers models filled by ferry instead of transformers' own loader.

    model = ferry.transformers.from_pretrained(AutoModelForCausalLM, "path/to/model", device="cuda:0")

The model is built with its parameters on the meta device (no memory, no random init), ferry
loads the checkpoint (one file, or shards with their index) straight into `device`, and the
loaded tensors become the parameters without a copy. Tied weights are tied the way transformers
ties them (`tie_word_embeddings`: the output embedding is the input embedding), buffers the
checkpoint does not hold (rotary frequencies) keep the values the model computed, and the model
comes back in eval mode.

Where the checkpoint's names do not match the model's because transformers 5 fuses MoE experts
that checkpoints store one by one (Mixtral, Qwen-MoE...), ferry follows transformers' own
conversion mapping and reads each expert's tensor straight into its block of the fused parameter
(_hf_conversion.py). Any other conversion (legacy names, transposes, quantized weights): ferry
still reads the tensors and hands them to transformers' own from_pretrained as its `state_dict`
(with no model path, the one way transformers 5 accepts a state_dict), so transformers converts
ferry's tensors; `loaded_by(model)` says which route ran (FERRY or CONVERTED).
"""
import contextlib
import copy
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import _ferry, _hf_conversion
from ._dtypes import normalize_device, tensor_table, torch_dtype as _torch_dtype, torch_shape as _torch_shape

PathLike = Union[str, "os.PathLike[str]"]

FERRY = "ferry"  # ferry's tensors became the parameters
CONVERTED = "transformers(state_dict from ferry)"  # transformers converted ferry's tensors


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _dtype_kwarg(dtype) -> Dict[str, Any]:
    """transformers 5 names the dtype argument `dtype` (`torch_dtype` is deprecated there)."""
    return {"dtype" if _transformers_major() >= 5 else "torch_dtype": dtype}


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
        # transformers 5 keeps it as config.dtype (torch_dtype is a deprecated alias there)
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
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
    has it). The dtype is passed to it (transformers 5 builds in config.dtype unless told) and
    made torch's default (for a class without _from_config)."""
    with _default_dtype(dtype), _parameters_on_meta():
        if hasattr(model_class, "_from_config"):
            return model_class._from_config(config, **_dtype_kwarg(dtype))
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
    else:
        config = copy.deepcopy(config)  # the caller's stays as it was
    dtype = _resolve_dtype(torch_dtype, config)
    # Versions that build in the config's dtype read it from here (from_pretrained sets it too);
    # transformers 5 names it dtype (torch_dtype is a deprecated alias there).
    setattr(config, "dtype" if _transformers_major() >= 5 else "torch_dtype", dtype)
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
        conversion = _hf_conversion.plan(model, table)
        # transformers 5's fused experts: ferry places the bytes. Renames alone (legacy names)
        # stay with transformers, which knows their history.
        if conversion is not None and conversion.fused:
            return _load_converted(model, conversion, checkpoint, table, path, dev, aliases, strict)
        return _through_transformers(_model_class(cls_or_auto, config), path, checkpoint, dev, dtype,
                                     config, strict)
    if missing and strict:
        _refuse_missing(path, missing)

    for name, dtype_name in ((n, table[n][0]) for n in mapping):
        _torch_dtype(dtype_name, name)  # refuse dtypes this torch lacks before loading
    from ._views import _load_tensors

    tensors, loaded, _ = _load_tensors(checkpoint, dev, list(mapping))
    with torch.no_grad():
        for name, target in mapping.items():
            _assign(model, target, tensors.pop(name))
    del tensors
    return _finish(model, path, dev, loaded.stats())


def _finish(model, path: str, dev: str, stats: dict):
    """Ties weights as transformers does, checks that no parameter is left on meta, moves the
    buffers the model computed to `dev`, and returns the model in eval mode."""
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if left:
        raise RuntimeError(f"{path}: parameters left without weights: {', '.join(left[:8])}")
    model.to(dev)  # the buffers the model computed; the loaded parameters are there already
    _generation_config(model, path)
    model.eval()
    model._ferry_loaded_by = FERRY
    model._ferry_stats = stats
    return model


def _load_converted(model, conversion, checkpoint, table, path: str, dev: str, aliases, strict: bool):
    """Fills `model` as transformers 5 converts the checkpoint (_hf_conversion.plan): each
    parameter gets memory of its own on `dev`, and ONE engine load reads every tensor into it: a
    renamed tensor whole, an expert's tensor into its block of the fused parameter. Where the
    checkpoint's dtype is not the model's, the filled tensor is cast (elementwise, as transformers
    casts each tensor before fusing)."""
    covered = set(conversion.targets())
    missing = sorted(n for n in aliases if not any(a in covered for a in aliases[n]))
    if missing and strict:
        _refuse_missing(path, missing)
    meta = model.state_dict()
    filled: Dict[str, torch.Tensor] = {}
    destinations: List[Tuple[str, int, int]] = []
    for name, target in conversion.direct.items():
        dtype, shape, nbytes = table[name]
        memory = torch.empty(_torch_shape(dtype, shape), dtype=_torch_dtype(dtype, name), device=dev)
        filled[target] = memory
        if nbytes:
            destinations.append((name, memory.data_ptr(), nbytes))
    for target, blocks in conversion.fused.items():
        first = blocks[0][0]
        memory = torch.empty(meta[target].shape, dtype=_torch_dtype(table[first][0], first), device=dev)
        filled[target] = memory
        for name, offset in blocks:
            if table[name][2]:
                destinations.append((name, memory.data_ptr() + offset * memory.element_size(), table[name][2]))
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)  # memory the allocator recycled may still be in use
    stats = _ferry.load_into(checkpoint, destinations, dev)
    with torch.no_grad():
        for target, memory in filled.items():
            _assign(model, target, memory)
    del filled
    model._weight_conversions = conversion.transforms  # what save_pretrained reverts, as transformers keeps it
    return _finish(model, path, dev, stats)


def _refuse_missing(path: str, missing: List[str]) -> None:
    raise RuntimeError(f"{path}: no tensor in the checkpoint for {', '.join(missing[:8])}"
                       + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))


def _through_transformers(model_class, path, checkpoint, dev, dtype, config, strict):
    """Names that need transformers' conversions: ferry reads every tensor, transformers converts
    them (its conversion mapping: renames, fused MoE experts, casts) and fills the model. No
    model path goes with the state_dict: transformers 5 refuses both, and without one it reads
    no file itself."""
    from ._views import _load_tensors

    state, loaded, _ = _load_tensors(checkpoint, dev)
    model, info = model_class.from_pretrained(None, config=config, state_dict=state, output_loading_info=True,
                                              **_dtype_kwarg(dtype))
    del state
    aliases = _tied_names(model)
    missing = set(info.get("missing_keys", ()))
    # A tied parameter is filled when any of its names was loaded.
    unfilled = sorted(n for n in missing if all(a in missing for a in aliases.get(n, [n])))
    if unfilled and strict:
        _refuse_missing(path, unfilled)
    model.to(dev)
    _generation_config(model, path)
    model.eval()
    model._ferry_loaded_by = CONVERTED
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
    """FERRY ("ferry") when ferry's tensors became the parameters directly; CONVERTED
    ("transformers(state_dict from ferry)") when ferry read every tensor and transformers' own
    conversions (transformers 5's fused MoE experts) filled the model from them; None for a model
    ferry did not load."""
    return getattr(model, "_ferry_loaded_by", None)
