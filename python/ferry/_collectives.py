"""The collectives a group load runs (ferry._distributed), behind one small interface, so that the
load can run on torch.distributed's process group or on a communicator its host already holds.

Data moves with two collectives, queued, not waited for: a broadcast from the rank that read a
tensor, and an all-gather in place of each rank's share. Their handles are waited for with
`wait` (GPU collectives: the current stream waits, the host does not) or `order` (another stream
waits). Two small agreements run on the host: the largest of a few integers over the group, and
every rank's integers (only to word an error).
"""
import abc
from typing import Any, List, Sequence

import torch
import torch.distributed as dist


class Collectives(abc.ABC):
    """What a group load needs of its group. `rank` and `world` are within the group; `on_gpu`:
    the collectives run on CUDA streams (else they block the host)."""

    rank: int
    world: int
    on_gpu: bool

    @abc.abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int) -> Any:
        """`tensor` from rank `src` of the group to every rank, in place."""

    @abc.abstractmethod
    def all_gather_into(self, region: torch.Tensor, own: torch.Tensor) -> Any:
        """`own` is region's share of this rank (region[rank * n:(rank + 1) * n])."""

    @abc.abstractmethod
    def max_of(self, values: Sequence[int], device: torch.device) -> List[int]:
        """Each of `values` the largest over the group's ranks (blocking)."""

    @abc.abstractmethod
    def every_rank(self, values: Sequence[int], device: torch.device) -> List[List[int]]:
        """Every rank's `values`, in rank order (blocking)."""

    @abc.abstractmethod
    def wait(self, handles: Sequence[Any]) -> None:
        """The current stream (or, for host collectives, the host) waits for `handles`."""

    def order(self, stream, handles: Sequence[Any]) -> None:
        """`stream` waits for `handles` (GPU collectives only)."""
        with torch.cuda.stream(stream):
            self.wait(handles)


class TorchCollectives(Collectives):
    """torch.distributed on a process group (None: the default group)."""

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.on_gpu = dist.get_backend(self.group) == "nccl"

    def _global_rank(self, rank: int) -> int:
        if self.group is dist.group.WORLD:
            return rank
        if hasattr(dist, "get_global_rank"):
            return dist.get_global_rank(self.group, rank)
        return dist.distributed_c10d._get_global_rank(self.group, rank)  # torch < 2.0

    def broadcast(self, tensor, src):
        return dist.broadcast(tensor, src=self._global_rank(src), group=self.group, async_op=True)

    def all_gather_into(self, region, own):
        if self.on_gpu:  # in place, as NCCL allows
            return dist.all_gather_into_tensor(region, own, group=self.group, async_op=True)
        return dist.all_gather(list(region.chunk(self.world)), own.clone(), group=self.group,
                               async_op=True)

    def _side(self, device: torch.device) -> torch.device:
        return device if self.on_gpu else torch.device("cpu")

    def max_of(self, values, device):
        t = torch.tensor(list(values), dtype=torch.int64, device=self._side(device))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def every_rank(self, values, device):
        mine = torch.tensor(list(values), dtype=torch.int64, device=self._side(device))
        seen = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(seen, mine, group=self.group)
        return [s.tolist() for s in seen]

    def wait(self, handles):
        for handle in handles:
            handle.wait()
