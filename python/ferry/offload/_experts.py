"""ferry.torch.offload_experts: the experts of MoE blocks live in ferry's pinned arena (or stay in
the checkpoint) and an ExpertCache per block keeps `slots` of them in GPU memory.

Two shapes of MoE block are served:
- a router module `gate` and a ModuleList `experts` of modules with the same parameter shapes
  (transformers 4's Mixtral and Qwen2-MoE, many custom models): when the router has run, the
  experts its top-k chose are made resident together, and each expert's parameters are pointed
  at its slot just before it runs;
- fused experts (transformers 5: one module holding 3-D parameters [num_experts, ...] whose
  forward takes (hidden_states, top_k_index, top_k_weights)): the experts that top_k_index hits
  are made resident, the parameters become [slots, ...] views of the slots, and the module runs
  with the indices mapped to slots; where more experts are hit than there are slots, it runs once
  per batch of slots - 1 experts, the last slot holding a "park" expert that takes the tokens'
  choices outside the batch at weight zero (so each expert sees exactly its resident rows, and
  its kernels their resident inputs), and the outputs are summed. Bitwise equal to resident for
  top-2 routing (a token's sum has two terms, in either order) where the module rounds each term
  to the output dtype before adding (transformers' eager loop; any fp32 model); a module that
  sums a token's terms wider and rounds once (transformers' grouped_mm on bf16) may differ in
  the last bit for tokens whose two experts fall in different batches. For top-k > 2 the terms
  of one token may add in another order (slot order, or across batches).
Hits cost nothing; misses load as one batch of demand loads, then `speculative` of the block's
most used other experts go into slots nobody asked for. The routing is read on the host (as
transformers' loops over experts do), so this runs eagerly: not under CUDA graphs."""
import inspect
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

from .. import _ferry
from ._shared import (aligned_bytes, checked_entry, checkpoint_table, compute_stream, disk_groups,
                      engine_device, fill_arena, move_others, nbytes, resolve_device)

__all__ = ["ExpertOffload", "find_fused_experts", "find_moe_blocks", "offload_experts"]


def find_moe_blocks(model: torch.nn.Module) -> List[torch.nn.Module]:
    """Modules with a `gate` module and an `experts` ModuleList of more than one expert."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "experts", None), torch.nn.ModuleList) and len(m.experts) > 1
            and isinstance(getattr(m, "gate", None), torch.nn.Module)]


def find_fused_experts(model: torch.nn.Module) -> List[torch.nn.Module]:
    """Modules whose own parameters are all [num_experts, ...] and whose forward takes
    top_k_index (transformers 5's MixtralExperts, Qwen3MoeExperts...)."""
    out = []
    for m in model.modules():
        n = getattr(m, "num_experts", None)
        params = list(m.parameters(recurse=False))
        if not isinstance(n, int) or n < 2 or not params:
            continue
        if all(p.dim() >= 2 and p.shape[0] == n for p in params) and \
                "top_k_index" in inspect.signature(m.forward).parameters:
            out.append(m)
    return out


class _Fused:
    """One fused-experts module: its cache, the [slots, ...] views, and the forward around it."""

    def __init__(self, module, index, cache, big, params, offsets, slot_bytes, speculative, device):
        self.module, self.index, self.cache, self.big = module, index, cache, big
        self.params, self.speculative, self.device = params, speculative, device
        self.experts = module.num_experts
        self.uses: Counter = Counter()
        self.handles = []
        slots = cache.slot_count
        self.views, self.parked = [], []
        for p, offset in zip(params, offsets):
            per = p[0]
            elems = big.view(p.dtype)
            start = elems.storage_offset() + offset // p.element_size()  # as_strided: in storage
            stride = (slot_bytes // p.element_size(),) + per.stride()
            self.views.append(elems.as_strided((slots,) + tuple(per.shape), stride, start))
            # Outside forward: the full shape, every expert reading slot 0 (no memory held).
            self.parked.append(elems.as_strided(tuple(p.shape), (0,) + per.stride(), start))

    def park(self) -> None:
        self.module.num_experts = self.experts
        for p, view in zip(self.params, self.parked):
            p.data = view

    def batches(self, hit: List[int]) -> List[tuple]:
        """(experts, park) per call of the module: all the hit experts at once where they fit
        in the slots (park None); else batches of slots - 1 experts, each with a `park` expert
        outside the batch whose slot takes every token's other choices at weight zero."""
        slots = self.cache.slot_count
        if len(hit) <= slots:
            return [(hit, None)]
        out = []
        for start in range(0, len(hit), slots - 1):
            chunk = hit[start:start + slots - 1]
            rest = [e for e in hit if e not in chunk]
            # A resident one costs no copy; else the next batch's first, needed soon anyway.
            park = next((e for e in rest if self.cache.resident_slot(e) >= 0), rest[0])
            out.append((chunk, park))
        return out

    def forward(self, inner, bound: inspect.BoundArguments):
        top_k_index, top_k_weights = bound.arguments["top_k_index"], bound.arguments["top_k_weights"]
        hit = [e for e in torch.unique(top_k_index).tolist() if 0 <= e < self.experts]
        self.uses.update(hit)
        stream = compute_stream(self.device)
        batches = self.batches(hit)
        out = None
        for n, (chunk, park) in enumerate(batches):
            wanted = chunk + ([park] if park is not None else [])
            others = [e for e, _ in self.uses.most_common() if e not in hit][:self.speculative]
            placed = self.cache.acquire(wanted, stream, others if n + 1 == len(batches) else [])
            try:
                # Every token-expert pair of another batch goes to the park slot at weight
                # zero: each expert of this batch computes on exactly the rows it does resident
                # (the same kernels over the same inputs), and the parked ones add zeros.
                lut = torch.full((self.experts,), placed[-1] if park is not None else 0,
                                 dtype=top_k_index.dtype, device=top_k_index.device)
                lut[chunk] = torch.tensor(placed[:len(chunk)], dtype=top_k_index.dtype,
                                          device=lut.device)
                bound.arguments["top_k_index"] = lut[top_k_index]
                if park is not None:
                    member = torch.zeros(self.experts, dtype=torch.bool, device=lut.device)
                    member[chunk] = True
                    bound.arguments["top_k_weights"] = torch.where(
                        member[top_k_index], top_k_weights, torch.zeros_like(top_k_weights))
                self.module.num_experts = self.cache.slot_count
                for p, view in zip(self.params, self.views):
                    p.data = view
                part = inner(*bound.args, **bound.kwargs)
            finally:
                self.park()
                self.cache.release(wanted)
            out = part if out is None else out + part
        return out


def _wrap_fused(state: _Fused) -> None:
    inner = state.module.forward
    signature = inspect.signature(inner)

    def forward(*args, **kwargs):
        return state.forward(inner, signature.bind(*args, **kwargs))

    state.module.forward = forward


class _Block:
    def __init__(self, block, index, cache, slots, views, params, top_k, speculative, device):
        self.block, self.index, self.cache = block, index, cache
        self.slots, self.views, self.params = slots, views, params  # views[slot][tensor]
        self.top_k, self.speculative, self.device = top_k, speculative, device
        self.pinned: Dict[int, int] = {}  # expert -> slot, acquired for this call
        self.done: List[int] = []
        self.uses: Counter = Counter()
        self.handles = []

    def _acquire(self, experts: List[int], speculative: List[int] = ()) -> None:
        slots = self.cache.acquire(experts, compute_stream(self.device), list(speculative))
        self.pinned.update(zip(experts, slots))

    def route(self, module, inputs, output) -> None:
        logits = output[0] if isinstance(output, (tuple, list)) else output
        chosen = sorted(set(logits.detach().topk(self.top_k, dim=-1).indices.flatten().tolist()))
        chosen = chosen[:self.cache.slot_count]  # the rest load on demand as they run
        self.uses.update(chosen)
        others = [e for e, _ in self.uses.most_common() if e not in chosen][:self.speculative]
        self._acquire([e for e in chosen if e not in self.pinned], others)

    def run(self, expert: int, inner, args, kwargs):
        if expert not in self.pinned:  # not predicted, or beyond the slots: make room first
            if len(self.pinned) >= self.cache.slot_count:
                done = [e for e in self.done if e in self.pinned]
                self.cache.release(done)
                for e in done:
                    del self.pinned[e]
            self._acquire([expert])
        slot = self.pinned[expert]
        for p, view in zip(self.params[expert], self.views[slot]):
            p.data = view
        self.done.append(expert)
        return inner(*args, **kwargs)

    def finish(self) -> None:
        if self.pinned:
            self.cache.release(list(self.pinned))
        self.pinned.clear()
        self.done.clear()


class ExpertOffload:
    """What offload_experts() did: per-block caches, their statistics, and undo()."""

    def __init__(self):
        self._blocks: List[_Block] = []
        self._fused: List[_Fused] = []

    def stats(self) -> dict:
        """Summed over the blocks; `blocks` has each block's own."""
        per = [b.cache.stats() for b in self._blocks + self._fused]
        total = {k: sum(s[k] for s in per) for k in per[0]} if per else {}
        total["blocks"] = per
        return total

    def undo(self) -> None:
        """Every expert resident again in its own memory, the hooks removed."""
        for b in self._blocks:
            for e, params in enumerate(b.params):
                b._acquire([e])
                for p, view in zip(params, b.views[b.pinned[e]]):
                    p.data = view.clone()
                b.finish()
            for h in b.handles:
                h.remove()
            for expert in b.block.experts:
                expert.__dict__.pop("forward", None)
            b.block.__dict__.pop("forward", None)
            b.cache.synchronize()
        self._blocks = []
        for f in self._fused:
            stream = compute_stream(f.device)
            copies = [torch.empty(p.shape, dtype=p.dtype, device=f.device) for p in f.params]
            for e in range(f.experts):
                (slot,) = f.cache.acquire([e], stream)
                for c, view in zip(copies, f.views):
                    c[e].copy_(view[slot])
                f.cache.release([e])
            for p, c in zip(f.params, copies):
                p.data = c
            f.module.__dict__.pop("forward", None)
            f.cache.synchronize()
        self._fused = []


def _wrap_expert(state: _Block, expert: torch.nn.Module, index: int) -> None:
    inner = expert.forward

    def forward(*args, **kwargs):
        return state.run(index, inner, args, kwargs)

    expert.forward = forward


def _wrap_block(state: _Block) -> None:
    inner = state.block.forward

    def forward(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        finally:
            state.finish()

    state.block.forward = forward


def offload_experts(model: torch.nn.Module, *, slots: int, device: Any = None,
                    policy: str = "lru", speculative: int = 0, top_k: Optional[int] = None,
                    source: str = "cpu", checkpoint: Any = None, prefix: str = "",
                    io: str = "auto") -> ExpertOffload:
    """Keeps `slots` experts of every MoE block (find_moe_blocks) resident on `device` (default:
    where the first parameter is, else cuda:0) in a cache with `policy` "lru" or "frequency";
    the others live in ferry's pinned arena (`source="cpu"`) or are read from `checkpoint` at
    each miss (`source="disk"`, names after `prefix`). `top_k`: experts per token (default: the
    block's `top_k` or `num_experts_per_tok`). Every other parameter and buffer moves to
    `device`."""
    if source not in ("cpu", "disk"):
        raise ValueError(f'offload_experts: source must be "cpu" or "disk", not {source!r}')
    if source == "disk" and checkpoint is None:
        raise ValueError('offload_experts: source="disk" needs checkpoint=')
    blocks = find_moe_blocks(model)
    fused = find_fused_experts(model)
    if not blocks and not fused:
        raise ValueError("offload_experts: no MoE block (a `gate` and an `experts` ModuleList, or "
                         "fused [num_experts, ...] experts) in the model")
    device = resolve_device(model, device)
    checkpoint_handle, names_of = None, {}
    if source == "disk":
        from .._open import open_checkpoint
        checkpoint_handle = open_checkpoint(checkpoint)
        names_of = {id(p): n for n, p in model.named_parameters()}
    out = ExpertOffload()
    expert_ids = {id(p) for b in blocks for e in b.experts for p in e.parameters()}
    expert_ids |= {id(p) for f in fused for p in f.parameters(recurse=False)}
    move_others(model, device, expert_ids)  # everything else: resident on the device
    for index, block in enumerate(blocks):
        k = top_k or getattr(block, "top_k", None) or getattr(block, "num_experts_per_tok", None)
        if not k:
            raise ValueError(f"offload_experts: MoE block {index} has no top_k: pass top_k=")
        params = [list(e.parameters()) for e in block.experts]
        shapes = [[(p.dtype, tuple(p.shape)) for p in ps] for ps in params]
        if not shapes[0] or any(s != shapes[0] for s in shapes):
            raise ValueError(f"offload_experts: the experts of MoE block {index} differ in their "
                             "parameters (or have none)")
        if not 1 <= slots <= len(params):
            raise ValueError(f"offload_experts: {slots} slots for the {len(params)} experts of "
                             f"block {index}: 1 to {len(params)}")
        if source == "disk":
            names = [[prefix + names_of[id(p)] for p in ps] for ps in params]
            groups = disk_groups(checkpoint_handle, names, params)
        else:
            groups = [[(nbytes(p), 0, 0, 0) for p in ps] for ps in params]
        offsets, slot_bytes = _ferry.slot_offsets([nbytes(p) for p in params[0]])
        slot_tensors = [aligned_bytes(slot_bytes, device) for _ in range(slots)]
        cache = _ferry.ExpertCache(groups, slots, engine_device(device), checkpoint_handle, policy,
                                   [s.data_ptr() for s in slot_tensors], io)
        if source == "cpu":
            for e, ps in enumerate(params):
                for t, p in enumerate(ps):
                    fill_arena(cache.host_address(e, t), p.data)
        views = [[s[o:o + nbytes(p)].view(p.dtype).view(p.shape) for o, p in zip(offsets, params[0])]
                 for s in slot_tensors]
        for ps in params:  # parked on slot 0 (right shape and device) until they run
            for p, view in zip(ps, views[0]):
                p.data = view
        state = _Block(block, index, cache, slot_tensors, views, params, k, speculative, device)
        state.handles.append(block.gate.register_forward_hook(state.route))
        for e, expert in enumerate(block.experts):
            _wrap_expert(state, expert, e)
        _wrap_block(state)
        out._blocks.append(state)
    for index, module in enumerate(fused):
        out._fused.append(_offload_fused(module, index, slots, policy, speculative, source,
                                         checkpoint_handle, names_of, prefix, io, device))
    return out


def _offload_fused(module, index, slots, policy, speculative, source, checkpoint, names_of, prefix,
                   io, device) -> _Fused:
    params = list(module.parameters(recurse=False))
    count = module.num_experts
    if not 2 <= slots <= count:
        raise ValueError(f"offload_experts: {slots} slots for the {count} experts of fused "
                         f"experts {index}: 2 to {count} (a batch of experts smaller than the "
                         "tokens hit needs one slot to park the others)")
    for p in params:
        if not p.is_contiguous():
            raise ValueError(f"offload_experts: fused experts {index} have a non-contiguous "
                             "parameter")
    sizes = [nbytes(p[0]) for p in params]
    if source == "disk":
        table = checkpoint_table(checkpoint)
        entries = [checked_entry(checkpoint, table, prefix + names_of[id(p)], p) for p in params]
        groups = [[(n, 0, file, offset + e * n) for n, (_, file, offset) in zip(sizes, entries)]
                  for e in range(count)]
    else:
        groups = [[(n, 0, 0, 0) for n in sizes] for _ in range(count)]
    offsets, slot_bytes = _ferry.slot_offsets(sizes)
    big = aligned_bytes(slots * slot_bytes, device)
    cache = _ferry.ExpertCache(groups, slots, engine_device(device), checkpoint, policy,
                               [big.data_ptr() + s * slot_bytes for s in range(slots)], io)
    if source == "cpu":
        for e in range(count):
            for t, p in enumerate(params):
                fill_arena(cache.host_address(e, t), p.data[e])
    state = _Fused(module, index, cache, big, params, offsets, slot_bytes, speculative, device)
    state.park()
    _wrap_fused(state)
    return state
