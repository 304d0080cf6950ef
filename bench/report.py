"""Turns the suite's results (bench/load/run_bench.py, one or more files from separate calls) into
results.json, loaders.md (the tables BENCHMARKS.md takes) and loaders.png in --out, out of the
source tree (generated files are not committed).

usage: report.py RESULTS.json [...] [--command TEXT] [--out DIR (default build/bench-report)]
"""
import argparse
import json
import os
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20

# The targets: ferry's GB/s as a fraction of the limit, per (source, model).
TARGETS = {("warm", "llama3-8b"): 0.8, ("warm", "moe-16x64"): 0.8, ("warm", "qwen3-0.6b"): 0.6,
           ("tmpfs", "llama3-8b"): 0.85, ("cold", None): 0.95}
HOST_SLACK = 100 * MIB
GPU_SLACK = 0.01


def merge(files):
    merged = None
    for name in files:
        with open(name) as f:
            part = json.load(f)
        if merged is None:
            merged = part
            continue
        merged["cases"] += part["cases"]
        merged["sizes"] = merged["sizes"] or part["sizes"]
        merged["date"] = max(merged["date"], part["date"])
    return merged


def median(result, key):
    return statistics.median(r[key] for r in result["runs"])


def limit_of(case):
    """(GB/s, words): H2D copy for warm and tmpfs, the raw O_DIRECT read when cold."""
    if case["source"] == "cold":
        return case["read_limit_gbps"], "O_DIRECT read"
    return case["pinned_h2d_gbps"], "pinned H2D"


def target_of(case):
    return TARGETS.get((case["source"], case["model"]), TARGETS.get((case["source"], None)))


def rows_of(case):
    limit, _ = limit_of(case)
    rows = []
    for name, result in case["loaders"].items():
        if "error" in result:
            rows.append({"loader": name, "error": result["error"]})
            continue
        gbps = median(result, "gigabytes_per_second")
        beyond = max(r["gpu_beyond_tensors_bytes"] for r in result["runs"])
        rows.append({"loader": name, "gbps": gbps, "runs": len(result["runs"]),
                     "ratio": gbps / limit if limit else None,
                     "host": max(r["peak_host_growth_bytes"] for r in result["runs"]),
                     "gpu_beyond": beyond, "gpu_fraction": beyond / result["runs"][0]["tensor_bytes"],
                     "path": result["runs"][0]["path"],
                     "staging": result["runs"][0].get("staging_bytes")})
    rows.sort(key=lambda r: -r.get("gbps", -1))
    return rows


def verdicts(case, rows):
    """Which of the issue's targets the ferry row meets in this case, in words."""
    ferry = next((r for r in rows if r["loader"] == "ferry" and "gbps" in r), None)
    if ferry is None:
        return ["ferry failed"]
    out = []
    target = target_of(case)
    if target and ferry["ratio"] is not None:
        _, words = limit_of(case)
        out.append(f"{'met' if ferry['ratio'] >= target else 'MISSED'}: {ferry['ratio']:.2f} x "
                   f"{words} (target {target})")
    peers = [r for r in rows if "gbps" in r and not r["loader"].startswith("ferry")]
    if peers:
        best = max(peers, key=lambda r: r["gbps"])
        out.append(f"{'met' if ferry['gbps'] >= best['gbps'] else 'MISSED'}: best peer "
                   f"{best['loader']} {best['gbps']:.2f} GB/s")
    if ferry["staging"] is not None:
        ok = ferry["host"] <= ferry["staging"] + HOST_SLACK
        out.append(f"{'met' if ok else 'MISSED'}: host growth {ferry['host'] / MIB:.0f} MiB "
                   f"(staging {ferry['staging'] / MIB:.0f} MiB + 100)")
    torch_row = next((r for r in rows if r["loader"] == "ferry.torch" and "gbps" in r), None)
    if torch_row:
        ok = torch_row["gpu_fraction"] <= GPU_SLACK
        out.append(f"{'met' if ok else 'MISSED'}: GPU memory beyond tensors "
                   f"{torch_row['gpu_fraction'] * 100:.2f}% (ferry.torch, device-wide)")
    return out


def markdown(results, command, note=""):
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Measured {results['date']} on one {m['gpu']} ({m['cores']} cores, "
        f"{m['memory_bytes'] / 2**30:.0f} GiB host memory, virtio disk, no nvidia-fs), "
        f"torch {m['torch']}, Python {m['python']}. Reproduce on the GPU machine with:",
        "",
        "```",
        command,
        "```",
        "",
        "GB/s is tensor bytes over seconds, from the call to the last byte in GPU memory, with "
        "CUDA already started; the median of the runs shown. *x limit* is the fraction of the "
        "pinned host-to-device copy bandwidth (warm, tmpfs) or of a raw O_DIRECT read of the "
        "same files (cold), both measured in the same call. Host is the peak RSS growth during a "
        "load; GPU extra is device memory used beyond the tensors' bytes (device-wide free memory "
        "for the Python loaders; ferry's own allocation for the command). Checkpoints are "
        "written by Hugging Face `safetensors` (bench/make_checkpoints.py); peers are the PyPI "
        "releases named in tools/fetch_gpu_deps.sh.",
        "",
    ]
    if note:
        lines += [note, ""]
    lines += ["![GB/s per loader per case](loaders.png)", ""]
    for case in results["cases"]:
        limit, words = limit_of(case)
        read = case["read_limit_gbps"]
        lines += [f"## {case['model']}, {case['source']} ({case['bytes'] / 1e9:.2f} GB)", "",
                  f"Limits: pinned H2D {case['pinned_h2d_gbps']:.1f} GB/s; raw read of the files "
                  + (f"{read:.1f} GB/s" if read else "not measured")
                  + (" (O_DIRECT, page cache dropped)" if case["source"] == "cold" else
                     " (parallel pread)") + ".", ""]
        rows = rows_of(case)
        lines += ["| loader | GB/s | runs | x limit | host MiB | GPU extra MiB | path |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['loader']} | failed | | | | | {r['error']} |")
                continue
            lines.append(f"| {r['loader']} | {r['gbps']:.2f} | {r['runs']} | "
                         f"{r['ratio']:.2f} | {r['host'] / MIB:.0f} | "
                         f"{r['gpu_beyond'] / MIB:.1f} | {r['path']} |")
        lines += [""] + [f"- {v}" for v in verdicts(case, rows)]
        ferry = case["loaders"].get("ferry", {}).get("runs")
        if ferry:
            r = ferry[0]
            lines.append(f"- ferry's settings: {r['reader_threads']} reader threads, "
                         f"{r['chunk_bytes'] / MIB:.0f} MiB reads, {r['slots_per_thread']} slots each; "
                         f"{r.get('settings_source', 'built-in defaults')}")
        lines.append("")
    if results["sizes"]:
        lines += ["## Load time against checkpoint size (ferry, warm)", "",
                  "| checkpoint | GB | seconds | GB/s |", "| --- | ---: | ---: | ---: |"]
        for s in results["sizes"]:
            if "error" in s:
                lines.append(f"| {s['name']} | failed: {s['error']} | | |")
            else:
                lines.append(f"| {s['name']} | {s['bytes'] / 1e9:.2f} | {s['seconds']:.3f} | "
                             f"{s['gigabytes_per_second']:.1f} |")
        good = [s for s in results["sizes"] if "error" not in s]
        if len(good) >= 2:
            xs = [s["bytes"] / 1e9 for s in good]
            ys = [s["seconds"] for s in good]
            slope, intercept = linear_fit(xs, ys)
            lines += ["", f"Least-squares line: seconds = {intercept:.3f} + {slope:.4f} x GB "
                          f"({1 / slope:.1f} GB/s marginal); largest deviation from it "
                          f"{max(abs(y - intercept - slope * x) for x, y in zip(xs, ys)) * 1e3:.0f} ms."]
        lines.append("")
    return "\n".join(lines)


def linear_fit(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def chart(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = results["cases"]
    loaders = []
    for case in cases:
        for name in case["loaders"]:
            if name not in loaders:
                loaders.append(name)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(cases)), 4.8))
    width = 0.8 / len(loaders)
    for i, name in enumerate(loaders):
        values = []
        for case in cases:
            result = case["loaders"].get(name, {})
            values.append(median(result, "gigabytes_per_second") if "runs" in result else 0)
        ax.bar([c + (i - len(loaders) / 2 + 0.5) * width for c in range(len(cases))], values,
               width, label=name)
    for c, case in enumerate(cases):
        limit, _ = limit_of(case)
        if limit:
            ax.hlines(limit, c - 0.45, c + 0.45, colors="black", linestyles="dashed", linewidth=1)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{c['model']}\n{c['source']}" for c in cases], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (median, log scale)")
    ax.set_title(f"Loading to {results['machine']['gpu']} (dashed: limit of the case)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--command", default="tools/gpu_check.sh")
    ap.add_argument("--note", default="", help="a paragraph on this run, printed under the intro")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-report"))
    args = ap.parse_args()
    results = merge(args.results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "loaders.md"), "w") as f:
        f.write(markdown(results, args.command, args.note))
    chart(results, os.path.join(args.out, "loaders.png"))
    print(f"wrote results.json, loaders.md and loaders.png to {args.out}")


if __name__ == "__main__":
    main()
