"""ferry.torch.plan_offload: before offloading, how a setting would run. Each block of the
resident model is timed over a few steps (CUDA events on a GPU), pinned host -> GPU copies are
measured, and the stream planner (ferry/stream_plan.hpp) simulates the pipeline ferry's
WeightStream would run, so a stall is known, and its size, before it happens."""
import time
from typing import Any, Callable, List, Optional, Sequence

import torch

from .. import _ferry
from ._layers import _block_params, choose_layers, find_blocks
from ._shared import nbytes

__all__ = ["plan_offload"]


def plan_offload(model: torch.nn.Module, run: Callable[[], Any], *,
                 blocks: Optional[Sequence[torch.nn.Module]] = None, group_size: Optional[int] = None,
                 last: int = 1, budget_bytes: Optional[int] = None,
                 layers: Optional[Sequence[int]] = None, prefetch: int = 1,
                 link_bytes_per_second: Optional[float] = None, steps: int = 3) -> dict:
    """Before offloading: times each block of the resident model over `steps` calls of `run`
    (after one warm-up; CUDA events on a GPU), measures pinned host -> GPU copies (or takes
    `link_bytes_per_second`), and simulates the stream these settings would run (see
    choose_layers). Returns the plan: `layers`, bytes per step, GPU bytes, and the seconds of a
    step resident (`compute_seconds`), streamed (`step_seconds`) and stalled (`stall_seconds`)."""
    blocks = list(blocks) if blocks is not None else list(find_blocks(model))
    sizes = [sum(nbytes(p) for p in _block_params(b)) for b in blocks]
    chosen = sorted(set(layers)) if layers is not None else choose_layers(
        sizes, group_size, last, budget_bytes, prefetch)
    device = next(model.parameters()).device
    gpu = device.type == "cuda"
    marks: List[List[Any]] = [[] for _ in blocks]
    handles = []
    for i, block in enumerate(blocks):
        def before(module, args, i=i):
            marks[i].append(_mark(gpu))

        def after(module, args, out, i=i):
            marks[i].append(_mark(gpu))
        handles += [block.register_forward_pre_hook(before), block.register_forward_hook(after)]
    try:
        with torch.no_grad():
            run()
            for m in marks:
                m.clear()
            for _ in range(steps):
                run()
        if gpu:
            torch.cuda.synchronize(device)
    finally:
        for h in handles:
            h.remove()
    seconds = [sum(_elapsed(m[k], m[k + 1]) for k in range(0, len(m) - 1, 2)) / steps for m in marks]
    if link_bytes_per_second is None:
        if not gpu:
            raise ValueError("plan_offload: no GPU to measure the link on: give link_bytes_per_second")
        link_bytes_per_second = _pinned_copy_rate(device)
    other = sum(nbytes(p) for p in model.parameters()) - sum(sizes)
    plan = _ferry.plan_stream(sizes, seconds, max(other, 0), float(link_bytes_per_second), prefetch,
                              chosen, None)
    plan["layers"] = plan.pop("streamed")
    plan["link_bytes_per_second"] = link_bytes_per_second
    return plan


def _mark(gpu: bool) -> Any:
    if gpu:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _elapsed(start: Any, end: Any) -> float:
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def _pinned_copy_rate(device: torch.device, nbytes: int = 256 << 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    return 3 * nbytes / (time.perf_counter() - start)
