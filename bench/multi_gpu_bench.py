"""Multi-GPU loading (issues 15 and 17): one checkpoint onto N GPUs of this node from one
process, as replicas and as tensor-parallel slices, warm and cold, and through ferry.torch.load_file
with a torch.distributed process group (one process per GPU), beside one single-GPU load, N
independent single-GPU loads at once, and the NCCL all-gather rate measured in the same run.

usage: multi_gpu_bench.py --ferry BIN --dir CHECKPOINTS [--model llama3-8b] [--gpus N]
                          [--runs 3] [--sources warm cold] [--json OUT]

Every process gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (NVLink multicast can take a host's GPUs out of service). Cold runs drop
the page cache before each load (needs root). Targets: issue 15 (2 GPUs, warm): replicas <= 0.6
x one single-GPU load, tensor parallel <= 0.55 x; issue 17 (N GPUs): replicas within 1.3 x
(single / N + checkpoint / all-gather rate), tensor parallel within 1.3 x single / N, where
single / N stands for the time one GPU needs to load 1/N of the bytes.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(SAFE_ENV)


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm_page_cache(path):
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            while f.read(64 << 20):
                pass


def ferry_json(binary, path, devices, runs, extra=()):
    cmd = [binary, "load", path, "--device", devices, "--json", "--repeat", str(runs), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def independent(binary, path, n, cold):
    """N processes, one per GPU, started together; each reports its own load time."""
    if cold:
        drop_page_cache()
    procs = [subprocess.Popen([binary, "load", path, "--device", f"cuda:{i}", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    rows = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"independent load: {err.strip()[-300:]}")
        rows.append(json.loads(out)[0])
    return {"seconds": max(r["seconds"] for r in rows),
            "bytes_read": sum(r["bytes_read"] for r in rows)}


def best_of(runs, key="seconds"):
    return min(runs, key=lambda r: r[key])


def measure(binary, path, n, runs, cold):
    def load(devices, extra=()):
        if not cold:
            return best_of(ferry_json(binary, path, devices, runs, extra))
        rows = []
        for _ in range(1):  # cold loads are long and steady: one each
            drop_page_cache()
            rows.append(ferry_json(binary, path, devices, 1, extra)[0])
        return best_of(rows)

    gpus = ",".join(f"cuda:{i}" for i in range(n))
    single = load("cuda:0")
    replicas = load(gpus)
    tp = load(gpus, ["--tensor-parallel"])
    indep = [independent(binary, path, n, cold) for _ in range(1 if cold else runs)]
    return {"single": {"seconds": single["seconds"], "bytes_read": single["bytes_read"],
                       "gigabytes_per_second": single["gigabytes_per_second"]},
            "independent": min(indep, key=lambda r: r["seconds"]),
            "replicas": replicas, "tensor_parallel": tp}


def init_nccl(dist, rank, n):
    """The NCCL group, bound to this rank's GPU where torch can say so (quiets its guessing)."""
    import torch
    try:
        dist.init_process_group("nccl", rank=rank, world_size=n,
                                device_id=torch.device(f"cuda:{rank}"))
    except TypeError:  # torch < 2.3
        dist.init_process_group("nccl", rank=rank, world_size=n)


def _gather_worker(rank, n, nbytes, port, queue):
    import torch
    import torch.distributed as dist
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.cuda.set_device(rank)
    init_nccl(dist, rank, n)
    part = torch.empty(nbytes // n, dtype=torch.uint8, device=f"cuda:{rank}")
    out = torch.empty(part.numel() * n, dtype=torch.uint8, device=f"cuda:{rank}")
    rates = []
    for i in range(6):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        dist.all_gather_into_tensor(out, part)
        torch.cuda.synchronize()
        if i:
            rates.append(out.numel() / (time.perf_counter() - t) / 1e9)
    if rank == 0:
        queue.put(statistics.median(rates))
    dist.destroy_process_group()


def all_gather_rate(n, nbytes):
    """GB/s each rank ends with per second of torch.distributed's NCCL all-gather (the bytes of a
    whole checkpoint-sized buffer over its time)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_gather_worker, args=(r, n, nbytes, port, queue)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError("the NCCL all-gather measurement failed")
    return queue.get()


def _torch_worker(rank, n, path, shard, runs, cold, port, queue):
    import torch
    import torch.distributed as dist
    import ferry.torch
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.cuda.set_device(rank)
    init_nccl(dist, rank, n)
    times = []
    for i in range(runs + 1):  # the first builds NCCL's communicators, as a server's start does
        if cold and i:
            if rank == 0:
                drop_page_cache()
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        tensors = ferry.torch.load_file(path, device=f"cuda:{rank}", process_group=dist.group.WORLD,
                                        shard=shard)
        torch.cuda.synchronize()
        took = torch.tensor([time.perf_counter() - t], device=f"cuda:{rank}")
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if i:
            times.append(took.item())
        del tensors
    if rank == 0:
        queue.put(min(times))
    dist.destroy_process_group()


def torch_distributed(path, n, shard, runs, cold):
    """ferry.torch.load_file with a process group: one process per GPU (time until every rank
    holds its tensors, the slowest rank's)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = 28500 + (os.getpid() + (7 if shard else 0)) % 1000
    procs = [ctx.Process(target=_torch_worker, args=(r, n, path, shard, runs, cold, port, queue))
             for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        return None
    return queue.get()


def _fast_worker(rank, n, path, tensor_parallel, cold, port, queue):
    """fastsafetensors' own distributed loading: files spread over the ranks, each tensor then
    broadcast (replicas) or scattered (get_sharded, for the tensor-parallel names)."""
    import glob
    import torch
    import torch.distributed as dist
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.cuda.set_device(rank)
    init_nccl(dist, rank, n)
    took = None
    try:
        from fastsafetensors import SafeTensorsFileLoader
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        rows = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
        times = []
        for i in range(2):  # the first builds NCCL's communicators
            if cold and rank == 0:
                drop_page_cache()
            dist.barrier()
            torch.cuda.synchronize()
            t = time.perf_counter()
            loader = SafeTensorsFileLoader(dist.group.WORLD, f"cuda:{rank}", nogds=True)
            loader.add_filenames({r: files[r::n] for r in range(n)})
            buffers = loader.copy_files_to_device()
            out = {}
            for name in buffers.key_to_rank_lidx:
                if tensor_parallel and any(r in name for r in rows):
                    out[name] = buffers.get_sharded(name, 0)
                elif tensor_parallel and ("o_proj" in name or "down_proj" in name):
                    out[name] = buffers.get_sharded(name, 1)
                else:
                    out[name] = buffers.get_tensor(name)
            torch.cuda.synchronize()
            sec = torch.tensor([time.perf_counter() - t], device=f"cuda:{rank}")
            dist.all_reduce(sec, op=dist.ReduceOp.MAX)
            times.append(sec.item())
            del out
            buffers.close()
            loader.close()
        took = times[-1]
    except Exception as e:  # reported as a row that did not run, with the reason
        took = f"{type(e).__name__}: {e}"[:200]
    if rank == 0:
        queue.put(took)
    dist.destroy_process_group()


def fastsafetensors_distributed(path, n, tensor_parallel, cold):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = 27500 + (os.getpid() + (7 if tensor_parallel else 0)) % 1000
    procs = [ctx.Process(target=_fast_worker, args=(r, n, path, tensor_parallel, cold, port, queue))
             for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return queue.get() if not queue.empty() else "a rank failed"


def report(source, n, m, gather_gbps):
    ckpt = m["replicas"]["checkpoint_bytes"]
    single = m["single"]["seconds"]
    gather_s = ckpt / (gather_gbps * 1e9) if gather_gbps else float("nan")
    rows = [("single GPU", single, m["single"]["bytes_read"]),
            (f"{n} independent loads", m["independent"]["seconds"], m["independent"]["bytes_read"]),
            (f"replicas on {n}", m["replicas"]["seconds"], m["replicas"]["bytes_read"]),
            (f"tensor parallel on {n}", m["tensor_parallel"]["seconds"],
             m["tensor_parallel"]["bytes_read"])]
    print(f"\n{source}: {ckpt / 1e9:.2f} GB checkpoint, {n} GPUs, NCCL all-gather "
          f"{gather_gbps:.0f} GB/s")
    print(f"{'load':28} {'seconds':>8} {'x single':>9} {'read x ckpt':>12} {'aggregate GB/s':>15}")
    for name, sec, read in rows:
        landed = ckpt * (n if "replicas" in name or "independent" in name else 1)
        print(f"{name:28} {sec:8.3f} {sec / single:9.2f} {read / ckpt:12.3f} {landed / sec / 1e9:15.1f}")
    for name in ("torch_replicas", "torch_tensor_parallel", "fastsafetensors_replicas",
                 "fastsafetensors_tensor_parallel"):
        sec = m.get(name)
        if isinstance(sec, float):
            landed = ckpt * (n if name.endswith("replicas") else 1)
            print(f"{name.replace('_', ' ') + ' (1 proc/GPU)':28} {sec:8.3f} {sec / single:9.2f} "
                  f"{'':>12} {landed / sec / 1e9:15.1f}")
        else:
            print(f"{name}: did not run ({sec or 'see the log'})")
    r, t = m["replicas"], m["tensor_parallel"]
    print(f"collectives: replicas {r['collective_seconds']:.3f} s device time in {r['rounds']} rounds "
          f"({r['collective']}); per-GPU host link: "
          + ", ".join(f"{x['device']} {x['link_bytes'] / 1e9:.2f} GB" for x in r["ranks"]))
    targets = {
        "issue15_replicas_vs_single": (r["seconds"] / single, 0.6),
        "issue15_tp_vs_single": (t["seconds"] / single, 0.55),
        "issue17_replicas_vs_model": (r["seconds"] / (single / n + gather_s), 1.3),
        "issue17_tp_vs_model": (t["seconds"] / (single / n), 1.3),
        "bytes_read_replicas": (r["bytes_read"] / ckpt, 1.0),
        "bytes_read_tp": (t["bytes_read"] / ckpt, 1.0),
    }
    if source == "cold":
        # Storage, not the GPUs' links, sets the pace: reading each byte once is all that helps.
        print(f"  storage-bound: one cold read of the checkpoint at {ckpt / single / 1e9:.1f} GB/s; "
              "the time targets apply to warm loads, bytes read apply here")
        targets = {k: v for k, v in targets.items() if k.startswith("bytes")}
    for k, (got, want) in targets.items():
        ok = got <= want + (1e-3 if k.startswith("bytes") else 0)
        print(f"  {k:30} {got:6.3f} (target <= {want}) {'met' if ok else 'MISSED'}")
    return {k: {"value": v, "target": w} for k, (v, w) in targets.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--gpus", type=int, default=0, help="default: every visible GPU")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sources", nargs="+", default=["warm", "cold"])
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    n = args.gpus or torch.cuda.device_count()
    if n < 2:
        sys.exit(f"multi_gpu_bench: needs 2 GPUs, {n} visible")
    path = os.path.join(args.dir, args.model)
    if not os.path.isdir(path):
        subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoints.py"), args.dir,
                        args.model], check=True)
    ckpt_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    gather_gbps = all_gather_rate(n, min(ckpt_bytes, 8 << 30) // n * n)
    results = {"model": args.model, "gpus": n, "all_gather_gbps": gather_gbps, "sources": {}}
    for source in args.sources:
        cold = source == "cold"
        if not cold:
            warm_page_cache(path)
        m = measure(args.ferry, path, n, args.runs, cold)
        runs = 1 if cold else args.runs
        m["torch_replicas"] = torch_distributed(path, n, None, runs, cold)
        m["torch_tensor_parallel"] = torch_distributed(path, n, "tensor_parallel", runs, cold)
        m["fastsafetensors_replicas"] = fastsafetensors_distributed(path, n, False, cold)
        m["fastsafetensors_tensor_parallel"] = fastsafetensors_distributed(path, n, True, cold)
        m["targets"] = report(source, n, m, gather_gbps)
        results["sources"][source] = m
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
