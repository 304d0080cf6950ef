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
import ctypes
import itertools
import weakref
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import _ferry
from ._dtypes import torch_dtype, torch_shape

__all__ = ["Offload", "offload", "choose_layers", "find_blocks"]

# handle -> Offload, for the ops (which take plain ints). Weak: the hooks hold their Offload, so
# a model dropped without undo() frees its arena and slots.
_live: "weakref.WeakValueDictionary[int, Offload]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


def _compute_stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch.cuda.current_stream(device).cuda_stream


def _wait(x: torch.Tensor, handle: int, group: int) -> None:
    off = _live[handle]
    off._stream.wait(group, _compute_stream(off.device))
    if group == 0:
        off._first_waited = True


def _release(x: torch.Tensor, after: List[torch.Tensor], handle: int, group: int) -> None:
    off = _live[handle]
    stream = _compute_stream(off.device)
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


def _aligned_bytes(n: int, device: torch.device) -> torch.Tensor:
    """n bytes at a 256-byte aligned address (CUDA allocations are; host ones may not be)."""
    raw = torch.empty(n + 255, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 256
    return raw[skip:skip + n]


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


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
        stream = _compute_stream(self.device)
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


def _checkpoint_table(checkpoint) -> Dict[str, tuple]:
    return {n: (dtype, list(shape), size, file, offset)
            for n, dtype, shape, size, file, offset in checkpoint.tensors()}


def _checked_entry(checkpoint, table, name: str, p: torch.Tensor) -> tuple:
    """(bytes, file, offset) of `name`, which must have p's dtype and shape."""
    if name not in table:
        raise ValueError(f'offload: the checkpoint {checkpoint.path} has no tensor "{name}"')
    dtype, shape, size, file, offset = table[name]
    if torch_dtype(dtype, name) != p.dtype or torch_shape(dtype, shape) != list(p.shape):
        raise ValueError(f'offload: tensor "{name}" is {dtype} {shape} in the checkpoint '
                         f"{checkpoint.path} but {p.dtype} {list(p.shape)} in the model")
    return size, file, offset


def _disk_groups(checkpoint, names: List[List[str]], params: List[List[torch.nn.Parameter]]):
    table = _checkpoint_table(checkpoint)
    groups = []
    for block_names, block_params in zip(names, params):
        group = []
        for name, p in zip(block_names, block_params):
            size, file, offset = _checked_entry(checkpoint, table, name, p)
            group.append((size, 0, file, offset))
        groups.append(group)
    return groups


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
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None and first.device.type == "cuda" else (
            "cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    blocks = list(blocks) if blocks is not None else list(find_blocks(model))
    params_of = [_block_params(b) for b in blocks]
    sizes = [sum(_nbytes(p) for p in ps) for ps in params_of]
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
        from ._open import open_checkpoint
        checkpoint_handle = open_checkpoint(checkpoint)
        names_of = {id(p): n for n, p in model.named_parameters()}
        names = [[prefix + names_of[id(p)] for p in ps] for ps in off._params]
        groups = _disk_groups(checkpoint_handle, names, off._params)
    else:
        groups = [[(_nbytes(p), 0, 0, 0) for p in ps] for ps in off._params]
    slot_sizes = _ferry.WeightStream.slot_sizes(groups, prefetch)
    off._slots = [_aligned_bytes(n, device) for n in slot_sizes]
    off.slot_bytes = sum(slot_sizes)
    engine_device = f"cuda:{device.index}" if device.type == "cuda" else "cpu"
    stream = _ferry.WeightStream(groups, prefetch, engine_device, checkpoint_handle,
                                 [s.data_ptr() for s in off._slots], io)
    # Block by block: the bytes into the arena (cpu source), then the parameter onto its slot,
    # so each parameter's own memory is freed as soon as the arena holds it.
    for g, ps in enumerate(off._params):
        for t, p in enumerate(ps):
            n = _nbytes(p)
            if source == "cpu":
                arena = torch.frombuffer((ctypes.c_uint8 * n).from_address(stream.host_address(g, t)),
                                         dtype=torch.uint8)
                arena.copy_(p.data.detach().contiguous().reshape(-1).view(torch.uint8))
            slot = off._slots[stream.slot_of(g)]
            at = stream.tensor_address(g, t) - slot.data_ptr()
            view = slot[at:at + n].view(p.dtype).view(p.shape)
            if p.device.type == "meta":  # set_data cannot leave the meta device: a new Parameter
                ps[t] = _replace_parameter(off._blocks[g], p, view)
            else:
                p.data = view
    for module in model.modules():  # the rest: resident on the device
        for name, p in module.named_parameters(recurse=False):
            if id(p) not in streamed_ids and p.device != device:
                p.data = p.data.to(device)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.device != device:
                module._buffers[name] = b.to(device)
    off._stream = stream
    off._last_group = len(chosen) - 1
    _live[off.handle] = off
    stream.prime(_compute_stream(device))
    off._first_at_end = _install_order(off, blocks, chosen, tails)
    if off._first_at_end:
        _wait(None, off.handle, 0)  # for the first pass
    return off
