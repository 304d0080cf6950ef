"""The two custom ops that order layer offloading's copies on the device (ferry::wait_group,
ferry::release_group), and the registry of live offloads they find by handle."""
import itertools
import weakref
from typing import Any, List

import torch

from ._shared import compute_stream

# handle -> Offload (_layers.py), for the ops (which take plain ints). Weak: the hooks hold their
# Offload, so a model dropped without undo() frees its arena and slots.
_live: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


def _wait(x: torch.Tensor, handle: int, group: int) -> None:
    off = _live[handle]
    off._stream.wait(group, compute_stream(off.device))
    if group == 0:
        off._first_waited = True


def _release(x: torch.Tensor, after: List[torch.Tensor], handle: int, group: int) -> None:
    off = _live[handle]
    stream = compute_stream(off.device)
    if group == 0 and off._first_at_end and not off._first_waited:
        # The pass before ended early (an exception inside the model) and never made the first
        # block's wait: this pass read a slot that may hold other bytes. Wait now, so that the
        # next pass starts right, and say so.
        off._stream.wait(0, stream)
        off._first_waited = True
        raise RuntimeError("offload: the pass before this one did not finish (an exception "
                           "inside the model), so the first streamed block ran before its "
                           "weights were waited for; this pass is void, the next one is right")
    off._stream.release(group, stream)
    if group == 0:
        off._first_waited = False
    if group == off._last_group:
        off._stream.join(stream)  # ends the copy stream's forks inside a graph capture


# torch >= 2.4: custom ops, so torch.compile keeps them in place and calls them as they are.
_custom_ops = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
if _custom_ops:
    @torch.library.custom_op("ferry::wait_group", mutates_args=("x",))
    def _wait_op(x: torch.Tensor, handle: int, group: int) -> None:
        _wait(x, handle, group)

    @_wait_op.register_fake
    def _(x, handle, group):
        return None

    # `after`: the outputs of the block's other weight-using modules, so that the compiler
    # orders the release after all of them even where they do not feed `x`.
    @torch.library.custom_op("ferry::release_group", mutates_args=("x",))
    def _release_op(x: torch.Tensor, after: List[torch.Tensor], handle: int, group: int) -> None:
        _release(x, after, handle, group)

    @_release_op.register_fake
    def _(x, after, handle, group):
        return None

    _wait_call, _release_call = _wait_op, _release_op
else:
    _wait_call, _release_call = _wait, _release


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and
                compiler.is_compiling())
