"""ferry.torch.offload_experts: the experts of MoE blocks live in ferry's pinned arena (or stay in
the checkpoint) and an ExpertCache per block keeps `slots` of them in GPU memory.

A block is Mixtral/Qwen-MoE style: a router module `gate` and a ModuleList `experts` of modules
with the same parameter shapes (transformers 4's Mixtral, Qwen2-MoE and many custom models;
transformers 5's fused 3-D expert tensors are not this shape and are refused). When the router
has run, the experts its top-k chose are made resident together (hits cost nothing, misses are
loaded as one batch of demand loads, then `speculative` of the block's most used other experts
into slots nobody asked for); each expert's parameters are pointed at its slot just before it
runs, and the block releases them when it returns. The routing is read on the host (as
transformers' loop over experts does), so this runs eagerly: not under CUDA graphs."""
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

from . import _ferry
from ._offload import _aligned_bytes, _compute_stream, _disk_groups, _nbytes

__all__ = ["ExpertOffload", "find_moe_blocks", "offload_experts"]


def find_moe_blocks(model: torch.nn.Module) -> List[torch.nn.Module]:
    """Modules with a `gate` module and an `experts` ModuleList of more than one expert."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "experts", None), torch.nn.ModuleList) and len(m.experts) > 1
            and isinstance(getattr(m, "gate", None), torch.nn.Module)]


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
        slots = self.cache.acquire(experts, _compute_stream(self.device), list(speculative))
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

    def stats(self) -> dict:
        """Summed over the blocks; `blocks` has each block's own."""
        per = [b.cache.stats() for b in self._blocks]
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
    block's `top_k` or `num_experts_per_tok`). Every other parameter stays where it is."""
    if source not in ("cpu", "disk"):
        raise ValueError(f'offload_experts: source must be "cpu" or "disk", not {source!r}')
    if source == "disk" and checkpoint is None:
        raise ValueError('offload_experts: source="disk" needs checkpoint=')
    blocks = find_moe_blocks(model)
    if not blocks:
        raise ValueError("offload_experts: no MoE block (a `gate` and an `experts` ModuleList) "
                         "in the model")
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None and first.device.type == "cuda" else (
            "cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    engine_device = f"cuda:{device.index}" if device.type == "cuda" else "cpu"
    checkpoint_handle, names_of = None, {}
    if source == "disk":
        from ._open import open_checkpoint
        checkpoint_handle = open_checkpoint(checkpoint)
        names_of = {id(p): n for n, p in model.named_parameters()}
    out = ExpertOffload()
    expert_ids = {id(p) for b in blocks for e in b.experts for p in e.parameters()}
    for module in model.modules():  # everything else: resident on the device
        for name, p in module.named_parameters(recurse=False):
            if id(p) not in expert_ids and p.device != device:
                p.data = p.data.to(device)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.device != device:
                module._buffers[name] = b.to(device)
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
            groups = _disk_groups(checkpoint_handle, names, params)
        else:
            groups = [[(_nbytes(p), 0, 0, 0) for p in ps] for ps in params]
        offsets, slot_bytes = _ferry.slot_offsets([_nbytes(p) for p in params[0]])
        slot_tensors = [_aligned_bytes(slot_bytes, device) for _ in range(slots)]
        cache = _ferry.ExpertCache(groups, slots, engine_device, checkpoint_handle, policy,
                                   [s.data_ptr() for s in slot_tensors], io)
        if source == "cpu":
            import ctypes
            for e, ps in enumerate(params):
                for t, p in enumerate(ps):
                    n = _nbytes(p)
                    arena = torch.frombuffer((ctypes.c_uint8 * n).from_address(cache.host_address(e, t)),
                                             dtype=torch.uint8)
                    arena.copy_(p.data.detach().contiguous().reshape(-1).view(torch.uint8))
        views = [[s[o:o + _nbytes(p)].view(p.dtype).view(p.shape) for o, p in zip(offsets, params[0])]
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
    return out
