"""vLLM's secondary KV tiers side by side, driven through vLLM's own classes
(SecondaryTierFactory, TransferJob, get_finished_jobs/drain_jobs): its `fs` tier and ferry's
`ferry` tier, on the same disk, same run. Blocks (vLLM's CPU-tier chunks) are stored from a host
region shaped as the primary tier's, then loaded back warm (page cache as the store left it) and
cold (the files' pages dropped with posix_fadvise), every loaded byte checked. Then as many
blocks under new keys again ("store again"): ferry's tier evicts the first ones and overwrites
their slots, as a tier whose capacity has filled once always does, where the first store wrote
into freshly preallocated slabs (on ext4, O_DIRECT writes into unwritten extents convert them,
about 1.3 x slower than overwrites); the fs tier writes new files either way.

    VLLM_TARGET_DEVICE=cpu python bench/kv/vllm_tier_bench.py --dir /tmp --blocks 512 --block-mib 2
"""
import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: shared helpers
from common import drop_tree_cache  # noqa: E402


def make_tier(kind, root, primary, block_bytes, blocks):
    import ferry.vllm
    from vllm_helpers import offloading_config
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    ferry.vllm.register()
    spec = TieringOffloadingSpec(offloading_config({"cpu_bytes_to_use": blocks * block_bytes},
                                                   block_bytes // 2, engine_id=f"bench-{kind}"))
    config = ({"type": "fs", "root_dir": root} if kind == "fs" else
              {"type": "ferry", "root": root, "capacity_bytes": (blocks + 16) * block_bytes})
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(primary), spec)


def run_jobs(tier, keys, job_blocks, storing):
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    ctx = ReqContext("bench")
    started = time.perf_counter()
    jobs = 0
    for first in range(0, len(keys), job_blocks):
        ids = np.arange(first, min(first + job_blocks, len(keys)), dtype=np.int32)
        job = TransferJob(jobs, [keys[i] for i in ids], ids, not storing, ctx)
        (tier.submit_store if storing else tier.submit_load)(job)
        jobs += 1
    tier.drain_jobs()
    seconds = time.perf_counter() - started
    results = list(tier.get_finished_jobs())
    failed = [r.job_id for r in results if not r.success]
    if len(results) != jobs or failed:
        raise SystemExit(f"{len(results)} of {jobs} jobs reported, failed: {failed}")
    return seconds


def primary_region(data):
    """A page-aligned copy of `data`, as vLLM's primary tier is (a shared mapping): the fs
    tier's O_DIRECT I/O needs aligned memory."""
    region = mmap.mmap(-1, data.nbytes)
    primary = np.frombuffer(region, dtype=np.uint8).reshape(data.shape)
    primary[:] = data
    return primary


def one_round(kind, base, data, keys, args):
    root = tempfile.mkdtemp(prefix=f"tier-{kind}-", dir=base)
    primary = primary_region(data)
    tier = make_tier(kind, root, primary, data.shape[1], len(keys))
    gb = data.nbytes / 1e9
    out = {"store": gb / run_jobs(tier, keys, args.job_blocks, True)}
    for state in ("warm", "cold"):
        if state == "cold":
            drop_tree_cache(root)
        primary[:] = 0
        out[f"load {state}"] = gb / run_jobs(tier, keys, args.job_blocks, False)
        if not np.array_equal(primary, data):
            raise SystemExit(f"{kind}: loaded bytes differ from the stored ones ({state})")
    from vllm.v1.kv_offload.base import make_offload_key
    again = [make_offload_key(os.urandom(32), 0) for _ in keys]
    out["store again"] = gb / run_jobs(tier, again, args.job_blocks, True)
    tier.shutdown()
    shutil.rmtree(root)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where both tiers write")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--block-mib", type=float, default=2)
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per tier job")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiers", default="fs,ferry")
    parser.add_argument("--ferry-calls", type=int, default=0,
                        help="store calls per direction the ferry tier runs at once before it "
                             "merges waiting jobs (default: its own; 1000: every job its own call)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)  # each round's tiers get a fresh directory inside
    if args.ferry_calls:
        import ferry.vllm.tier
        ferry.vllm.tier._CALLS = args.ferry_calls
    from vllm.v1.kv_offload.base import make_offload_key
    block = int(args.block_mib * (1 << 20)) // 4096 * 4096
    data = np.random.default_rng(0).integers(0, 256, (args.blocks, block), dtype=np.uint8)
    keys = [make_offload_key(os.urandom(32), 0) for _ in range(args.blocks)]
    tiers = args.tiers.split(",")
    rows = {kind: [] for kind in tiers}
    # Alternating, and which goes first too: the tier run second follows the first's file
    # removals (on ext4 the fs tier's 1,024 files take a while to free), which cost the
    # second's loads about 10 % here (fs first: ferry's loads 0.97-0.99 x; ferry first: 1.09-1.10).
    for n in range(args.rounds):
        for kind in (tiers if n % 2 == 0 else tiers[::-1]):
            row = one_round(kind, args.dir, data, keys, args)
            rows[kind].append(row)
            print(f"round {n + 1} {kind:6s} " + "  ".join(f"{k} {v:.2f} GB/s"
                                                         for k, v in row.items()), flush=True)
    print(f"{args.blocks} blocks of {block / (1 << 20):g} MiB, {args.job_blocks} per job, "
          f"{args.rounds} rounds, dir {args.dir}; GB/s median (min-max)")
    for kind in tiers:
        cells = []
        for what in ("store", "load warm", "load cold", "store again"):
            values = [r[what] for r in rows[kind]]
            cells.append(f"{what} {statistics.median(values):.2f} "
                         f"({min(values):.2f}-{max(values):.2f})")
        print(f"  {kind:6s} " + "  ".join(cells))
    if "fs" in rows and "ferry" in rows:
        # Each round's ferry against the fs tier of the same round (the disk's rate drifts
        # between rounds far more than between the two tiers' runs within one).
        cells = []
        for what in ("store", "load warm", "load cold", "store again"):
            ratios = [f[what] / s[what] for f, s in zip(rows["ferry"], rows["fs"])]
            cells.append(f"{what} {statistics.median(ratios):.2f} "
                         f"({sum(r > 1 for r in ratios)} of {len(ratios)} rounds above 1)")
        print("  ferry x fs, median of the rounds' ratios: " + "  ".join(cells))


if __name__ == "__main__":
    main()
