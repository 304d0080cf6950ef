"""Loads in one process after the first: `ferry load --repeat N --json` of a checkpoint already
in the page cache, beside pinned host-to-device copy measured in the same run (GPU) or alone
(cpu: the host path's fixed costs per load), on the built-in defaults (no tuning file). The
later loads show the per-call setup a server still pays once it has loaded once. Prints each
load's GB/s and where its time went.

usage: second_load.py --ferry BIN CHECKPOINT [--device cuda:0] [--repeat 6] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from run_bench import warm_page_cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    pinned = None
    if args.device.startswith("cuda"):
        from run_bench import pinned_h2d_gbps
        pinned = pinned_h2d_gbps()
    warm_page_cache(args.checkpoint)
    # The built-in defaults, as bench/compare_loads.py measures them (no tuning file).
    env = dict(os.environ, FERRY_TUNING_FILE="/nonexistent/ferry-second-load-tuning.json")
    out = subprocess.run([args.ferry, "load", args.checkpoint, "--device", args.device, "--json",
                          "--repeat", str(args.repeat)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"ferry load failed: {out.stderr.strip()[-500:]}")
    loads = json.loads(out.stdout)
    print(f"{'load':>4} {'GB/s':>7} {'seconds':>8} {'alloc ms':>9} {'staging ms':>10} "
          f"{'setup ms':>9} {'read s':>7} {'queue s':>8} {'wait s':>7}")
    for i, s in enumerate(loads):
        print(f"{i + 1:>4} {s['gigabytes_per_second']:7.2f} {s['seconds']:8.4f} "
              f"{s['allocate_seconds'] * 1e3:9.2f} {s.get('staging_seconds', 0) * 1e3:10.2f} "
              f"{s.get('setup_thread_seconds', 0) * 1e3:9.2f} {s.get('read_thread_seconds', 0):7.3f} "
              f"{s.get('queue_thread_seconds', 0):8.3f} {s.get('wait_thread_seconds', 0):7.3f}")
    later = statistics.median(s["gigabytes_per_second"] for s in loads[1:])
    result = {"device": args.device, "loads": loads, "later_gbps": later, "pinned_h2d_gbps": pinned}
    line = f"later loads: median {later:.2f} GB/s"
    if pinned:
        result["later_x_pinned"] = later / pinned
        line += f" = {later / pinned:.3f} x pinned H2D ({pinned:.1f} GB/s)"
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
