"""transformers 5's checkpoint conversions, done by ferry where they only place bytes.

transformers 5 fuses the experts of MoE models that checkpoints store one by one (Mixtral's
`experts.E.w1/w3/w2`, Qwen-MoE's `experts.E.gate_proj/up_proj/down_proj`) into 3-D parameters
(`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) while it loads, through its
conversion mapping: rename, stack the experts (MergeModulelist, dim 0), concatenate gate and up
(Concatenate, dim 1). Both only place each expert's matrix at one contiguous block of the fused
parameter, so ferry reads every expert's tensor straight into its block: no per-expert tensor,
no stack, no cat, no second copy.

The mapping itself (which names, which order) is transformers' own: its conversion list for the
model and its renaming function; experts are stacked in the order transformers collects them
(names sorted naturally, numbers as numbers). Any other operation (transposes, splits, quantized
weights...) makes plan() return None, and the caller leaves the conversion to transformers."""
import math
from typing import Dict, List, Optional, Tuple

from ._dtypes import torch_dtype, torch_shape


class Plan:
    """Where each checkpoint tensor goes: `direct` (checkpoint name -> model name, a tensor that
    becomes a parameter or buffer whole) and `fused` (model name -> [(checkpoint name, element
    offset in the fused parameter)], in transformers' order). `transforms` are the conversions
    that matched, kept on the model as transformers keeps them (save_pretrained reverts them)."""

    def __init__(self):
        self.direct: Dict[str, str] = {}
        self.fused: Dict[str, List[Tuple[str, int]]] = {}
        self.transforms: list = []

    def targets(self) -> List[str]:
        return list(self.direct.values()) + list(self.fused)


def _natural(name: str):
    """transformers' dot_natural_key: dotted parts, the numeric ones as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split(".")]


def plan(model, table: Dict[str, tuple]) -> Optional[Plan]:
    """The plan for `model` (built, parameters on meta) and the checkpoint's tensors (name ->
    (dtype, shape, bytes)), or None where transformers must convert (not transformers 5, a
    quantized model, an operation other than stacking experts and concatenating them on dim 1,
    or names that do not fit the model)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (Concatenate, MergeModulelist, WeightConverter,
                                                     WeightRenaming, rename_source_key)
    except ImportError:
        return None
    if getattr(model.config, "quantization_config", None) is not None:
        return None
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta = model.state_dict()
    prefix = model.base_model_prefix
    result = Plan()
    # fused name -> (its converter, source pattern -> checkpoint names in transformers' order)
    collected: Dict[str, Tuple[object, Dict[str, List[str]]]] = {}
    for name in sorted(table, key=_natural):  # the order transformers collects them in
        target, pattern = rename_source_key(name, renamings, converters, prefix, meta)
        if target not in meta and name in meta:  # transformers 5's second try: the name itself
            target, pattern = rename_source_key(name, [], [], prefix, meta)
        if target not in meta:
            continue  # a name the model lacks: not read (transformers reports it unexpected)
        if pattern is None:
            if target in result.fused or target in result.direct.values():
                return None  # two tensors for one parameter: transformers' business
            result.direct[name] = target
            continue
        converter, sources = collected.setdefault(target, (by_pattern[pattern], {}))
        sources.setdefault(pattern, []).append(name)
    for target, (converter, sources) in collected.items():
        if target in result.direct.values():
            return None
        operations = list(converter.operations)
        kinds = [(type(op), getattr(op, "dim", None)) for op in operations]
        stacked = kinds[:1] == [(MergeModulelist, 0)]
        if not stacked or kinds[1:] not in ([], [(Concatenate, 1)]):
            return None
        if len(kinds) == 1 and len(sources) != 1:
            return None
        offsets = _blocks(meta[target], [sources.get(p) for p in converter.source_patterns], table)
        if offsets is None:
            return None
        result.fused[target] = offsets
    used = [t for t in transforms if not hasattr(t, "was_used") or t.was_used()]
    result.transforms = used
    return result


def _blocks(param, groups: List[Optional[List[str]]], table) -> Optional[List[Tuple[str, int]]]:
    """(checkpoint name, element offset) for each expert tensor of a fused parameter [E, A, ...]:
    group j's tensor e (shape [a_j, ...]) is rows sum(a_<j) .. + a_j of expert e. None unless
    every group has E tensors of one shape and one dtype, the rows add up to A, and every tensor
    has whole bytes in a dtype this torch has."""
    shape = list(param.shape)
    if len(shape) < 2 or any(g is None for g in groups):
        return None
    experts, rows, rest = shape[0], shape[1], math.prod(shape[2:])
    dtypes = {table[n][0] for g in groups for n in g}
    if len(dtypes) != 1:
        return None
    dtype = dtypes.pop()
    if torch_shape(dtype, [2]) != [2]:
        return None  # packed sub-byte values: not placed by element
    try:
        torch_dtype(dtype, groups[0][0])
    except TypeError:
        return None
    out, first = [], 0
    for names in groups:
        if len(names) != experts:
            return None
        group_shapes = {tuple(table[n][1]) for n in names}
        if len(group_shapes) != 1:
            return None
        group_shape = list(group_shapes.pop())
        if not group_shape or group_shape[1:] != shape[2:]:
            return None
        for e, name in enumerate(names):
            out.append((name, (e * rows + first) * rest))
        first += group_shape[0]
    return out if first == rows else None
