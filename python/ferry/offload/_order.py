"""Where layer offloading's ops stand in each block: after its tail (its last weight-using
module) where it has one, else at its edges; hooks check that nothing of a block runs after its
tail."""
from typing import TYPE_CHECKING, Any, List, Optional

import torch

from ._ops import _compiling, _release_call, _wait_call

if TYPE_CHECKING:
    from ._layers import Offload

def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        return _first_tensor(list(value.values()))
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return _first_tensor(value.to_tuple())
    return None


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return _tensors(list(value.values()))
    if hasattr(value, "to_tuple"):
        return _tensors(value.to_tuple())
    return []


def _weight_modules(block: torch.nn.Module) -> List[tuple]:
    """(name, module) of every module under `block` (itself included) that holds parameters."""
    return [(n, m) for n, m in block.named_modules()
            if any(p is not None and p.numel() > 0 for p in m._parameters.values())]


def _tail_of(block: torch.nn.Module) -> Optional[tuple]:
    """(name, module) of the block's last weight use: the last registered module holding a
    parameter of 2 or more dimensions (a decoder layer's MLP down projection). None where the
    block's own forward reads parameters (they may be read after any submodule), or where that
    module also holds a smaller one (a bias: compiled, its add leaves the matmul to fuse with
    what follows, as an op right after the module would not let it)."""
    owners = _weight_modules(block)
    if any(m is block for _, m in owners):
        return None
    matrices = [(n, m) for n, m in owners
                if any(p is not None and p.dim() >= 2 for p in m._parameters.values())]
    if not matrices:
        return None
    name, tail = matrices[-1]
    if any(p is not None and p.dim() < 2 for p in tail._parameters.values()):
        return None
    return name, tail


class _BlockOrder:
    """The stream's ops around one block: `entry_wait` (a group, or None) waited on at its
    input; `release` (its own group, or None), then `waits` (the next block's group; the next
    pass's first group) made right after its tail module, or at its output where the tail does
    not run."""

    def __init__(self, owner: "Offload", index: int, block: torch.nn.Module,
                 entry_wait: Optional[int], release: Optional[int], waits: List[int],
                 tail: Optional[tuple]):
        self.owner, self.index, self.block = owner, index, block
        self.entry_wait, self.release, self.waits = entry_wait, release, waits
        self.tail = tail
        self.past_tail = False
        self.used: List[torch.Tensor] = []  # this call's outputs of weight-using modules
        self.handles: list = []

    def order(self, y: Optional[torch.Tensor], where: str) -> None:
        if y is None:
            raise TypeError(f"offload: block {self.index}'s {where} gave no tensor to order "
                            "the stream's copies after")
        # Detached aliases: the ops need no autograd, and a mutation of an alias still orders
        # every later use of the tensor under torch.compile.
        handle = self.owner.handle
        if self.release is not None:
            _release_call(y.detach(), [u.detach() for u in self.used], handle, self.release)
        for group in self.waits:
            _wait_call(y.detach(), handle, group)
        self.used = []

    def forward(self, inner, args, kwargs):
        if self.entry_wait is not None:
            x = _first_tensor((args, kwargs))
            if x is None:
                raise TypeError(f"offload: block {self.index}'s forward got no tensor to order "
                                "the stream's wait after")
            _wait_call(x.detach(), self.owner.handle, self.entry_wait)
        self.past_tail, self.used = False, []
        out = inner(*args, **kwargs)
        if not self.past_tail:
            self.order(_first_tensor(out), "forward")
        self.past_tail, self.used = False, []
        return out

    def install(self) -> None:
        inner = self.block.forward

        def forward(*args, **kwargs):
            return self.forward(inner, args, kwargs)

        forward._ferry_offload = self.owner  # keeps the stream alive as long as the hook
        self.block.forward = forward
        if self.tail is None:
            return
        tail = self.tail[1]
        if self.release is not None:  # a slot to protect: no weight use after the tail
            for name, module in _weight_modules(self.block):
                self.handles.append(module.register_forward_pre_hook(self._checker(name)))
                if module is not tail:
                    self.handles.append(module.register_forward_hook(self._collect))
        self.handles.append(tail.register_forward_hook(self._after_tail))

    def _checker(self, name: str):
        def check(module, args):
            if self.past_tail:
                raise RuntimeError(
                    f"offload: block {self.index}'s {name or 'forward'} runs after {self.tail[0]}, "
                    "taken for the block's last weight use (its slot is refilled from there); "
                    "pass tails=False to order the copies at the blocks' edges")
        return check

    def _collect(self, module, args, out) -> None:
        if _compiling():  # eager calls run in program order: nothing to hold on to
            self.used.extend(_tensors(out))

    def _after_tail(self, module, args, out) -> None:
        self.order(_first_tensor(out), self.tail[0])
        self.past_tail = True

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.block.__dict__.pop("forward", None)


def _install_order(off: "Offload", blocks: List[torch.nn.Module], chosen: List[int],
                   tails: bool) -> bool:
    """Hooks every streamed block, and every block just before one (which makes its wait).
    The first streamed block's wait, where it has a tail but no block before it has one, is
    made at the end of the pass before (by the last streamed block: an op at the first block's
    input would change how the compiler fuses the embeddings into what follows; _release
    refuses a pass that follows one that ended early). Returns whether it is."""
    group_of = {b: g for g, b in enumerate(chosen)}
    tail_of = {}
    for b in set(chosen) | {b - 1 for b in chosen if b > 0}:
        tail_of[b] = _tail_of(blocks[b]) if tails else None
    first, last = chosen[0], chosen[-1]
    first_at_end = (tail_of[first] is not None and
                    not (first > 0 and tail_of[first - 1] is not None))
    for b in sorted(tail_of):
        waits = []
        if group_of.get(b + 1) is not None and tail_of[b] is not None:
            waits.append(group_of[b + 1])
        if b == last and first_at_end:
            waits.append(0)
        entry = group_of.get(b)
        if entry is not None and ((b > 0 and tail_of.get(b - 1) is not None) or
                                  (b == first and first_at_end)):
            entry = None  # made by the block before, or at the end of the pass before
        order = _BlockOrder(off, b, blocks[b], entry, group_of.get(b), waits, tail_of[b])
        if order.entry_wait is None and order.release is None and not order.waits:
            continue
        order.install()
        off._orders.append(order)
    return first_at_end
