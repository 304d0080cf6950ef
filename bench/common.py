"""What the benchmark scripts share: the page cache (drop, evict, warm), a process's memory, the
shards of a checkpoint, device syncs, pinned host-to-device bandwidth, JSON results.

Imported as `common` by scripts run as `python3 bench/NAME.py` (their folder is first on
sys.path). Nothing here imports torch at module level: scripts that run without it use it too.
"""
import glob
import json
import os
import statistics
import subprocess
import time


def can_drop_page_cache():
    """Whether this process may drop the page cache (root, /proc/sys/vm/drop_caches writable)."""
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_page_cache():
    """Writes back dirty pages, then drops the whole page cache (needs root)."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def drop_file_cache(path):
    """Evicts one file's clean pages (posix_fadvise DONTNEED after fdatasync); no root needed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree_cache(root):
    """drop_file_cache for every file below `root`."""
    for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
        if os.path.isfile(path):
            drop_file_cache(path)


def read_through(files):
    """Reads each file once, so that its pages are in the page cache."""
    for path in files:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def warm_page_cache(folder):
    """read_through of every file in `folder` (a checkpoint's shards and index)."""
    read_through(os.path.join(folder, name) for name in sorted(os.listdir(folder)))


def shard_files(path):
    """A checkpoint's .safetensors files: the file itself, or a folder's, sorted."""
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files")
    return files


def status_bytes(field):
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM, ...), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss():
    """Resets VmHWM to the current resident set (clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")


def synchronize(device):
    """Waits for `device`'s work where it is a CUDA device."""
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize(device)


def pinned_h2d_gbps(runs=5, nbytes=1 << 30, before_each=None):
    """Median GB/s of `runs` copies of `nbytes` from pinned host memory to cuda:0 (after one
    untimed warm-up); `before_each()` runs before every copy, outside its time."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    rates = []
    for i in range(runs + 1):
        if before_each:
            before_each()
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i:
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(rates)


def write_json(path, results):
    """Writes `results` to `path` (indented) where a path was given."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
