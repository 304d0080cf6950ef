"""Tensor parallelism in load format "ferry": how the ranks of vLLM's tensor-parallel group get
the checkpoint's tensors before vLLM's weight loaders slice them (model_loader_extra_config
`tp_mode`).

- "process_group": the group reads each byte once between
  them (each rank its share, with ferry's engine onto its GPU) and shares it over vLLM's
  tensor-parallel group, through ferry.torch's group load (ferry._distributed); every rank then
  holds whole tensors, a group of about `group_bytes` at a time, the next group loading while
  vLLM consumes this one. `tp_communicator` says which communicator carries the bytes: "auto"
  (the default): vLLM's where it holds one for the group on the load's GPU, else torch's; "vllm":
  the NCCL communicator vLLM already holds for the group (no new one, no memory; an error where
  vLLM has none, e.g. on the CPU); "torch": torch's on the group's device group (NCCL on GPUs,
  gloo on the CPU), which torch starts at the first collective there and keeps for the server's
  life (0.48 GiB more non-torch memory per GPU at TP 2 on H200, which vLLM's KV cache then
  lacks). vLLM's communicator is shared with vLLM, which issues no collective on it while its
  weight loaders run.
- "slices": each rank reads only the bytes of its slices (ferry's tensor-parallel rule for
  Llama/Qwen/Mistral names: q/k/v, gate/up, embeddings and lm_head by rows), into tensors of the
  checkpoint's full shape whose other elements are NaN; a tensor split by columns (o_proj and
  down_proj) is read whole: its slice is a short range in every row (2-7 KiB for an 8B model at
  4 ranks), thousands of small reads and copies where one large read of four times the bytes
  costs less (those reads made "slices" 2.3 x slower than "process_group" at TP 4). After
  vLLM's loaders ran, a parameter holding a NaN means vLLM took elements this rank did not read
  (fewer KV heads than ranks, a padded vocabulary, another architecture's sharding): the load
  stops with an error naming the parameters, never wrong weights.
- "group_slices": the group reads each byte once (as "process_group") and each rank receives only
  its slices (ferry's own tensor-parallel group load, the rule of "slices"), placed in tensors of
  the checkpoint's shape whose other elements are NaN as vLLM takes them, checked after vLLM's
  loaders as "slices" is. Groups of `group_bytes` x ranks (a rank holds about `group_bytes` of
  its slices at a time), one exchange round each, read before the ranks agree (a rank that
  joins first reads its share while the others build their models). Slices of F16/BF16/F32/F64
  tensors only (others whole); takes the engine options.
- "each_rank_reads_all": each rank reads the whole checkpoint (as vLLM's safetensors loader).
- "auto" (the default): "group_slices", checked: where vLLM took elements a rank did not get on
  any rank of the group (the ranks agree over the group), the whole load again through
  "process_group", saying so in vLLM's log; "process_group" at once for a quantized model. Each
  byte read once, warm or cold (slices overlap: at TP 4 each rank reads about half of an 8B
  checkpoint); never wrong weights, and no error for a model ferry's rule does not fit.
"""
import concurrent.futures
import logging
from typing import Dict, Iterator, List, Tuple

import torch

from ferry._collectives import Collectives, TorchCollectives

logger = logging.getLogger("vllm.ferry.tp")  # see _compat.logger

TP_MODES = ("process_group", "slices", "group_slices", "each_rank_reads_all", "auto")
# Where "process_group" and "group_slices" exchange bytes (model_loader_extra_config
# `tp_communicator`): the NCCL communicator vLLM already holds for the group, or torch's on the
# group's device group, which torch starts at the first collective there and keeps for the
# server's life; "auto" takes vLLM's where it exists.
TP_COMMUNICATORS = ("auto", "torch", "vllm")
# Slices are filled around with NaN, so only dtypes that have one are sliced.
_SLICED_DTYPES = {"F16", "BF16", "F32", "F64"}


def tp_group():
    """(rank, ranks) in vLLM's tensor-parallel group; (0, 1) when vLLM's model parallelism is
    not set up (a single process)."""
    from vllm.distributed import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    group = parallel_state.get_tp_group()
    return group.rank_in_group, group.world_size


class VllmNccl(Collectives):
    """The exchanges over vLLM's own NCCL communicator of the tensor-parallel group (its
    PyNcclCommunicator, made when vLLM started, over the group's CPU group); the agreements over
    the CPU (gloo) group. A load starts no communicator of its own. As torch's NCCL process group
    does, each collective runs on a stream of its own after the work queued so far on the
    current stream, and `wait` makes the current stream wait for it: vLLM's copies on the
    current stream do not queue behind a collective that waits for a slower rank."""

    def __init__(self, communicator, cpu_group):
        self._comm = communicator
        self.rank, self.world, self.on_gpu = communicator.rank, communicator.world_size, True
        self._host = TorchCollectives(cpu_group)
        self._stream = torch.cuda.Stream(communicator.device)

    def _run(self, collective, tensor: torch.Tensor):
        self._stream.wait_stream(torch.cuda.current_stream(tensor.device))
        collective(self._stream)
        done = torch.cuda.Event()
        done.record(self._stream)
        return done

    def broadcast(self, tensor, src):
        return self._run(lambda stream: self._comm.broadcast(tensor, src, stream=stream), tensor)

    def all_gather_into(self, region, own):
        return self._run(lambda stream: self._comm.all_gather(region, own, stream=stream), region)

    def max_of(self, values, device):
        return self._host.max_of(values, device)

    def every_rank(self, values, device):
        return self._host.every_rank(values, device)

    def wait(self, handles):
        for done in handles:
            done.wait()  # the current stream waits


def vllm_communicator_missing(comm, device) -> str:
    """Why vLLM's communicator of the group (`comm`, its PyNcclCommunicator or None) cannot carry
    a load onto `device`; "" where it can."""
    if comm is None or comm.disabled:
        return ("vLLM runs without one here (VLLM_DISABLE_PYNCCL, no NCCL library, or not on "
                "GPUs)")
    if not str(device).startswith("cuda"):
        return f"the load is onto {device}"
    if torch.device(device) != comm.device:
        return f"vLLM's communicator is on {comm.device}, the load onto {device}"
    return ""


def group_collectives(communicator: str, device) -> Tuple[Collectives, str]:
    """The collectives of a "process_group" or "group_slices" load on vLLM's tensor-parallel
    group (`communicator`: one of TP_COMMUNICATORS), and the communicator they run on ("vllm" or
    "torch"; where "auto" takes torch's, vLLM's log says why)."""
    from vllm.distributed import parallel_state
    group = parallel_state.get_tp_group()
    if communicator == "torch":
        return TorchCollectives(group.device_group), "torch"
    missing = vllm_communicator_missing(getattr(group.device_communicator, "pynccl_comm", None),
                                        device)
    if not missing:
        return VllmNccl(group.device_communicator.pynccl_comm, group.cpu_group), "vllm"
    if communicator == "vllm":
        raise ValueError(f"load format ferry: tp_communicator \"vllm\" uses vLLM's NCCL "
                         f"communicator of the tensor-parallel group, and {missing}; use "
                         "tp_communicator \"torch\"")
    logger.info("ferry: tp_communicator auto: torch's communicator on the group's device group, "
                "as %s", missing)
    return TorchCollectives(group.device_group), "torch"


def choose_mode(requested, ranks: int, quantized: bool = False) -> str:
    """The mode a load runs first: "auto" loads group_slices (checked after vLLM's loaders ran),
    or process_group for a quantized model."""
    if ranks <= 1:
        return "each_rank_reads_all"
    if requested == "auto":
        return "process_group" if quantized else "group_slices"
    return requested or "process_group"


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any rank of vLLM's tensor-parallel group (every rank calls it).
    Over the group's CPU (gloo) group: a collective on its device group makes torch start an
    NCCL communicator there that vLLM itself does not use, whose buffers stay on each GPU for
    the server's life, so vLLM's KV cache comes out smaller than after another load format."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        return flag
    group = parallel_state.get_tp_group().cpu_group
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def _prefetched(items: List, load, device: str) -> Iterator:
    """(item, load(item)) in order, the next item loading in a background thread while the
    caller consumes this one."""
    def run(item):
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))  # the current device is per thread
        return load(item)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(run, items[0]) if items else None
        for i, item in enumerate(items):
            result = pending.result()
            pending = pool.submit(run, items[i + 1]) if i + 1 < len(items) else None
            yield item, result


def _count_reads(stats: Dict, loaded: Dict) -> None:
    """A group load's reads into the loader's record: the file bytes this rank read, and the
    reader threads its rounds ran with and why (the engine shares a machine's between its
    ranks)."""
    reads = loaded["reads"]
    stats["bytes_read"] += sum(r.get("bytes_read", 0) for r in reads)
    for r in reads:
        if r.get("reader_threads"):
            stats["reader_threads"] = r["reader_threads"]
            stats["settings_source"] = r.get("settings_source", "")


def group_weights(path: str, device: str, collectives, groups: List[List[str]],
                  stats: Dict, **engine) -> Iterator[Tuple[str, torch.Tensor]]:
    """tp_mode "process_group": every tensor whole on every rank, each byte read once by the
    group. `stats["bytes_read"]` counts this rank's reads."""
    from ferry._distributed import load_sharded

    def load(names):
        return load_sharded(path, device, collectives, None, names=names, return_stats=True,
                            **engine)

    for names, (tensors, loaded) in _prefetched(groups, load, device):
        _count_reads(stats, loaded)
        for name in names:
            yield name, tensors.pop(name)


def _nan_outside(full: torch.Tensor, piece) -> None:
    """The elements of `full` (the checkpoint's shape) outside this rank's slice (along its
    dimension) set to NaN."""
    dim, begin, end, _ = piece
    full.narrow(dim, 0, begin).fill_(float("nan"))
    full.narrow(dim, end, full.shape[dim] - end).fill_(float("nan"))


def group_slice_weights(path: str, device: str, rank: int, ranks: int, collectives,
                        groups: List[List[str]], stats: Dict, round_bytes: int = 0,
                        **engine) -> Iterator[Tuple[str, torch.Tensor]]:
    """tp_mode "group_slices": this rank's slices from the group's load (each byte read once by
    the group), each in a tensor of the checkpoint's shape made as it is handed to vLLM (a group
    holds only this rank's share meanwhile); the other tensors whole. `round_bytes`: each rank's
    share of a round of the group's load (0: ferry's default)."""
    import ferry
    from ferry._distributed import load_sharded
    from ferry._dtypes import tensor_table, torch_dtype

    table = tensor_table(ferry.Checkpoint.open(path))
    plan = ferry.torch.slice_plan(path, ranks, "tensor_parallel")
    mine = plan[rank]

    def spec(name, shape):
        dim = mine[name][0]
        if dim < 0 or table[name][0] not in _SLICED_DTYPES:
            return None
        return dim, [plan[r][name][2] - plan[r][name][1] for r in range(ranks)]

    def load(names):
        return load_sharded(path, device, collectives, spec, names=names, return_stats=True,
                            round_bytes=round_bytes, **engine)

    for names, (parts, loaded) in _prefetched(groups, load, device):
        _count_reads(stats, loaded)
        for name in names:
            part = parts.pop(name)
            if spec(name, None) is None:
                yield name, part
                continue
            dtype, shape, _ = table[name]
            full = torch.empty(shape, dtype=torch_dtype(dtype, name), device=device)
            piece = mine[name]
            _nan_outside(full, piece)
            full.narrow(piece[0], piece[1], piece[2] - piece[1]).copy_(part)
            del part
            yield name, full


def slice_weights(path: str, device: str, rank: int, ranks: int, groups: List[List[str]],
                  stats: Dict) -> Iterator[Tuple[str, torch.Tensor]]:
    """tp_mode "slices": this rank's slices read (rows), each in a tensor of the checkpoint's
    shape; tensors split otherwise (or not at all) read whole, in one request a group."""
    import ferry
    from ferry import _ferry
    from ferry._dtypes import tensor_table, torch_dtype

    checkpoint = ferry.Checkpoint.open(path)
    table = tensor_table(checkpoint)
    pieces = ferry.torch.slice_plan(path, ranks, "tensor_parallel")[rank]
    reader = _ferry.TensorReader(checkpoint)

    def load(names):
        out, whole, rows = {}, [], []  # rows: (name, byte begin, byte length, address)
        for name in names:
            dtype, shape, _ = table[name]
            tensor = torch.empty(shape, dtype=torch_dtype(dtype, name), device=device)
            out[name] = tensor
            if tensor.numel() == 0:
                continue
            piece = pieces[name]
            if piece[0] == 0 and dtype in _SLICED_DTYPES:
                _nan_outside(tensor, piece)
                row = tensor.element_size() * (tensor.numel() // tensor.shape[0])
                if piece[2] > piece[1]:  # a rank past a short tensor's rows reads none of it
                    rows.append((name, piece[1] * row, (piece[2] - piece[1]) * row,
                                 tensor.data_ptr() + piece[1] * row))
            else:
                whole.append((name, tensor.data_ptr()))
        cuda = device.startswith("cuda")
        if cuda:  # the allocator may hand out memory that queued work still uses (and the NaNs)
            torch.cuda.current_stream().synchronize()
        tickets = [reader.submit(name, begin, length, address, device)
                   for name, begin, length, address in rows]
        if whole:
            tickets.append(reader.submit_tensors(whole, device))
        for ticket in tickets:
            reader.wait(ticket)
        return out

    before = reader.bytes_read
    for names, tensors in _prefetched(groups, load, device):
        stats["bytes_read"] = reader.bytes_read - before
        for name in names:
            yield name, tensors.pop(name)


def slices_not_taken(model: torch.nn.Module) -> List[str]:
    """After a "slices" or "group_slices" load: the parameters holding a NaN (they took elements
    this rank did not get)."""
    return [name for name, p in model.named_parameters()
            if p.dtype.is_floating_point and p.numel() and bool(torch.isnan(p).any())]


def check_slices_taken(model: torch.nn.Module, mode: str = "slices") -> None:
    """After a "slices" or "group_slices" load: a parameter holding a NaN took elements this rank
    did not get."""
    bad = slices_not_taken(model)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise ValueError(f"load format ferry, tp_mode \"{mode}\": vLLM took elements this rank did "
                         f"not read into {shown} (the model shards these tensors otherwise than "
                         "ferry's tensor-parallel rule: fewer KV heads than ranks, a padded "
                         "vocabulary, another architecture; or the checkpoint holds NaN); use "
                         "tp_mode \"process_group\"")
