"""Loads in one process after the first: `ferry load --repeat N --json` of a checkpoint already
in the page cache, beside pinned host-to-device copy measured in the same run (GPU) or alone
(cpu: the host path's fixed costs per load), on the built-in defaults (no tuning file). The
later loads show the per-call setup a server still pays once it has loaded once.

Prints each load's GB/s and where its time went: before the submission (plan, allocation), the
head (submission to the first copy queued), the steady part, the tail (last read done to every
copy finished) and the end (statistics); then, from a run with --profile (timed events around
each read's copies), how long the GPU had copies queued or running (copy busy) within the span
of the copies, and the copy rate while busy. --bound BIN (bench/staged_bound) adds what this
machine allows a warm staged load: the same pipeline with memcpy from memory in place of the
reads (threads, read size and slots of the load), whose bytes cross host memory as a load's do
(read and written by the CPU, read again by the copy engine): the later loads as a fraction of
it say how much of the gap to pinned H2D is the host's memory bandwidth; so does pinned H2D
measured while as many threads copy host memory at the loads' own rate. --sweep adds the later
loads' median for other thread counts, read sizes, slots and copy streams, one process each.
--page-cache-pin SIZE adds loads with page-cache DMA (`ferry load --page-cache-pin SIZE`: files
wholly in the page cache registered with the driver and copied straight from there): the first
load of the process (which registers) and the later ones (which reuse the registration), with the
bytes each took from registered page cache; --page-cache-sweep adds them for other thread counts
and copy streams. The last lines are one table: pinned H2D, later loads on the defaults, first
and later loads with page-cache DMA, as GB/s and x pinned H2D.

--forms adds the later loads in the three forms a process meets them, on the defaults and (with
--page-cache-pin) with page-cache DMA, one process each: (a) each load's memory freed right
before the next (`ferry load --repeat N`, the rows above: the driver's work after freeing a
large allocation slows the next copies, so pinned H2D right after freeing as many bytes is
measured beside it in the same run); (b) every load kept resident (`--keep`: a server loading
another model while the first stays); (c) loads after the first into the first load's memory
(`--refill`: a weight refresh through load_into); and (a) with `--cache-device-memory` (ferry's
opt-in device memory cache: the previous load's memory goes back to a stream-ordered pool, not
to the driver, and serves the next load). Each form's rows say how much of a later
load's time was not its copies (submission, first copy queued, the end). The table at the end
lists every form.

usage: second_load.py --ferry BIN CHECKPOINT [--device cuda:0] [--repeat 8] [--bound BIN]
                      [--sweep] [--page-cache-pin 4GiB [--page-cache-sweep]] [--forms]
                      [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from common import pinned_h2d_gbps, warm_page_cache, write_json

# (threads, read MiB, slots per thread, copy streams (0: one per thread)) beside the built-in
# defaults (16, 4, 2, 0).
SWEEP = [(16, 4, 2, 0), (16, 4, 2, 1), (16, 4, 2, 2), (16, 4, 2, 4), (16, 1, 2, 0), (16, 2, 2, 0),
         (16, 8, 2, 0), (16, 2, 4, 0), (16, 4, 4, 0), (16, 2, 4, 1), (12, 4, 2, 0), (8, 4, 2, 0),
         (8, 8, 2, 0), (8, 4, 4, 0), (4, 8, 4, 0), (24, 2, 2, 0)]
# (threads, copy streams, read MiB) for page-cache DMA: a worker only queues copies there (no
# reads); such runs take at most 4 workers and groups of at least 64 MiB, whose copies are
# coalesced where file and memory both continue (a larger --chunk-mib makes larger groups).
PAGE_CACHE_SWEEP = [(4, 0, 4), (2, 0, 4), (1, 0, 4), (4, 1, 4), (4, 2, 4), (4, 0, 256),
                    (2, 0, 256), (1, 0, 256)]


def ferry_loads(args, extra=(), repeat=None):
    # The built-in defaults, as bench/compare_loads.py measures them (no tuning file).
    env = dict(os.environ, FERRY_TUNING_FILE="/nonexistent/ferry-second-load-tuning.json")
    out = subprocess.run([args.ferry, "load", args.checkpoint, "--device", args.device, "--json",
                          "--repeat", str(repeat or args.repeat), *extra],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"ferry load {' '.join(extra)} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def ms(seconds):
    return f"{seconds * 1e3:7.2f}"


def breakdown(loads):
    """Per load: where the time went, in ms (pipeline times are from the submission)."""
    print(f"{'load':>4} {'GB/s':>7} {'total':>7} {'submit':>7} {'alloc':>7} {'1st read':>8} "
          f"{'head':>7} {'steady':>7} {'tail':>7} {'end':>7} {'wait/thr':>8} {'read/thr':>8}")
    for i, s in enumerate(loads):
        p = s.get("pipeline_seconds", {})
        threads = max(s.get("reader_threads", 1), 1)
        submit = s.get("submit_seconds", 0)
        head = p.get("first_copy", 0)
        tail = p.get("copies_done", 0) - p.get("last_read", 0)
        steady = p.get("last_read", 0) - head
        end = s["seconds"] - submit - p.get("copies_done", 0)
        print(f"{i + 1:>4} {s['gigabytes_per_second']:7.2f} {ms(s['seconds'])} {ms(submit)} "
              f"{ms(s['allocate_seconds'])} {ms(p.get('first_read', 0)):>8} {ms(head)} "
              f"{ms(steady)} {ms(tail)} {ms(end)} "
              f"{ms(s.get('wait_thread_seconds', 0) / threads):>8} "
              f"{ms(s.get('read_thread_seconds', 0) / threads):>8}")


def non_copy_ms(s):
    """A load's time outside its copies' span (submission, head before the first copy, end)."""
    p = s.get("pipeline_seconds", {})
    return (s["seconds"] - (p.get("copies_done", 0) - p.get("first_copy", 0))) * 1e3


def pinned_h2d_after_free_gbps(free_bytes, runs=5, nbytes=1 << 30):
    """Pinned H2D into a kept buffer right after freeing `free_bytes` of device memory
    (cudaFree through torch.cuda.empty_cache): the driver's post-free cost on the next copies."""
    import torch

    def free_some():
        freed = torch.empty(free_bytes, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        del freed
        torch.cuda.empty_cache()  # the caching allocator's cudaFree of that block
    return pinned_h2d_gbps(runs, nbytes, before_each=free_some)


def fits_repeat(args, tensor_bytes):
    """How many loads --keep can hold on the device (all of --repeat where they fit)."""
    try:
        import torch
        free, _ = torch.cuda.mem_get_info(int(args.device.split(":")[1]))
    except Exception:
        return args.repeat
    return max(2, min(args.repeat, int(free * 0.9) // max(tensor_bytes, 1)))


FORMS = [("freed", [], "previous load freed right before"),
         ("keep", ["--keep"], "every load kept (--keep)"),
         ("refill", ["--refill"], "into the first load's memory (--refill)"),
         ("cached", ["--cache-device-memory"], "freed into the device memory cache")]


def form_row(label, loads):
    later = loads[1:] or loads
    gbps = later_median(loads)
    extra = statistics.median(non_copy_ms(s) for s in later)
    total = statistics.median(s["seconds"] for s in later) * 1e3
    # The whole library call beyond the load's own clock (device context, tuning lookup).
    outside = statistics.median(s.get("call_seconds", s["seconds"]) - s["seconds"]
                                for s in later) * 1e3
    return {"label": label, "gbps": gbps, "non_copy_ms": extra, "total_ms": total,
            "outside_ms": outside, "loads": loads}


def later_median(loads, key="gigabytes_per_second"):
    return statistics.median(s[key] for s in loads[1:]) if len(loads) > 1 else loads[0][key]


def times_pinned(gbps, pinned):
    return f"{gbps / pinned:.3f}" if pinned else "-"


def page_cache_loads(args, pinned, extra=()):
    """Loads with page-cache DMA in one fresh process: the first registers, the later reuse."""
    loads = ferry_loads(args, ["--page-cache-pin", args.page_cache_pin, *extra])
    first = loads[0]
    later = later_median(loads)
    paths = sorted({f["io_path"] for s in loads[1:] for f in s["files"]})
    reasons = sorted({f["reason"] for f in loads[-1]["files"]})
    return {"loads": loads, "first_gbps": first["gigabytes_per_second"],
            "first_register_seconds": first.get("page_cache_register_seconds", 0),
            "later_gbps": later, "later_paths": paths, "reasons": reasons,
            "later_bytes_from_registered": min(s.get("bytes_from_registered_page_cache", 0)
                                               for s in loads[1:] or loads),
            "bytes_read": loads[-1]["bytes_read"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--bound", help="bench/staged_bound, built (GPU devices only)")
    ap.add_argument("--sweep", action="store_true",
                    help="also other thread counts, read sizes and slots (one process each)")
    ap.add_argument("--page-cache-pin", metavar="SIZE",
                    help="also loads with page-cache DMA of this budget (e.g. 4GiB)")
    ap.add_argument("--page-cache-sweep", action="store_true",
                    help="with --page-cache-pin: other thread counts and copy streams too")
    ap.add_argument("--forms", action="store_true",
                    help="also later loads kept resident (--keep) and refilled (--refill)")
    ap.add_argument("--json")
    args = ap.parse_args()
    pinned = None
    if args.device.startswith("cuda"):
        pinned = pinned_h2d_gbps()
    warm_page_cache(args.checkpoint)
    loads = ferry_loads(args)
    print(f"built-in defaults, {args.repeat} loads in one process (ms; head = submission to the "
          f"first copy queued, tail = last read done to every copy finished, wait/read per thread)")
    breakdown(loads)
    later = later_median(loads)
    result = {"device": args.device, "loads": loads, "later_gbps": later, "pinned_h2d_gbps": pinned}
    line = f"later loads: median {later:.2f} GB/s of {len(loads) - 1}"
    if pinned:
        result["later_x_pinned"] = later / pinned
        line += f" = {later / pinned:.3f} x pinned H2D ({pinned:.1f} GB/s, same run)"
    print(line)
    if args.bound and args.device.startswith("cuda"):
        s = loads[-1]
        bound_json = (args.json or "second_load.json") + ".bound.json"
        # The bound is a rate: at most 2 GiB of it (the tool pins that much twice).
        nbytes = min(s["tensor_bytes"], 2 << 30)
        out = subprocess.run([args.bound, "--device", args.device, "--bytes", str(nbytes),
                              "--threads", str(s["reader_threads"]),
                              "--chunk-mib", str(s["chunk_bytes"] / 2**20),
                              "--slots", str(s["slots_per_thread"]),
                              "--copy-gbps", str(later), "--json", bound_json],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"staged_bound failed: {out.stderr.strip()[-300:]}")
        else:
            with open(bound_json) as f:
                bound = json.load(f)
            result["bound"] = bound
            print(out.stdout.strip())
            print(f"later loads: {later / bound['staged_gbps']:.3f} x the staged bound "
                  f"({bound['staged_gbps']:.1f} GB/s), {later / pinned:.3f} x pinned H2D "
                  f"({pinned:.1f}); the bound is {bound['staged_gbps'] / pinned:.3f} x pinned H2D, "
                  f"pinned H2D beside host copies at the loads' rate "
                  f"{bound['pinned_h2d_beside_copies_gbps']:.1f} GB/s")
    if args.device.startswith("cuda"):
        profiled = ferry_loads(args, ["--profile"])
        result["profiled"] = profiled
        rows = []
        for s in profiled[1:]:
            p = s["pipeline_seconds"]
            if p.get("copy_busy", 0) > 0:
                rows.append((s["gigabytes_per_second"], p["copy_busy"] / p["copy_span"],
                             s["tensor_bytes"] / p["copy_busy"] / 1e9,
                             (s["seconds"] - p["copy_busy"]) * 1e3))
        if rows:
            gbps, busy, rate, idle = (statistics.median(r[i] for r in rows) for i in range(4))
            print(f"profiled later loads (median of {len(rows)}): {gbps:.2f} GB/s; copies queued "
                  f"or running {busy * 100:.1f}% of their span; {rate:.1f} GB/s while they were; "
                  f"{idle:.2f} ms of the load without a copy")
            result["profile"] = {"gbps": gbps, "busy_fraction": busy, "busy_gbps": rate,
                                 "idle_ms": idle}
    if args.sweep:
        print(f"{'threads':>7} {'read MiB':>8} {'slots':>5} {'streams':>7} {'staging MiB':>11} "
              f"{'GB/s':>7} {'x pinned':>8} {'head ms':>7} {'tail ms':>7}  (median of later "
              f"loads, one process each; streams 0: one per thread)")
        result["sweep"] = []
        for threads, mib, slots, streams in SWEEP:
            runs = ferry_loads(args, ["--threads", str(threads), "--chunk-mib", str(mib),
                                      "--slots", str(slots), "--copy-streams", str(streams),
                                      "--staging-mib", "1024"])
            gbps = later_median(runs)
            ratio = f"{gbps / pinned:8.3f}" if pinned else f"{'-':>8}"
            later = runs[1:] or runs
            head = statistics.median(r["pipeline_seconds"]["first_copy"] for r in later)
            tail = statistics.median(r["pipeline_seconds"]["copies_done"] -
                                     r["pipeline_seconds"]["last_read"] for r in later)
            print(f"{threads:>7} {mib:>8} {slots:>5} {streams:>7} "
                  f"{runs[-1]['staging_bytes'] / 2**20:11.0f} {gbps:7.2f} {ratio} "
                  f"{head * 1e3:7.2f} {tail * 1e3:7.2f}")
            result["sweep"].append({"threads": threads, "chunk_mib": mib, "slots": slots,
                                    "copy_streams": streams, "gbps": gbps, "loads": runs})
    if args.page_cache_pin:
        pc = page_cache_loads(args, pinned)
        result["page_cache"] = pc
        print(f"page-cache DMA (--page-cache-pin {args.page_cache_pin}), {args.repeat} loads in "
              f"one process:")
        breakdown(pc["loads"])
        register_ms = ms(pc["first_register_seconds"]).strip()
        print(f"  first load {pc['first_gbps']:.2f} GB/s (registering {register_ms} ms); "
              f"later loads median {pc['later_gbps']:.2f} GB/s; later loads took "
              f"{pc['later_bytes_from_registered']} of {pc['bytes_read']} bytes from registered "
              f"page cache; paths {', '.join(pc['later_paths'])}")
        for reason in pc["reasons"]:
            print(f"  file: {reason}")
        if args.page_cache_sweep:
            print(f"{'threads':>7} {'streams':>7} {'read MiB':>8} {'first GB/s':>10} "
                  f"{'later GB/s':>10} {'x pinned':>8}  (page-cache DMA, one process each)")
            result["page_cache_sweep"] = []
            for threads, streams, mib in PAGE_CACHE_SWEEP:
                run = page_cache_loads(args, pinned, ["--threads", str(threads),
                                                      "--copy-streams", str(streams),
                                                      "--chunk-mib", str(mib),
                                                      "--staging-mib", "1024"])
                print(f"{threads:>7} {streams:>7} {mib:>8} {run['first_gbps']:10.2f} "
                      f"{run['later_gbps']:10.2f} {times_pinned(run['later_gbps'], pinned):>8}")
                summary = {k: v for k, v in run.items() if k != "loads"}
                result["page_cache_sweep"].append({"threads": threads, "copy_streams": streams,
                                                   "chunk_mib": mib, **summary})
    forms = []
    if args.forms:
        pinned_after_free = None
        if pinned:
            pinned_after_free = pinned_h2d_after_free_gbps(loads[-1]["allocated_bytes"])
            result["pinned_h2d_after_free_gbps"] = pinned_after_free
            print(f"the driver's post-free cost: pinned H2D right after freeing "
                  f"{loads[-1]['allocated_bytes'] / 1e9:.2f} GB of device memory (cudaFree): "
                  f"{pinned_after_free:.2f} GB/s = {times_pinned(pinned_after_free, pinned)} x "
                  f"pinned H2D; later loads that free nothing to the driver before them (--keep, "
                  f"--refill, --cache-device-memory) avoid it")
        keep_repeat = fits_repeat(args, loads[-1]["allocated_bytes"])
        engines = [("defaults", [], loads)]
        if args.page_cache_pin:
            engines.append(("page-cache DMA", ["--page-cache-pin", args.page_cache_pin],
                            result["page_cache"]["loads"]))
        print(f"later loads by form (median of later loads, one process each; non-copy = the "
              f"load's time outside its copies' span: submission, before the first copy, end; "
              f"call ms outside = the library call's time beyond the load's own clock)")
        print(f"{'engine':<15} {'form':<40} {'GB/s':>7} {'x pinned':>8} {'total ms':>8} "
              f"{'non-copy ms':>11} {'%':>5} {'call ms outside':>15}")
        for engine, flags, freed_loads in engines:
            for name, form_flags, label in FORMS:
                if name == "freed":
                    got = freed_loads
                else:
                    repeat = keep_repeat if name == "keep" else args.repeat
                    got = ferry_loads(args, [*flags, *form_flags], repeat=repeat)
                row = form_row(label, got)
                row.update(engine=engine, form=name)
                forms.append(row)
                print(f"{engine:<15} {label:<40} {row['gbps']:7.2f} "
                      f"{times_pinned(row['gbps'], pinned):>8} {row['total_ms']:8.2f} "
                      f"{row['non_copy_ms']:11.2f} {row['non_copy_ms'] / row['total_ms'] * 100:5.1f} "
                      f"{row['outside_ms']:15.3f}")
            if engine == "page-cache DMA":
                print("page-cache DMA, kept, refilled and cached loads, where their time went:")
                for row in forms[-3:]:
                    print(f"  {row['label']}:")
                    breakdown(row["loads"])
        result["forms"] = [{k: v for k, v in r.items()} for r in forms]
        if keep_repeat < args.repeat:
            print(f"--keep held {keep_repeat} loads (what fits in the device's free memory)")
    print(f"{'':<68} {'GB/s':>7} {'x pinned H2D':>12}")
    rows = [("pinned H2D (same run)", pinned)]
    if result.get("pinned_h2d_after_free_gbps"):
        rows.append(("pinned H2D right after freeing a load's bytes (same run)",
                     result["pinned_h2d_after_free_gbps"]))
    by_form = {(r["engine"], r["form"]): r["gbps"] for r in forms}
    rows.append(("later loads, defaults, previous load freed right before", result["later_gbps"]))
    rows += [(f"later loads, defaults, {label}", by_form.get(("defaults", name)))
             for name, _, label in FORMS[1:]]
    if args.page_cache_pin:
        pc = result["page_cache"]
        rows += [("first load, page-cache DMA", pc["first_gbps"]),
                 ("later loads, page-cache DMA, previous load freed right before",
                  pc["later_gbps"])]
        rows += [(f"later loads, page-cache DMA, {label}", by_form.get(("page-cache DMA", name)))
                 for name, _, label in FORMS[1:]]
    for label, gbps in rows:
        if gbps is not None:
            print(f"{label:<68} {gbps:7.2f} {times_pinned(gbps, pinned):>12}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
