"""A group load by N processes of one machine (one per rank, as vLLM and torchrun run them),
from storage or from the page cache: ferry._distributed.load_sharded with the engine's reader
threads (shared by the machine's ranks: from storage they read together with what one load
reads with) beside fixed threads per rank (`--threads-per-rank 16`: each rank as many as one
load). A fresh group of processes per run (a server's first load); the page cache of the
checkpoint dropped before each cold run (posix_fadvise, no root needed for clean pages).
Prints the slowest rank's load (from a barrier after the group formed to the last rank done) and
the checkpoint's bytes over it.

    python bench/load/group_cold.py --dir CHECKPOINT --ranks 4 --device cpu --runs 3 \\
        --states cold --threads-per-rank 16,4
    python bench/load/group_cold.py --dir /tmp/llama8b --ranks 4 --device cuda --states cold,warm
"""
import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from common import drop_file_cache  # noqa: E402

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def files_of(path):
    return sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]


def child(args):
    import torch
    import torch.distributed as dist
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=ranks,
                            device_id=torch.device("cuda", rank) if cuda else None)
    from ferry._distributed import load_sharded
    device = f"cuda:{rank}" if cuda else "cpu"
    engine = {"threads": args.threads} if args.threads else {}
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)  # the group's connections made before the clock
    dist.barrier()
    started = time.perf_counter()
    tensors, stats = load_sharded(args.path, device, None, "tensor_parallel", return_stats=True,
                                  ranks_on_machine=ranks, **engine)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    reads = stats["reads"]
    mine = {"rank": rank, "seconds": seconds, "bytes_read": sum(r["bytes_read"] for r in reads),
            "threads": max(r.get("reader_threads", 0) for r in reads),
            "why": reads[0].get("settings_source", "") if reads else ""}
    everyone = [None] * ranks
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)
    dist.destroy_process_group()


def run_group(args, threads):
    port = None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **SAFE_ENV)
        command = [sys.executable, __file__, "--child", "--path", args.dir, "--device",
                   args.device, "--threads", str(threads)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    for line in outputs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit("rank 0 printed no result")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="a safetensors checkpoint (file or directory)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--states", default="cold", help="cold, warm or both (comma-separated)")
    ap.add_argument("--threads-per-rank", default="",
                    help="fixed reader threads per rank to compare, comma-separated (0: the "
                         "engine's choice, always run)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.dir:
        ap.error("--dir is required")
    total = sum(os.path.getsize(f) for f in files_of(args.dir))
    variants = [0] + [int(t) for t in args.threads_per_rank.split(",") if t and int(t)]
    print(f"{args.ranks} ranks on {args.device}, {total / 1e9:.2f} GB, fresh processes a run; "
          "slowest rank's seconds (GB/s of the checkpoint)", flush=True)
    for state in args.states.split(","):
        results = {v: [] for v in variants}
        for run in range(args.runs):
            for v in variants:  # alternating, so the disk's drift falls on every variant
                if state == "cold":
                    for f in files_of(args.dir):
                        drop_file_cache(f)
                ranks = run_group(args, v)
                slowest = max(r["seconds"] for r in ranks)
                results[v].append(slowest)
                name = "engine's choice" if v == 0 else f"{v} threads a rank"
                print(f"  {state} run {run + 1} {name:18s} {slowest:.3f} s "
                      f"({total / slowest / 1e9:.2f} GB/s), threads a round {ranks[0]['threads']}"
                      f"; {ranks[0]['why']}", flush=True)
        for v, seconds in results.items():
            name = "engine's choice" if v == 0 else f"{v} threads a rank"
            median = statistics.median(seconds)
            print(f"{state} {name:18s} median {median:.3f} s ({total / median / 1e9:.2f} GB/s), "
                  f"runs {' '.join(f'{s:.3f}' for s in seconds)}", flush=True)


if __name__ == "__main__":
    main()
