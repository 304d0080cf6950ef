"""The machine's facts and limits that multi_gpu_bench.py prints before its loads: cores, NUMA
nodes and each GPU's node, pinned host -> GPU copies one GPU at a time and all at once, page cache
-> pinned memory reads (alone and beside page-cache DMA) and host memcpy by thread count."""
import os
import statistics
import subprocess
import time


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def machine_facts(n):
    """Cores, NUMA nodes and the node each GPU's PCI device sits on."""
    import glob
    import torch
    facts = {"cores": os.cpu_count(), "numa_nodes": {}, "gpus": []}
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            facts["cpu"] = line.split(":", 1)[1].strip()
            break
    facts["sockets"] = len({read_text(p) for p in
                            glob.glob("/sys/devices/system/cpu/cpu*/topology/physical_package_id")})
    for node in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        mem = read_text(os.path.join(node, "meminfo")).split("MemTotal:")[-1].split()
        facts["numa_nodes"][os.path.basename(node)] = {
            "cpus": read_text(os.path.join(node, "cpulist")),
            "mem_gib": round(int(mem[0]) / 2**20, 1) if mem else None}
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        try:
            bdf = (f"{getattr(p, 'pci_domain_id', 0):04x}:{p.pci_bus_id:02x}:"
                   f"{p.pci_device_id:02x}.0")
        except AttributeError:  # an older torch
            bdf = "?"
        facts["gpus"].append({"device": f"cuda:{i}", "name": p.name, "pci": bdf,
                              "numa_node": read_text(f"/sys/bus/pci/devices/{bdf}/numa_node", "?")})
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
        facts["nvidia_smi_topo"] = (topo.stdout if topo.returncode == 0 else topo.stderr).strip()
    except OSError as e:
        facts["nvidia_smi_topo"] = f"nvidia-smi: {e}"
    return facts


def pinned_copy_rates(n, nbytes=1 << 30, repeats=5):
    """Pinned host -> GPU copies: each GPU alone, then every GPU at once (GB/s per GPU)."""
    import torch
    src = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    dst = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]

    def timed(gpus):
        rates = []
        for r in range(repeats + 1):
            for i in gpus:
                torch.cuda.synchronize(i)
            t = time.perf_counter()
            for i in gpus:
                with torch.cuda.stream(streams[i]):
                    dst[i].copy_(src[i], non_blocking=True)
            for i in gpus:
                streams[i].synchronize()
            if r:
                rates.append(nbytes / (time.perf_counter() - t) / 1e9)
        return statistics.median(rates)

    out = {"alone": [timed([i]) for i in range(n)], "all_at_once_per_gpu": timed(range(n))}
    src.clear()
    dst.clear()
    torch.cuda.empty_cache()
    return out


def _files(path):
    return [os.path.join(path, f) for f in sorted(os.listdir(path)) if not f.endswith(".json")]


def page_cache_read_rate(path, threads, chunk=4 << 20, slots=2):
    """Every file of `path` read once (warm: from the page cache) by `threads` threads, chunk by
    chunk, into pinned slots of their own, as ferry's readers do (GB/s)."""
    import threading
    import torch
    pieces = []
    for f in _files(path):
        size = os.path.getsize(f)
        pieces += [(f, o, min(chunk, size - o)) for o in range(0, size, chunk)]
    try:
        staging = torch.empty(threads * slots * chunk, dtype=torch.uint8, pin_memory=True).numpy()
    except RuntimeError:  # no GPU (a smoke run): pageable memory, touched first
        staging = torch.zeros(threads * slots * chunk, dtype=torch.uint8).numpy()
    fds = {f: os.open(f, os.O_RDONLY) for f in _files(path)}
    lock = threading.Lock()
    nxt = [0]

    def reader(t):
        k = 0
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(pieces):
                return
            f, off, size = pieces[i]
            at = (t * slots + k % slots) * chunk
            os.preadv(fds[f], [memoryview(staging[at:at + size])], off)
            k += 1

    workers = [threading.Thread(target=reader, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return sum(p[2] for p in pieces) / took / 1e9


def page_cache_read_rate_under_dma(path, threads, n, nbytes=1 << 30):
    """page_cache_read_rate while every GPU copies from pinned host memory all along (as a load's
    H2D copies do): the page-cache copies and the GPUs' DMA reads share the host's memory.
    Returns (page cache -> pinned GB/s, host -> GPUs GB/s) over the same interval."""
    import threading
    import torch
    src = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    dst = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    stop = threading.Event()
    copied = [0]

    def copies():
        while not stop.is_set():
            for i in range(n):
                with torch.cuda.stream(streams[i]):
                    dst[i].copy_(src[i], non_blocking=True)
            for s in streams:
                s.synchronize()
            copied[0] += n * nbytes

    mover = threading.Thread(target=copies)
    t0 = time.perf_counter()
    mover.start()
    read_gbps = page_cache_read_rate(path, threads)
    stop.set()
    mover.join()
    dma_gbps = copied[0] / (time.perf_counter() - t0) / 1e9
    src.clear()
    dst.clear()
    torch.cuda.empty_cache()
    return read_gbps, dma_gbps


def memcpy_rate(threads, nbytes=64 << 20, repeats=8):
    """Host memory -> host memory copies by `threads` threads at once (GB/s copied)."""
    import threading
    import numpy as np
    bufs = [(np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)) for _ in range(threads)]
    for a, b in bufs:
        np.copyto(b, a)

    def run(i):
        for _ in range(repeats):
            np.copyto(bufs[i][1], bufs[i][0])

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return threads * repeats * nbytes / (time.perf_counter() - t0) / 1e9


def print_facts(facts):
    print(f"machine: {facts['cores']} cores ({facts.get('cpu', '?')}), {facts['sockets']} socket(s), "
          f"NUMA nodes: " + "; ".join(f"{k} cpus {v['cpus']} {v['mem_gib']} GiB"
                                      for k, v in facts["numa_nodes"].items()))
    for g in facts["gpus"]:
        print(f"  {g['device']} {g['name']} at PCI {g['pci']}, NUMA node {g['numa_node']}")
    c = facts.get("pinned_h2d")
    if c:
        print("pinned H2D (1 GiB): alone " + ", ".join(f"cuda:{i} {r:.1f}" for i, r in
                                                        enumerate(c["alone"]))
              + f" GB/s; all at once {c['all_at_once_per_gpu']:.1f} GB/s per GPU")
    r = facts.get("page_cache_read")
    if r:
        print("page cache -> pinned reads, 4 MiB: " + ", ".join(f"{t} threads {v:.1f}"
                                                               for t, v in r.items()) + " GB/s")
    if "page_cache_read_1mib_32_threads" in facts:
        print(f"page cache -> pinned reads, 1 MiB, 32 threads: "
              f"{facts['page_cache_read_1mib_32_threads']:.1f} GB/s")
    u = facts.get("page_cache_read_under_dma")
    if u:
        print(f"page cache -> pinned reads ({u['threads']} threads) while the GPUs copy from pinned "
              f"memory: {u['read_gbps']:.1f} GB/s beside {u['dma_gbps']:.1f} GB/s of host -> GPU "
              f"copies")
    m = facts.get("memcpy")
    if m:
        print("host memcpy: " + ", ".join(f"{t} threads {v:.1f}" for t, v in m.items()) + " GB/s")
