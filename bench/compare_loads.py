"""Loads before and after a change, side by side in one run: two builds of the `ferry` command
(say the commit before a refactor and the one after) load the same checkpoints, alternating
run by run so that drift on the machine hits both alike. Both use the built-in defaults (no
tuning file), so only the code differs.

usage: compare_loads.py --before BIN --after BIN --dir CHECKPOINTS --out FILE.json
                        [--models ...] [--sources warm tmpfs cold] [--runs N]

Per (model, source): the median GB/s of each build over N runs (warm and tmpfs: N separate
processes each loading --repeat 2, the second load counted, as a server that already loaded once;
cold: the page cache dropped before each run, the first load counted). Also the in-process
second load of the first model, beside pinned host-to-device copy measured in the same run.
"""
import argparse
import os
import shutil
import statistics

from common import drop_page_cache, pinned_h2d_gbps, warm_page_cache, write_json
from run_bench import checkpoint_bytes, machine, run_json

NO_TUNING = {"FERRY_TUNING_FILE": "/nonexistent/ferry-compare-tuning.json"}


def one_load(binary, path, cold):
    """GB/s of one load in a fresh process: the first load when cold, else the second."""
    if cold:
        drop_page_cache()
    got, error = run_json([binary, "load", path, "--device", "cuda:0", "--json",
                           "--repeat", "1" if cold else "2"])
    if error:
        raise RuntimeError(f"{binary} {path}: {error}")
    return got[-1]["gigabytes_per_second"]


def compare(args, model, source, path):
    cold = source == "cold"
    if not cold:
        warm_page_cache(path)
    rates = {"before": [], "after": []}
    for _ in range(args.runs if not cold else max(2, args.runs // 2)):
        for which in ("before", "after"):
            rates[which].append(one_load(getattr(args, which), path, cold))
    row = {"model": model, "source": source, "bytes": checkpoint_bytes(path),
           "before_gbps": statistics.median(rates["before"]),
           "after_gbps": statistics.median(rates["after"]), "runs": rates}
    row["ratio"] = row["after_gbps"] / row["before_gbps"]
    print(f"  {model:12} {source:5} before {row['before_gbps']:6.2f}  after "
          f"{row['after_gbps']:6.2f} GB/s  ({row['ratio']:.3f}x)", flush=True)
    return row


def second_load(args, path, pinned):
    """In one process: five loads, the last four counted (setup paid once, as in a server)."""
    warm_page_cache(path)
    out = {}
    for which in ("before", "after"):
        got, error = run_json([getattr(args, which), "load", path, "--device", "cuda:0", "--json",
                               "--repeat", "5"])
        if error:
            raise RuntimeError(error)
        later = statistics.median(r["gigabytes_per_second"] for r in got[1:])
        out[which] = {"first_gbps": got[0]["gigabytes_per_second"], "later_gbps": later,
                      "later_x_pinned": later / pinned}
        print(f"  second load in one process, {which}: {later:.2f} GB/s = "
              f"{later / pinned:.3f} x pinned H2D ({pinned:.1f})", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=["qwen3-0.6b", "llama3-8b", "moe-16x64"])
    ap.add_argument("--sources", nargs="*", default=["warm", "tmpfs", "cold"])
    args = ap.parse_args()
    os.environ.update(NO_TUNING)  # both builds on the built-in defaults
    pinned = pinned_h2d_gbps()
    result = {"machine": machine(), "pinned_h2d_gbps": pinned, "rows": []}
    for source in args.sources:
        for model in args.models:
            path = os.path.join(args.dir, model)
            if source == "tmpfs":
                shm = os.path.join("/dev/shm", "ferry-compare", model)
                shutil.copytree(path, shm, dirs_exist_ok=True)
                path = shm
            result["rows"].append(compare(args, model, source, path))
            if source == "tmpfs":
                shutil.rmtree(path)
    result["second_load"] = second_load(args, os.path.join(args.dir, args.models[0]), pinned)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
