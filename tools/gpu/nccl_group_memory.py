"""What a torch process group's first collective leaves on each GPU: two ranks, a gloo group
and an NCCL group over the same ranks (as vLLM's tensor-parallel group has: cpu_group and
device_group); the device memory free before and after a one-element all_reduce on each, and
torch's own reserved memory (the rest is what vLLM counts as non-torch memory).

    python3 tools/gpu/nccl_group_memory.py   (2+ GPUs; NCCL_NVLS_ENABLE=0)
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20


def rank_main(rank: int, ranks: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks)
    cpu_group = dist.new_group(list(range(ranks)), backend="gloo")
    device_group = dist.new_group(list(range(ranks)), backend="nccl")
    torch.cuda.synchronize()

    def used():
        free, total = torch.cuda.mem_get_info()
        return (total - free) / MIB, torch.cuda.memory_reserved() / MIB

    before = used()
    flag = torch.ones(1, dtype=torch.int32)
    dist.all_reduce(flag, group=cpu_group)
    after_gloo = used()
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    dist.all_reduce(flag, group=device_group)
    torch.cuda.synchronize()
    after_nccl = used()
    print(f"rank {rank}: device memory used {before[0]:.0f} MiB (torch {before[1]:.0f}); "
          f"after an all_reduce on the gloo group +{after_gloo[0] - before[0]:.0f} MiB; "
          f"after one on the NCCL group +{after_nccl[0] - after_gloo[0]:.0f} MiB "
          f"(torch +{after_nccl[1] - after_gloo[1]:.0f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(rank_main, args=(2, 29533), nprocs=2)
