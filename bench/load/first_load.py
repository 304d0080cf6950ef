"""The first load of a fresh process (issue 27): each loader in a process of its own, its first
load timed after CUDA is initialised (and, with --nproc, after one warm-up all_reduce of the
process group), beside its later loads in the same process, pinned H2D and a raw O_DIRECT read of
the same files, all measured in the same run.

usage: first_load.py --dir DIR [--cases one-file,moe,shm] [--loaders L,...] [--temps warm,cold]
                     [--later 2] [--peer-later 1] [--scale 1.0] [--nproc N] [--device cuda|cpu]
                     [--ferry-bin PATH] [--json OUT]

Cases (checkpoints written by Hugging Face's safetensors into DIR on first use, shapes from
model_shapes.py; --scale scales every tensor's first dimension, keeping the tensor count):
  one-file  one 8.3 GB file, a 2.1 GB embedding first (one_file_8gb)
  moe       11.5 GB MoE, 3,155 tensors, 4 shards (moe_3k)
  shm       the same MoE copied to /dev/shm (tmpfs); warm only
  llama     Llama-3-8B, 16.1 GB, 4 shards (the --nproc case)
Loaders (one fresh process each; a loader that is not installed or needs CUDA reports why):
  ferry             ferry.torch.load_file (with --nproc: process_group=WORLD, replicas)
  ferry-tp          --nproc only: ferry.torch.load_file(..., shard="tensor_parallel")
  ferry-cli         `ferry load --repeat` (--nproc: --device cuda:0,...,cuda:N-1, replicas)
  instanttensor     InstantTensor's safe_open, its default backend (with --nproc: its
                    process_group mode)
  instanttensor-buffered  the same with BackendPolicy.BUFFERED
  fastsafetensors   SafeTensorsFileLoader, nogds (one GPU only)
  safetensors       safetensors.torch.load_file per shard (one GPU only)
Every load after the first frees the one before. Cold runs drop the page cache before every
load (root only; elsewhere they are skipped with the reason) and measure raw O_DIRECT reads of
the same files in the same run (16 threads x 4 MiB). With --nproc N each rank is a process of
its own (torch.multiprocessing, NCCL on cuda, gloo on cpu; NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 in each); a load's time is the slowest
rank's, from a barrier to its last byte. Prints a table; --json writes every run.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: shared helpers
from common import (can_drop_page_cache, drop_page_cache, read_through, shard_files,  # noqa: E402
                    synchronize)
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(SAFE_ENV)

CASES = {"one-file": "one-file-8gb", "moe": "moe-3k", "shm": "moe-3k", "llama": "llama3-8b"}
# "-prepared": ferry.torch.prepare(device) run to its end before the clock, as a server has it
# done while it builds its model (vLLM's ferry loader starts it then). "-dma" (before
# "-prepared"): the loads take page-cache DMA (page_cache_pin), and a preparation registers the
# checkpoint's files for it. Neither is in the defaults' lists below but "-prepared" ones.
SINGLE_LOADERS = ["ferry", "ferry-prepared", "ferry-cli", "instanttensor",
                  "instanttensor-buffered", "fastsafetensors", "safetensors"]
GROUP_LOADERS = ["ferry", "ferry-prepared", "ferry-tp", "ferry-tp-prepared", "ferry-cli",
                 "instanttensor", "instanttensor-buffered"]
CUDA_ONLY = {"instanttensor", "instanttensor-buffered", "fastsafetensors"}


def checkpoint_bytes(path):
    return sum(os.path.getsize(f) for f in shard_files(path))


def tensor_bytes(path):
    """The tensors' bytes in the checkpoint's headers."""
    from loaders import _safetensors_layout
    return sum(size for f in shard_files(path) for *_, size in _safetensors_layout(f))


# ---- checkpoints ----

def make_checkpoint(root, case, scale):
    """DIR/<model>-x<scale>, written by safetensors' save_file where missing."""
    import model_shapes
    from make_checkpoints import write_model
    model = CASES[case]
    name = model if scale == 1 else f"{model}-x{scale:g}"
    target = os.path.join(root, name)
    if not os.path.isdir(target) or not os.listdir(target):
        shapes_fn, shards = model_shapes.ALL[model]
        write_model(root, name, model_shapes.scaled(shapes_fn(), scale), shards)
    if case != "shm":
        return target
    shm = os.path.join("/dev/shm", "ferry-first-load", name)
    if not os.path.isdir(shm):
        free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
        if free < checkpoint_bytes(target) * 1.1:
            raise RuntimeError(f"/dev/shm has {free} bytes free, {target} needs more")
        shutil.copytree(target, shm + ".part")
        os.rename(shm + ".part", shm)
    return shm


# ---- the loaders, each called in a fresh process (child side) ----

# Where a ferry load's time went (its statistics; load_file is load_with_stats without them).
ENGINE_STATS = ("seconds", "allocate_seconds", "submit_seconds", "staging_seconds",
                "setup_thread_seconds", "read_thread_seconds", "wait_thread_seconds",
                "queue_thread_seconds", "reader_threads", "staging_bytes")


def load_ferry(path, device, group, shard, engine, options):
    import ferry.torch
    if group is not None:
        # load_file(..., process_group=group, shard=shard) with its statistics: the same code.
        from ferry._distributed import load_sharded
        tensors, stats = load_sharded(path, device, group, shard, return_stats=True, **options)
        engine["group_timeline"] = stats.get("timeline", [])
        if stats.get("reads"):
            engine["round0_timeline"] = stats["reads"][0].get("timeline", [])
            engine.update({k: stats["reads"][0][k] for k in ENGINE_STATS if k in stats["reads"][0]})
        return tensors
    tensors, stats = ferry.torch.load_with_stats(path, device=device, **options)
    engine.update({k: stats[k] for k in ENGINE_STATS if k in stats})
    engine["timeline"] = stats.get("timeline", [])
    engine["python_timeline"] = stats.get("python_timeline", [])
    return tensors


def load_instanttensor(path, device, group, buffered):
    import torch
    from instanttensor import BackendPolicy, safe_open
    extra = {"backend": BackendPolicy.BUFFERED} if buffered else {}
    out = {}
    with safe_open(shard_files(path), framework="pt", device=torch.device(device).index or 0,
                   process_group=group, **extra) as f:
        for name, tensor in f.tensors():
            out[name] = tensor
    return out


def load_fastsafetensors(path, device):
    from loaders import fastsafetensors_nogds
    return fastsafetensors_nogds(path, device)[0]


def load_safetensors(path, device):
    from safetensors.torch import load_file
    out = {}
    for f in shard_files(path):
        out.update(load_file(f, device=device))
    return out


PAGE_CACHE_PIN = "256GiB"  # a "-dma" loader's budget: every file of the cases fits


def base_loader(name):
    """The loader a variant name runs ("ferry-tp-dma-prepared" -> "ferry-tp")."""
    return name.removesuffix("-prepared").removesuffix("-dma")


def ferry_options(name):
    """The engine settings of a ferry loader variant."""
    return {"page_cache_pin": PAGE_CACHE_PIN} if name.removesuffix("-prepared").endswith("-dma") \
        else {}


def loader_call(name, path, device, group, engine):
    options = ferry_options(name)
    name = base_loader(name)
    if name in ("ferry", "ferry-tp"):
        shard = "tensor_parallel" if name == "ferry-tp" else None
        return lambda: load_ferry(path, device, group, shard, engine, options)
    if name in ("instanttensor", "instanttensor-buffered"):
        return lambda: load_instanttensor(path, device, group, name.endswith("buffered"))
    if name == "fastsafetensors":
        return lambda: load_fastsafetensors(path, device)
    if name == "safetensors":
        return lambda: load_safetensors(path, device)
    raise ValueError(f"unknown loader {name}")


def import_loader(name):
    """The loader's package, imported before the clock (a server imports before it loads)."""
    module = {"ferry": "ferry.torch", "ferry-tp": "ferry.torch", "instanttensor": "instanttensor",
              "instanttensor-buffered": "instanttensor", "fastsafetensors": "fastsafetensors",
              "safetensors": "safetensors.torch"}[base_loader(name)]
    __import__(module)


def prepare_ahead(name, device, path):
    """For a "-prepared" loader: ferry's first-load set-up made and waited for before the clock
    (with "-dma", the checkpoint's files registered too); what it made, else None."""
    if not name.endswith("-prepared"):
        return None
    import ferry.torch
    options = ferry_options(name)
    return ferry.torch.prepare(device, path if options else None, **options).wait()


def timed_loads(name, path, device, later, cold, group=None, before=None):
    """[{seconds, tensor_bytes, tensors}] of the first load, then `later` more; each later one
    frees the previous first. `before` runs before each clock starts (a barrier)."""
    import torch
    engine = {}
    call = loader_call(name, path, device, group, engine)
    runs = []
    for _ in range(1 + later):
        engine.clear()
        if cold and (group is None or torch.distributed.get_rank(group) == 0):
            drop_page_cache()
        if before:
            before()
        synchronize(device)
        started = time.perf_counter()
        tensors = call()
        synchronize(device)
        seconds = time.perf_counter() - started
        runs.append({"seconds": seconds, "tensors": len(tensors),
                     "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values())})
        if engine:
            runs[-1]["engine"] = dict(engine)
        del tensors
    return runs


def start_cuda(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.cuda.set_device(torch.device(device))
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)


def child_single(args):
    start_cuda(args.device)
    import_loader(args.loader)
    prepared = prepare_ahead(args.loader, args.device, args.path)
    runs = timed_loads(args.loader, args.path, args.device, args.later, args.cold)
    if prepared:
        runs[0]["prepared"] = prepared
    return runs


def _rank_main(rank, args, port, results):
    import datetime
    import torch
    import torch.distributed as dist
    os.environ.update(SAFE_ENV)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    cuda = args.device.startswith("cuda")
    device = f"cuda:{rank}" if cuda else "cpu"
    start_cuda(device)
    backend = "nccl" if cuda else "gloo"
    kwargs = {"device_id": torch.device(device)} if cuda else {}
    timeout = datetime.timedelta(seconds=300)
    try:
        dist.init_process_group(backend, rank=rank, world_size=args.nproc, timeout=timeout, **kwargs)
    except TypeError:  # torch < 2.3 has no device_id
        dist.init_process_group(backend, rank=rank, world_size=args.nproc, timeout=timeout)
    import_loader(args.loader)
    prepared = prepare_ahead(args.loader, device, args.path)
    # A serving engine's group has run a collective by the time it loads.
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)
    synchronize(device)
    runs = timed_loads(args.loader, args.path, device, args.later, args.cold,
                       group=dist.group.WORLD, before=dist.barrier)
    took = torch.tensor([r["seconds"] for r in runs], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    for r, seconds in zip(runs, took.tolist()):
        r["rank_seconds"], r["seconds"] = r["seconds"], seconds
    if prepared:
        runs[0]["prepared"] = prepared
    results[rank] = runs
    dist.barrier()
    dist.destroy_process_group()


def child_group(args):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(args, port, results), nprocs=args.nproc, join=True)
        runs = results[0]
        runs_bytes = [sum(results[r][i]["tensor_bytes"] for r in range(args.nproc))
                      for i in range(len(runs))]
    for r, nbytes in zip(runs, runs_bytes):
        r["all_ranks_tensor_bytes"] = nbytes
    return runs


def child_h2d(args, nbytes=1 << 30, repeats=5):
    """Pinned host -> GPU: torch copy_ of 1 GiB, non_blocking, the median of `repeats`."""
    import torch
    start_cuda(args.device)
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=args.device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    return [{"gigabytes_per_second": statistics.median(rates)}]


def child_odirect(args, threads=16, block=4 << 20):
    """Raw O_DIRECT reads of every file of the checkpoint, `threads` threads of `block` reads."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor
    if args.cold:
        drop_page_cache()
    files = shard_files(args.path)
    work = [(f, off) for f in files for off in range(0, os.path.getsize(f), block)]
    fds = {f: os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files}
    buffers = [mmap.mmap(-1, block) for _ in range(threads)]
    nxt = iter(range(len(work)))
    import threading
    lock = threading.Lock()

    def reader(t):
        done = 0
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return done
            f, off = work[i]
            done += os.preadv(fds[f], [buffers[t]], off)

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(reader, range(threads)))
    seconds = time.perf_counter() - started
    for fd in fds.values():
        os.close(fd)
    return [{"seconds": seconds, "tensor_bytes": nbytes, "tensors": 0}]


def child_main(args):
    if args.child == "h2d":
        out = child_h2d(args)
    elif args.child == "odirect":
        out = child_odirect(args)
    elif args.nproc > 1:
        out = child_group(args)
    else:
        out = child_single(args)
    print("FIRST_LOAD_JSON " + json.dumps(out), flush=True)


# ---- the parent: one fresh process per measurement ----

def later_loads(args, loader):
    """Later loads after the first: the peers' (slow ones among them) at most --peer-later."""
    return args.later if loader.startswith("ferry") else min(args.later, args.peer_later)


def run_child(kind, args, path="", loader="", cold=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--path", path,
           "--loader", loader, "--device", args.device, "--later", str(later_loads(args, loader)),
           "--nproc", str(args.nproc)] + (["--cold"] if cold else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env={**os.environ, **SAFE_ENV})
    except subprocess.TimeoutExpired:
        return None, f"no result within {args.timeout:g} s (--timeout)"
    for line in done.stdout.splitlines():
        if line.startswith("FIRST_LOAD_JSON "):
            return json.loads(line[len("FIRST_LOAD_JSON "):]), None
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return None, f"exit {done.returncode}: " + " | ".join(tail)


def run_cli(args, path, cold):
    """`ferry load --repeat` in one fresh process: its first load and later ones (cold: one
    process per load, the page cache dropped before each)."""
    cuda = args.device.startswith("cuda")
    if args.nproc > 1 and not cuda:
        return None, "the CLI's loads onto several devices need CUDA"
    devices = ",".join(f"cuda:{r}" for r in range(args.nproc)) if args.nproc > 1 else \
        (args.device if cuda else "cpu")

    def one(repeat):
        done = subprocess.run([args.ferry_bin, "load", path, "--device", devices, "--json",
                               "--repeat", str(repeat)], capture_output=True, text=True,
                              timeout=args.timeout)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                               f"exit {done.returncode}")
        return json.loads(done.stdout)

    try:
        if cold:
            stats = []
            for _ in range(1 + args.later):
                drop_page_cache()
                stats += one(1)
        else:
            stats = one(1 + args.later)
        runs = [{"seconds": s.get("call_seconds", s["seconds"]), "tensor_bytes": s["tensor_bytes"],
                 "engine_seconds": s["seconds"]} for s in stats]
        for run, s in zip(runs, stats):
            if s.get("timeline"):
                run["engine"] = {"timeline": s["timeline"]}
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return None, f"{type(e).__name__}: {e}"
    return runs, None


def summarize(runs, nbytes):
    first = runs[0]["seconds"]
    later = [r["seconds"] for r in runs[1:]]
    row = {"first_seconds": first, "first_gbps": nbytes / first / 1e9}
    if later:
        median = statistics.median(later)
        row.update({"later_seconds": median, "later_gbps": nbytes / median / 1e9,
                    "first_over_later": median / first})
    return row


def print_table(rows, h2d):
    print(f"\npinned H2D: {h2d:.1f} GB/s" if h2d else "\npinned H2D: not measured")
    print(f"{'case':<10} {'temp':<5} {'loader':<24} {'first s':>8} {'GB/s':>6} {'later s':>8} "
          f"{'GB/s':>6} {'1st/later':>9} {'1st/H2D':>8}")
    for r in rows:
        head = f"{r['case']:<10} {r['temp']:<5} {r['loader']:<24}"
        if r.get("error"):
            print(f"{head} {r['error'][:90]}")
            continue
        later = (f"{r['later_seconds']:>8.3f} {r['later_gbps']:>6.1f} {r['first_over_later']:>9.2f}"
                 if "later_seconds" in r else f"{'-':>8} {'-':>6} {'-':>9}")
        ratio = f"{r['first_gbps'] / h2d:>8.2f}" if h2d and r["loader"] != "raw O_DIRECT" else f"{'-':>8}"
        print(f"{head} {r['first_seconds']:>8.3f} {r['first_gbps']:>6.1f} {later} {ratio}")


# The timelines a ferry load reports (milliseconds from its start): the engine's (one GPU; the
# CLI's too), the Python call's around it, and with --nproc the group load's and its round 0
# reads'.
TIMELINES = (("timeline", "engine"), ("python_timeline", "python"),
             ("group_timeline", "group load"), ("round0_timeline", "round 0 reads"))


def format_timeline(marks, limit=24):
    """'name ms, ...' of a timeline's marks, rounds past the first two elided."""
    shown = [m for m in marks if not (m[0].startswith("round ") and m[0].split()[1].isdigit()
                                      and int(m[0].split()[1]) >= 2)]
    if len(shown) > limit:
        shown = shown[:limit // 2] + shown[-limit // 2:]
    return ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in shown)


def print_engine(rows):
    """Where ferry's first and later loads spent their time (its statistics, seconds), and when
    each phase of the first and the last load was reached (ms)."""
    for r in rows:
        runs = r.get("runs") or []
        if len(runs) < 2 or "engine" not in runs[0]:
            continue
        first, later = runs[0]["engine"], runs[-1]["engine"]
        keys = [k for k in ENGINE_STATS if k.endswith("seconds") and k in first]
        if keys:
            print(f"{r['case']} {r['temp']} {r['loader']}: " + ", ".join(
                f"{k[:-8]} {first[k]:.4f}/{later.get(k, 0):.4f}" for k in keys) + " (first/last load)")
        for key, label in TIMELINES:
            for which, run in (("first", first), ("last", later)):
                if run.get(key):
                    print(f"  {label} timeline, {which} load (ms): {format_timeline(run[key])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where checkpoints are written (kept for later runs)")
    ap.add_argument("--cases", default="one-file,moe,shm")
    ap.add_argument("--loaders", default="")
    ap.add_argument("--temps", default="warm")
    ap.add_argument("--later", type=int, default=2, help="later loads after the first")
    ap.add_argument("--peer-later", type=int, default=1,
                    help="later loads after the first for the peers (at most --later)")
    ap.add_argument("--scale", type=float, default=float(os.environ.get("FIRST_LOAD_SCALE", 1)))
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ferry-bin", default=os.environ.get("FERRY_BIN", "ferry"))
    ap.add_argument("--json")
    ap.add_argument("--timeout", type=float, default=600)
    # a child process's own arguments
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--loader", help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "cuda":
        args.device = "cuda:0"
    if args.child:
        return child_main(args)
    if not args.dir:
        ap.error("--dir is required")
    cuda = args.device.startswith("cuda")
    loaders = [l for l in args.loaders.split(",") if l] or \
        (GROUP_LOADERS if args.nproc > 1 else SINGLE_LOADERS)
    h2d = None
    if cuda:
        got, error = run_child("h2d", args)
        h2d = got[0]["gigabytes_per_second"] if got else None
        if error:
            print(f"pinned H2D failed: {error}")
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        path = make_checkpoint(args.dir, case, args.scale)
        nbytes, tensors = checkpoint_bytes(path), tensor_bytes(path)
        for temp in [t for t in args.temps.split(",") if t]:
            cold = temp == "cold"
            base = {"case": case, "temp": temp, "path": path, "file_bytes": nbytes,
                    "file_tensor_bytes": tensors, "nproc": args.nproc}
            if cold and case == "shm":
                continue  # tmpfs has no colder state
            if cold and not can_drop_page_cache():
                rows.append({**base, "loader": "(all)", "error": "cold needs root (drop_caches)"})
                continue
            if cold:
                got, error = run_child("odirect", args, path, cold=True)
                rows.append({**base, "loader": "raw O_DIRECT", "runs": got, "error": error,
                             **(summarize(got, got[0]["tensor_bytes"]) if got else {})})
            else:
                read_through(shard_files(path))
            for loader in loaders:
                row = {**base, "loader": loader}
                if loader in CUDA_ONLY and not cuda:
                    rows.append({**row, "error": "needs CUDA"})
                    continue
                if loader.startswith("ferry-tp") and args.nproc < 2:
                    rows.append({**row, "error": "needs --nproc 2 or more"})
                    continue
                if loader == "ferry-cli":
                    got, error = run_cli(args, path, cold)
                else:
                    got, error = run_child("load", args, path, loader, cold)
                if got:
                    # GB/s of the checkpoint's tensor bytes: what a replica holds, what tensor
                    # parallel's ranks hold together.
                    row.update(summarize(got, tensors if loader.startswith("ferry-tp") else got[0]["tensor_bytes"]))
                rows.append({**row, "runs": got, "error": error})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "runs"}), flush=True)
    shutil.rmtree(os.path.join("/dev/shm", "ferry-first-load"), ignore_errors=True)
    print_table(rows, h2d)
    print_engine(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pinned_h2d_gbps": h2d, "device": args.device, "nproc": args.nproc,
                       "scale": args.scale, "later": args.later, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
