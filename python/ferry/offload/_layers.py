"""ferry.torch.offload: some of a model's repeated blocks (decoder layers) live off the GPU, in
ferry's pinned host arena or in the checkpoint on disk, and stream into static GPU slots just
before they run (ferry's WeightStream). Their parameters become views of slot memory, so
torch.compile and CUDA graphs see ordinary GPU tensors; two custom ops (ferry::wait_group,
ferry::release_group) keep the copies ordered on the device, and declare an activation mutated
so that torch.compile cannot move them.

Where the ops stand: a block's last weight use is its "tail" module (the last registered module
holding a matrix: a decoder layer's down projection). Right after the tail's output, the block's
slot is released and the next block's wait is made; so nothing stands between a block's residual
add and the next block's input norm, which torch.compile fuses (the sum kept in fp32) exactly as
in the resident model, and the compiled offloaded model computes bit for bit what the compiled
resident one does. Hooks check at every call that no weight-holding module of the block runs
after its tail (an error, never a slot read after its refill); a block whose tail does not run,
or that has none (its own forward reads parameters; the last matrix comes with a bias), is
ordered at its edges instead.

Under CUDA graph capture, copies issued during the capture are part of the graph and the last
streamed block joins them before returning; capture whole forward passes, after at least one
eager pass (as torch.cuda.graph users do to warm up)."""
from collections import Counter
from typing import Any, List, Optional, Sequence

import torch

from .. import _ferry
from ._ops import _ids, _live, _wait
from ._order import _BlockOrder, _install_order
from ._shared import (aligned_bytes, compute_stream, disk_groups, engine_device, fill_arena,
                      move_others, nbytes, resolve_device)

__all__ = ["Offload", "offload", "choose_layers", "find_blocks"]


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's repeated blocks: the ModuleList holding the most parameter bytes
    (model.model.layers for transformers' decoders)."""
    best, best_bytes = None, 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            size = sum(p.numel() * p.element_size() for p in module.parameters())
            if size > best_bytes:
                best, best_bytes = module, size
    if best is None:
        raise ValueError("offload: the model has no ModuleList of blocks with parameters; "
                         "pass blocks=")
    return best


def _block_params(block: torch.nn.Module) -> List[torch.nn.Parameter]:
    seen, out = set(), []
    for p in block.parameters():
        if id(p) not in seen and p.numel() > 0:
            seen.add(id(p))
            out.append(p)
    return out


def _uses(root: torch.nn.Module, ids=None, outside=False) -> "Counter[int]":
    """How many modules under `root` hold each parameter (by id): with outside=True, only the
    parameters not in `ids`."""
    out: Counter = Counter()
    for m in root.modules():
        for p in m._parameters.values():
            if p is not None and (not outside or id(p) not in ids):
                out[id(p)] += 1
    return out


def _replace_parameter(block: torch.nn.Module, old: torch.nn.Parameter,
                       data: torch.Tensor) -> torch.nn.Parameter:
    new = torch.nn.Parameter(data, requires_grad=old.requires_grad)
    for module in block.modules():
        for name, p in module._parameters.items():
            if p is old:
                module._parameters[name] = new
    return new


def choose_layers(sizes: Sequence[int], group_size: Optional[int] = None, last: int = 1,
                  budget_bytes: Optional[int] = None, prefetch: int = 1) -> List[int]:
    """Which of blocks of these byte sizes stream. `group_size` N and `last` K: the last K of
    every N consecutive blocks (vLLM's offload groups); `budget_bytes`: the fewest evenly spaced
    blocks whose streaming saves at least that much GPU memory (streamed bytes minus the
    `prefetch` slots they need). Neither: every block."""
    n = len(sizes)
    if n == 0:
        raise ValueError("offload: no blocks")
    if budget_bytes is not None:
        if group_size is not None:
            raise ValueError("offload: give group_size/last or budget_bytes, not both")
        if budget_bytes <= 0:
            raise ValueError(f"offload: budget_bytes must be positive, not {budget_bytes}")
        most = sum(sizes) - min(prefetch, n) * max(sizes)
        if budget_bytes > most:
            raise ValueError(f"offload: a budget of {budget_bytes} bytes is more than streaming "
                             f"can save: at most {most} bytes of the {sum(sizes)} the {n} blocks "
                             f"hold with prefetch {prefetch}")
        plan = _ferry.plan_stream(list(sizes), [], 0, 1.0, prefetch, None, sum(sizes) - budget_bytes)
        return plan["streamed"]
    group_size = 1 if group_size is None else group_size
    try:
        return _ferry.every_nth_blocks(n, group_size, last)
    except (ValueError, TypeError) as e:
        raise ValueError(f"offload: group_size {group_size} and last {last}: need "
                         "1 <= last <= group_size") from e


class Offload:
    """What offload() did, and the way back (undo())."""

    def __init__(self):
        self.handle = next(_ids)
        self.device = torch.device("cpu")
        self.layers: List[int] = []
        self.source = "cpu"
        self.streamed_bytes = 0
        self.slot_bytes = 0
        self._stream = None
        self._blocks: List[torch.nn.Module] = []
        self._params: List[List[torch.nn.Parameter]] = []
        self._slots: List[torch.Tensor] = []
        self._last_group = -1
        self._orders: List[_BlockOrder] = []
        # The first group's wait is made at the end of each pass, for the next (see
        # _install_order); _first_waited: it was made since the group's last release.
        self._first_at_end = False
        self._first_waited = False

    @property
    def saved_bytes(self) -> int:
        """GPU memory the streamed blocks no longer hold, less the slots."""
        return self.streamed_bytes - self.slot_bytes

    def stats(self) -> dict:
        return self._stream.stats()

    def undo(self) -> None:
        """Puts every streamed parameter back on the device, resident, and removes the hooks."""
        if self._stream is None:
            return
        stream = compute_stream(self.device)
        for g, params in enumerate(self._params):
            self._stream.wait(g, stream)
            for p in params:
                p.data = p.data.clone()
            self._stream.release(g, stream)
        for order in self._orders:
            order.remove()
        self._orders = []
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._stream.synchronize()
        _live.pop(self.handle, None)
        self._stream, self._slots = None, []

    def __repr__(self) -> str:
        return (f"Offload(layers={self.layers}, source={self.source!r}, prefetch="
                f"{self._stream.prefetch if self._stream else None}, saved_bytes={self.saved_bytes})")


def offload(model: torch.nn.Module, *, device: Any = None, blocks: Optional[Sequence[torch.nn.Module]] = None,
            group_size: Optional[int] = None, last: int = 1, budget_bytes: Optional[int] = None,
            layers: Optional[Sequence[int]] = None, prefetch: int = 1, source: str = "cpu",
            checkpoint: Any = None, prefix: str = "", io: str = "auto",
            tails: bool = True) -> Offload:
    """Streams some of `model`'s blocks into static slots on `device` (default: where the
    model's first parameter is, else cuda:0). Which: `layers` (indices into the blocks), or
    `group_size`/`last`, or `budget_bytes` (see choose_layers); default every block. `source`:
    "cpu" (ferry's pinned arena, filled from the parameters' current bytes) or "disk" (read
    from `checkpoint`, a safetensors/GGUF path whose names are the model's parameter names,
    after `prefix`, at every use; the streamed parameters may then be on the meta device).
    Every other parameter and buffer moves to `device`. Host memory grows by the streamed bytes
    (the arena) while each streamed parameter's own memory is freed as its bytes move there.
    `tails`: order the copies right after each block's last weight-using module (see the
    module's doc: torch.compile then fuses across blocks as in the resident model); False: at
    the blocks' inputs and outputs. Returns an Offload; its undo() makes the model resident
    again."""
    if source not in ("cpu", "disk"):
        raise ValueError(f'offload: source must be "cpu" or "disk", not {source!r}')
    if source == "disk" and checkpoint is None:
        raise ValueError('offload: source="disk" needs checkpoint= (a safetensors or GGUF path)')
    device = resolve_device(model, device)
    blocks = list(blocks) if blocks is not None else list(find_blocks(model))
    params_of = [_block_params(b) for b in blocks]
    sizes = [sum(nbytes(p) for p in ps) for ps in params_of]
    if layers is None:
        chosen = choose_layers(sizes, group_size, last, budget_bytes, prefetch)
    else:
        chosen = sorted(set(layers))
        if not chosen or chosen[0] < 0 or chosen[-1] >= len(blocks):
            raise ValueError(f"offload: layers {list(layers)} are not indices of the {len(blocks)} blocks")
    if not 1 <= prefetch <= len(chosen):
        raise ValueError(f"offload: a prefetch distance of {prefetch}; it must be 1 to the "
                         f"{len(chosen)} streamed blocks")
    streamed_ids = set()
    for i in chosen:
        if not params_of[i]:
            raise ValueError(f"offload: block {i} has no parameters to stream")
        for p in params_of[i]:
            if id(p) in streamed_ids:
                raise ValueError(f"offload: a parameter of block {i} is shared with another streamed block")
            streamed_ids.add(id(p))
    if source == "cpu" and any(p.device.type == "meta" for i in chosen for p in params_of[i]):
        raise ValueError('offload: source="cpu" needs the parameters\' bytes; they are on the '
                         'meta device (use source="disk")')
    if _uses(model) != sum((_uses(blocks[i]) for i in chosen), Counter()) + _uses(model, streamed_ids, True):
        raise ValueError("offload: a streamed parameter is shared with a module outside the streamed blocks")

    off = Offload()
    off.device, off.layers, off.source = device, chosen, source
    off._blocks = [blocks[i] for i in chosen]
    off._params = [params_of[i] for i in chosen]
    off.streamed_bytes = sum(sizes[i] for i in chosen)
    checkpoint_handle = None
    if source == "disk":
        from .._open import open_checkpoint
        checkpoint_handle = open_checkpoint(checkpoint)
        names_of = {id(p): n for n, p in model.named_parameters()}
        names = [[prefix + names_of[id(p)] for p in ps] for ps in off._params]
        groups = disk_groups(checkpoint_handle, names, off._params)
    else:
        groups = [[(nbytes(p), 0, 0, 0) for p in ps] for ps in off._params]
    slot_sizes = _ferry.WeightStream.slot_sizes(groups, prefetch)
    off._slots = [aligned_bytes(n, device) for n in slot_sizes]
    off.slot_bytes = sum(slot_sizes)
    stream = _ferry.WeightStream(groups, prefetch, engine_device(device), checkpoint_handle,
                                 [s.data_ptr() for s in off._slots], io)
    # Block by block: the bytes into the arena (cpu source), then the parameter onto its slot,
    # so each parameter's own memory is freed as soon as the arena holds it.
    for g, ps in enumerate(off._params):
        for t, p in enumerate(ps):
            n = nbytes(p)
            if source == "cpu":
                fill_arena(stream.host_address(g, t), p.data)
            slot = off._slots[stream.slot_of(g)]
            at = stream.tensor_address(g, t) - slot.data_ptr()
            view = slot[at:at + n].view(p.dtype).view(p.shape)
            if p.device.type == "meta":  # set_data cannot leave the meta device: a new Parameter
                ps[t] = _replace_parameter(off._blocks[g], p, view)
            else:
                p.data = view
    move_others(model, device, streamed_ids)  # the rest: resident on the device
    off._stream = stream
    off._last_group = len(chosen) - 1
    _live[off.handle] = off
    stream.prime(compute_stream(device))
    off._first_at_end = _install_order(off, blocks, chosen, tails)
    if off._first_at_end:
        _wait(None, off.handle, 0)  # for the first pass
    return off
