"""Tensor parallelism in load format "ferry": how the ranks of vLLM's tensor-parallel group get
the checkpoint's tensors before vLLM's weight loaders slice them (model_loader_extra_config
`tp_mode`).

- "process_group" (the default with more than one rank): the group reads each byte once between
  them (each rank its share, with ferry's engine onto its GPU) and shares it over vLLM's own
  process group (the TP group's device group: NCCL on GPUs, gloo on the CPU), through
  ferry.torch's group load (ferry._distributed); every rank then holds whole tensors, a group of
  about `group_bytes` at a time, the next group loading while vLLM consumes this one.
- "slices": each rank reads only the bytes of its slices (ferry's tensor-parallel rule for
  Llama/Qwen/Mistral names: q/k/v, gate/up, embeddings and lm_head by rows, o_proj and down_proj
  by columns), into tensors of the checkpoint's full shape whose other elements are NaN. After
  vLLM's loaders ran, a parameter holding a NaN means vLLM took elements this rank did not read
  (fewer KV heads than ranks, a padded vocabulary, another architecture's sharding): the load
  stops with an error naming the parameters, never wrong weights.
- "each_rank_reads_all": each rank reads the whole checkpoint (as vLLM's safetensors loader).
- "auto": "slices", checked: where vLLM took elements a rank did not read on any rank of the
  group (the ranks agree over the group), the whole load again through "process_group", saying
  so in vLLM's log; a quantized model goes through "process_group" at once. Never wrong weights,
  and no error for a model ferry's rule does not fit.
"""
import concurrent.futures
from typing import Dict, Iterator, List, Tuple

import torch

TP_MODES = ("process_group", "slices", "each_rank_reads_all", "auto")
# Slices are filled around with NaN, so only dtypes that have one are sliced.
_SLICED_DTYPES = {"F16", "BF16", "F32", "F64"}


def tp_group():
    """(rank, ranks, torch process group) of vLLM's tensor-parallel group; (0, 1, None) when
    vLLM's model parallelism is not set up (a single process)."""
    from vllm.distributed import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        return 0, 1, None
    group = parallel_state.get_tp_group()
    return group.rank_in_group, group.world_size, group.device_group


def choose_mode(requested, ranks: int, quantized: bool = False) -> str:
    """The mode a load runs first: "auto" reads slices (checked after vLLM's loaders ran),
    process_group for a quantized model."""
    if ranks <= 1:
        return "each_rank_reads_all"
    if requested == "auto":
        return "process_group" if quantized else "slices"
    return requested or "process_group"


def any_rank(flag: bool, group) -> bool:
    """Whether `flag` holds on any rank of the torch process group (every rank calls it)."""
    import torch.distributed as dist
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
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


def group_weights(path: str, device: str, process_group, groups: List[List[str]],
                  stats: Dict, **engine) -> Iterator[Tuple[str, torch.Tensor]]:
    """tp_mode "process_group": every tensor whole on every rank, each byte read once by the
    group. `stats["bytes_read"]` counts this rank's reads."""
    from ferry._distributed import load_sharded

    def load(names):
        return load_sharded(path, device, process_group, None, names=names, return_stats=True,
                            **engine)

    for names, (tensors, loaded) in _prefetched(groups, load, device):
        stats["bytes_read"] += sum(r.get("bytes_read", 0) for r in loaded["reads"])
        for name in names:
            yield name, tensors.pop(name)


def _slice_target(full: torch.Tensor, piece, device: str):
    """Prepares `full` (the checkpoint's shape) for this rank's slice: the elements outside the
    slice set to NaN; for a slice of columns, the packed buffer its rows' ranges land in first."""
    dim, begin, end, _ = piece
    if dim == 0:
        full[:begin].fill_(float("nan"))
        full[end:].fill_(float("nan"))
        return None
    full.fill_(float("nan"))
    return torch.empty((full.shape[0], end - begin), dtype=full.dtype, device=device)


def _submit_slice(reader, full: torch.Tensor, packed, name: str, piece, device: str):
    """Submits the read of this rank's slice of `name`: a slice of rows in place, one byte range;
    a slice of columns into `packed`, a range per row."""
    dim, begin, end, _ = piece
    size = full.element_size()
    row = size * (full.numel() // full.shape[0])
    if dim == 0:
        return reader.submit(name, begin * row, (end - begin) * row,
                             full.data_ptr() + begin * row, device)
    ranges = [(r * row + begin * size, r * row + end * size) for r in range(full.shape[0])]
    return reader.submit_ranges(name, ranges, packed.data_ptr(), device)


def slice_weights(path: str, device: str, rank: int, ranks: int, groups: List[List[str]],
                  stats: Dict) -> Iterator[Tuple[str, torch.Tensor]]:
    """tp_mode "slices": this rank's slices read, each in a tensor of the checkpoint's shape."""
    import ferry
    from ferry import _ferry
    from ferry._dtypes import tensor_table, torch_dtype

    checkpoint = ferry.Checkpoint.open(path)
    table = tensor_table(checkpoint)
    pieces = ferry.torch.slice_plan(path, ranks, "tensor_parallel")[rank]
    reader = _ferry.TensorReader(checkpoint)

    def load(names):
        targets = []  # (name, tensor, its piece or None when read whole, packed buffer)
        for name in names:
            dtype, shape, _ = table[name]
            piece = pieces[name]
            tensor = torch.empty(shape, dtype=torch_dtype(dtype, name), device=device)
            sliced = (piece[0] == 0 or piece[0] == 1 and len(shape) == 2) and \
                dtype in _SLICED_DTYPES and tensor.numel() > 0
            packed = _slice_target(tensor, piece, device) if sliced else None
            targets.append((name, tensor, piece if sliced else None, packed))
        cuda = device.startswith("cuda")
        if cuda:  # the allocator may hand out memory that queued work still uses
            torch.cuda.current_stream().synchronize()
        pending = []
        for name, tensor, piece, packed in targets:
            if piece is not None:  # a rank past a short tensor's rows reads none of it
                ticket = (_submit_slice(reader, tensor, packed, name, piece, device)
                          if piece[2] > piece[1] else None)
            elif tensor.numel():
                ticket = reader.submit(name, 0, tensor.numel() * tensor.element_size(),
                                       tensor.data_ptr(), device)
            else:
                ticket = None
            pending.append(ticket)
        out = {}
        for (name, tensor, piece, packed), ticket in zip(targets, pending):
            if ticket is not None:
                reader.wait(ticket)
            if packed is not None:
                tensor[:, piece[1]:piece[2]].copy_(packed)
            out[name] = tensor
        if cuda:  # the column copies done before vLLM's thread uses the tensors
            torch.cuda.current_stream().synchronize()
        return out

    before = reader.bytes_read
    for names, tensors in _prefetched(groups, load, device):
        stats["bytes_read"] = reader.bytes_read - before
        for name in names:
            yield name, tensors.pop(name)


def slices_not_taken(model: torch.nn.Module) -> List[str]:
    """After a "slices" load: the parameters holding a NaN (they took elements this rank did
    not read)."""
    return [name for name, p in model.named_parameters()
            if p.dtype.is_floating_point and p.numel() and bool(torch.isnan(p).any())]


def check_slices_taken(model: torch.nn.Module) -> None:
    """After a "slices" load: a parameter holding a NaN took elements this rank did not read."""
    bad = slices_not_taken(model)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise ValueError("load format ferry, tp_mode \"slices\": vLLM took elements this rank did "
                         f"not read into {shown} (the model shards these tensors otherwise than "
                         "ferry's tensor-parallel rule: fewer KV heads than ranks, a padded "
                         "vocabulary, another architecture; or the checkpoint holds NaN); use "
                         "tp_mode \"process_group\"")
