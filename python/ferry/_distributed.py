"""Loading across the processes of a torch.distributed process group: every byte read from
storage once per group, each rank holding whole tensors (replicas) or its tensor-parallel slices.

Every rank computes the same plan (ferry's planner, in C++) and first checks that all ranks agree
on it (the same files, sizes and slice plan; one small all_reduce), so that ranks that disagree
all fail with the same error instead of hanging. Then, round by round: each rank reads its share
into its own memory; tensors split along an inner dimension are read whole by one rank and
broadcast to the others, which keep their columns; replicated bytes are all-gathered in place.
Only collectives run on the group (no point-to-point sends), so a fresh process's first load
uses the connections the group's first collective made. Collectives are queued
asynchronously, so the next round's reads overlap them. A rank that dies mid-load makes the others
fail when the process group's timeout (init_process_group(timeout=...)) runs out.

On machines with NVLink multicast keep NCCL_NVLS_ENABLE=0 (and TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1) in every process: ferry does not change the environment itself.
"""
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from . import _ferry
from ._collectives import Collectives, TorchCollectives
from ._dtypes import engine_device, normalize_device, tensor_table, torch_dtype, torch_shape
from ._open import open_checkpoint

# shard: None (replicas), "tensor_parallel" (vLLM's Llama/Qwen/Mistral sharding), a dict mapping
# names to None (whole), a dimension, or (dimension, [length per rank]), or a callable
# (name, shape) -> one of those. Names a dict or callable leaves out follow `default`.
Spec = Union[None, int, Tuple[int, List[int]]]
Shard = Union[None, str, Dict[str, Spec], Callable[[str, List[int]], Spec]]


def _specs(checkpoint, shard: Shard) -> Tuple[str, Dict[str, Optional[Tuple[int, List[int]]]]]:
    if shard is None or shard == "replicate":
        return "replicate", {}
    if shard in ("tp", "tensor_parallel"):
        return "tensor_parallel", {}
    if isinstance(shard, str):
        raise ValueError(f'unknown shard "{shard}": expected None, "tensor_parallel", a dict or a '
                         "callable")
    table = tensor_table(checkpoint)
    chosen = {}
    for name, (_, shape, _) in table.items():
        if callable(shard):
            spec = shard(name, list(shape))
        elif name in shard:
            spec = shard[name]
        else:
            continue
        if spec is None:
            chosen[name] = None
        elif isinstance(spec, int):
            chosen[name] = (spec, [])
        else:
            dim, sizes = spec
            chosen[name] = (int(dim), [int(s) for s in sizes])
    # A callable decides every tensor; a dict only those it names (the rest stay whole).
    return "replicate", chosen


def _handles(works: List[Any]) -> List[Any]:
    """The collectives' handles among `works` (which also keep their tensors alive)."""
    return [w for w in works if not isinstance(w, torch.Tensor)]


def _check_agreement(plan, coll: Collectives, device: torch.device, label: str) -> None:
    """Every rank raises the same error when the ranks' plans differ (never a hang on a later
    collective whose sizes disagree). One small all_reduce (MAX of the digest and of its negation
    gives the largest and the smallest): the collective a serving engine has run already, so its
    connections are up; the ranks' digests are gathered only to word the error."""
    digest, nbytes = plan.digest() & 0x7FFFFFFFFFFFFFFF, plan.read_bytes
    high_digest, high_bytes, low_digest, low_bytes = coll.max_of(
        [digest, nbytes, -digest, -nbytes], device)
    if high_digest == -low_digest and high_bytes == -low_bytes:
        return
    # every rank is here: all saw the extremes differ
    digests = coll.every_rank([digest, nbytes], device)
    detail = ", ".join(f"rank {r}: plan {d[0]:016x}, {d[1]} bytes" for r, d in enumerate(digests))
    raise ValueError(f"{label}: the ranks disagree on the checkpoint or its slice plan "
                     f"(different files, sizes or shard specs): {detail}")


# The warm-up all-gather's bytes per rank: large enough that NCCL takes the protocol and channels
# of a round's gather (256 MiB per rank), not those of a few bytes.
_WARM_GATHER_BYTES = 16 << 20


def _connect_ring(coll: Collectives, device: torch.device, gather_bytes: int,
                  works: List[Any]) -> None:
    """NCCL (2.22 on) connects a communicator's ring on the first collective that runs on it, and
    CUDA loads a kernel at its first launch; a warm-up all_reduce of a few bytes may have taken
    another algorithm (tree) and protocol. One all-gather shaped like round 0's (at most 16 MiB
    per rank), queued while round 0's reads run, pays for both then, not at round 0's gather
    (broadcasts take the same ring)."""
    if not coll.on_gpu or coll.world < 2:
        return
    per_rank = max(1, min(gather_bytes or _WARM_GATHER_BYTES, _WARM_GATHER_BYTES))
    region = torch.zeros(coll.world * per_rank, dtype=torch.uint8, device=device)
    works.append(coll.all_gather_into(region,
                                      region[coll.rank * per_rank:(coll.rank + 1) * per_rank]))
    works.append(region)  # alive until waited for


class _Timeline:
    """Where a load's time went: host marks in seconds from its start, and (NCCL) when each
    round's exchanges finished on the GPU, on the same clock through an event recorded at a
    known host time. Observation only: a stream of its own waits for the collectives, so the
    load's own streams are ordered as without it."""

    def __init__(self, device: torch.device, coll: Collectives):
        self.began = time.perf_counter()
        self.marks: List[List[Any]] = []
        self._coll = coll
        self._gpu = coll.on_gpu and device.type == "cuda"
        self._device = device
        self._events: List[Tuple[str, Any]] = []
        self._reference = None

    def mark(self, name: str) -> None:
        self.marks.append([name, time.perf_counter() - self.began])

    def start_gpu_clock(self) -> None:
        """After the device's current stream was synchronized: its reference event completes at
        once."""
        if not self._gpu:
            return
        self._stream = torch.cuda.Stream(self._device)
        self._reference = torch.cuda.Event(enable_timing=True)
        self._reference.record(torch.cuda.current_stream(self._device))
        self._reference_at = time.perf_counter() - self.began

    def exchanged(self, name: str, works: List[Any]) -> None:
        """Notes when `works` (collectives) finish on the GPU."""
        if self._reference is None:
            return
        self._coll.order(self._stream, _handles(works))
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        self._events.append((name, event))

    def result(self) -> List[List[Any]]:
        """After the device was synchronized: every mark, in time order."""
        out = list(self.marks)
        for name, event in self._events:
            out.append([name + " (gpu)", self._reference_at + self._reference.elapsed_time(event) / 1e3])
        return sorted(out, key=lambda m: m[1])


def _scatter(plan, k, coll: Collectives, memory, scratch, works) -> None:
    """Round k's tensors split along an inner dimension: each is broadcast from the rank that read
    it (its scratch) and every rank copies its columns out. A broadcast runs on the group's ring,
    which the engine's own collectives have connected already; point-to-point sends would make
    NCCL connect every pair of ranks on a fresh process's first load (seconds on 4 GPUs). The
    receive buffers stay in `works` until the round is settled."""
    scatters = plan.scatters(k)
    if not scatters:
        return
    rank = coll.rank
    inbox_bytes = sum(rows * row_bytes for reader, _, rows, row_bytes, _ in scatters if reader != rank)
    inbox = torch.empty(inbox_bytes, dtype=torch.uint8, device=memory.device) if inbox_bytes else None
    received, waits, at = [], [], 0

    def place(whole, rows, row_bytes, parts):
        rows_view = whole.view(rows, row_bytes)
        for to, dest, begin, width in parts:
            if to == rank:
                memory[dest:dest + rows * width].view(rows, width).copy_(rows_view[:, begin:begin + width])

    for reader, offset, rows, row_bytes, parts in scatters:
        n = rows * row_bytes
        if reader == rank:
            whole = scratch[offset:offset + n]
        else:
            whole = inbox[at:at + n]
            at += n
        waits.append(coll.broadcast(whole, reader))
        if reader == rank:
            place(whole, rows, row_bytes, parts)  # already here
        else:
            received.append((whole, rows, row_bytes, parts))
    coll.wait(waits)  # NCCL: the current stream waits (the host does not); gloo: done
    for whole, rows, row_bytes, parts in received:
        place(whole, rows, row_bytes, parts)
    works += waits
    if inbox is not None:
        works.append(inbox)  # alive until the round is settled


def _start_round(plan, k, rank, device, memory, scratch, engine):
    return _ferry.start_fanout_round(plan, k, rank, engine_device(normalize_device(device)),
                                     memory.data_ptr(), scratch.data_ptr(), **engine)


def _run_rounds(plan, coll: Collectives, device, memory, scratch, stats, engine, reading,
                timeline):
    """The rounds, the first rounds' reads started already (`reading`: rounds 0 and 1)."""
    rank, world = coll.rank, coll.world
    pending: List[List[Any]] = []  # per round: its works, and the tensors they send

    def settle(k):  # round k's exchanges are done (its scratch bank can be refilled)
        coll.wait(_handles(pending[k]))
        pending[k] = []
        # NCCL's wait only orders the current stream; ferry's copies run on streams of its own,
        # so the host waits until the sends out of that bank are done.
        if memory.is_cuda:
            torch.cuda.current_stream(memory.device).synchronize()

    def start(k):
        return _start_round(plan, k, rank, device, memory, scratch, engine)

    for k in range(plan.rounds):
        # Round k + 1's reads queue behind round k's while its bytes are exchanged; they refill
        # round k - 1's scratch bank, whose exchanges must be done first.
        if len(reading) < 2 and k + 1 < plan.rounds:
            if k >= 1:
                settle(k - 1)
            reading.append(start(k + 1))
        stats["reads"].append(reading.pop(0).wait())
        timeline.mark(f"round {k} read")
        works: List[Any] = []
        _scatter(plan, k, coll, memory, scratch, works)
        offset, per_rank = plan.gather(k)
        if world > 1 and per_rank > 0:
            region = memory[offset:offset + world * per_rank]
            own = region[rank * per_rank:(rank + 1) * per_rank]
            works.append(coll.all_gather_into(region, own))
        pending.append(works)
        timeline.mark(f"round {k} exchanges queued")
        timeline.exchanged(f"round {k} exchanged", works)
    for works in pending:
        coll.wait(_handles(works))


# More processes than any machine runs: a count past it is a mistake, not a machine.
_MAX_RANKS_ON_MACHINE = 4096


def ranks_on_this_machine(given: Optional[int] = None) -> int:
    """The group's ranks that load on this machine at once: `given`, else torchrun's
    LOCAL_WORLD_SIZE, else 1."""
    value = given if given is not None else os.environ.get("LOCAL_WORLD_SIZE") or 1
    try:
        ranks = int(value)
    except (TypeError, ValueError):
        ranks = 0
    if not 1 <= ranks <= _MAX_RANKS_ON_MACHINE:
        source = "ranks_on_machine" if given is not None else "LOCAL_WORLD_SIZE"
        raise ValueError(f"{source} must be a whole number from 1 to {_MAX_RANKS_ON_MACHINE}, "
                         f"not {value!r}")
    return ranks


def load_sharded(path, device: Any = "cpu", process_group=None, shard: Shard = None,
                 names: Optional[Iterable[str]] = None, round_bytes: int = 0,
                 return_stats: bool = False, ranks_on_machine: Optional[int] = None, **engine):
    """This rank's tensors (name -> whole tensor or slice) on `device`; see the module doc.
    `process_group`: a torch.distributed process group (None: the default one), or the
    Collectives of a communicator the caller holds (ferry._collectives). `ranks_on_machine`: the
    group's ranks loading on this machine at once (ranks_on_this_machine()); where the engine
    chooses the reader threads, they share the machine's (from storage, 16 reads in flight between
    them; from the page cache one load's each, at most the cores)."""
    coll = (process_group if isinstance(process_group, Collectives)
            else TorchCollectives(process_group))
    rank, world = coll.rank, coll.world
    target = torch.device(normalize_device(device))
    timeline = _Timeline(target, coll)
    checkpoint = open_checkpoint(path)
    label = str(path)
    rule, specs = _specs(checkpoint, shard)
    plan = _ferry.plan_fanout(checkpoint, world, rule, specs,
                              list(names) if names is not None else None,
                              engine.get("chunk_bytes") or 0, round_bytes)
    timeline.mark("planned")
    memory = torch.empty(plan.dest_bytes(rank), dtype=torch.uint8, device=target)
    scratch = torch.empty(plan.scratch_bytes(rank), dtype=torch.uint8, device=target)
    if target.type == "cuda":  # the allocator may hand out memory that queued work still uses
        torch.cuda.current_stream(target).synchronize()
    timeline.mark("allocated")
    timeline.start_gpu_clock()
    # Rounds 0 and 1's reads (this rank's own plan, into its own memory and its two scratch
    # banks) run while the ranks check that their plans agree: a fresh process's first collective
    # and staging overlap the reads, and a rank that joins first reads ahead while it waits for
    # the others (under vLLM, ranks finish building their models at different times: 0.45 s
    # apart in one start at TP 4).
    # Two rounds read at once; the engine's choice of threads shares the machine (C++).
    engine = dict(engine, ranks_on_machine=ranks_on_this_machine(ranks_on_machine),
                  rounds_at_once=max(1, min(2, plan.rounds)))
    reading = [_start_round(plan, k, rank, device, memory, scratch, engine)
               for k in range(min(2, plan.rounds))]
    timeline.mark("rounds 0 and 1 started")

    def group_failed(e: RuntimeError) -> RuntimeError:  # a peer stopped, or a timeout ran out
        return RuntimeError(f"{label}: rank {rank} of {world}: the load across the group failed "
                            f"(did another rank stop or fail?): {e}")

    warm: List[Any] = []
    try:
        _check_agreement(plan, coll, target, label)
        timeline.mark("plans agreed")
        _connect_ring(coll, target, plan.gather(0)[1] if plan.rounds else 0, warm)
        timeline.mark("ring connect queued")
    except BaseException as e:
        for started in reading:
            try:
                started.wait()  # its copies land in memory this function frees
            except Exception:  # noqa: BLE001 - the disagreement is the error to report
                pass
        if isinstance(e, RuntimeError):  # the process group's (a disagreement is a ValueError)
            raise group_failed(e) from e
        raise
    stats = {"rank": rank, "ranks": world, "reads": [], "link_bytes": plan.link_bytes[rank],
             "peer_bytes": plan.peer_bytes[rank], "read_bytes_all_ranks": plan.read_bytes}
    try:
        timeline.exchanged("ring connected", warm)
        _run_rounds(plan, coll, device, memory, scratch, stats, engine, reading, timeline)
        coll.wait(_handles(warm))
        timeline.mark("exchanges waited")
    except RuntimeError as e:
        raise group_failed(e) from e
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    timeline.mark("synchronized")

    table = tensor_table(checkpoint)
    out: Dict[str, torch.Tensor] = {}
    for name, dim, begin, end, shape, nbytes, dest in plan.pieces(rank):
        dtype = table[name][0]
        raw = memory[dest:dest + nbytes]
        out[name] = raw.view(torch_dtype(dtype, name)).reshape(torch_shape(dtype, list(shape)))
    timeline.mark("tensors built")
    stats["timeline"] = timeline.result()
    return (out, stats) if return_stats else out


def slice_plan(path, ranks: int, shard: Shard = None, names: Optional[Iterable[str]] = None
               ) -> List[Dict[str, Tuple[int, int, int, List[int]]]]:
    """Per rank: name -> (dim, begin, end, shape) of what it holds (dim -1: the whole tensor), so
    that a framework can allocate its sharded parameters before load_into."""
    checkpoint = open_checkpoint(path)
    rule, specs = _specs(checkpoint, shard)
    plan = _ferry.plan_fanout(checkpoint, ranks, rule, specs,
                              list(names) if names is not None else None)
    return [{name: (dim, begin, end, list(shape))
             for name, dim, begin, end, shape, _, _ in plan.pieces(r)} for r in range(ranks)]


def load_into_sharded(tensors: Dict[str, torch.Tensor], path, process_group=None,
                      shard: Shard = None, strict: bool = True, **engine) -> dict:
    """Fills this rank's (already sharded) parameters from the checkpoint: each target must have
    its slice's dtype and shape. Returns 'missing' and 'unexpected' as load_into does."""
    loaded, stats = load_sharded(path, next(iter(tensors.values())).device if tensors else "cpu",
                                 process_group, shard, return_stats=True, **engine)
    missing = [n for n in tensors if n not in loaded]
    unexpected = [n for n in loaded if n not in tensors]
    if strict and (missing or unexpected):
        raise RuntimeError(f"{path}: missing {missing}, unexpected {unexpected}")
    for name, source in loaded.items():
        if name not in tensors:
            continue
        target = tensors[name]
        data = target.data if isinstance(target, torch.nn.Parameter) else target
        if data.dtype != source.dtype or data.shape != source.shape:
            raise ValueError(f'tensor "{name}": this rank\'s slice is {source.dtype} '
                             f"{list(source.shape)}, target has {data.dtype} {list(data.shape)}")
        data.copy_(source)
    stats.update({"missing": missing, "unexpected": unexpected})
    return stats
