#!/usr/bin/env bash
# Everything that needs the GPU machine (device tool): builds ferry there, runs the tests (GPU ones
# included), checks that every path lands the bytes of the host path, and runs the benchmarks.
# Full logs go to $OUT; short tables print as it goes. The stages live in tools/gpu/*.sh, each
# function with a comment saying what it runs.
#   usage (from the repo root, on the GPU machine): tools/gpu_check.sh [STAGE ...]
#   default stages (about 20 minutes): build tests warm tmpfs cold sizes (bench/load/run_bench.py)
#   others: compare (needs .before/ferry-before.tar.gz: `git archive --prefix=ferry-before/
#     COMMIT | gzip`), python, engine, dropin, core, core-full, kv, kvperf, kvdma, kvlayout, kvother, kvwarm, kvtier, requestsize,
#     kvfleet, kvgroups, kvsweep (group shapes), kvbisect-build, kvbisect (.before/NAME.tar.gz each), stream, stream-tests, stream-bench, mgpu, mgpu-full, mgpu-sweep (2+ GPUs),
#     firstload-tests, firstload, firstload-cold, firstload4, tpcold (2+ GPUs); `build vllm` builds only
#     what tools/vllm_gpu_run.sh needs.
#   The device tool caps one call at 10 minutes: split them (`build tests warm`, then `tmpfs
#   cold`, then `sizes`; `build kv`...); each stage builds and writes checkpoints first where a
#   fresh machine lacks them. Benchmark stages leave $OUT/results-STAGE.json for bench/report.py.
# Carry: .deps and .whl, made here by tools/fetch_gpu_deps.sh (Debian .debs of the build's
#   header/static dependencies; Python wheels of the test tools and of the peer loaders).
set -euo pipefail
OUT=${OUT:-/tmp/ferry-out}
mkdir -p "$OUT"
stages=" ${*:-build tests warm tmpfs cold sizes} "
want() { [[ "$stages" == *" $1 "* ]]; }
root=$PWD
ferry=/tmp/build/cli/ferry
ckpts=/tmp/ckpts
models="qwen3-0.6b llama3-8b moe-16x64"
status=0
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
export PYTHONUNBUFFERED=1
# NVLink multicast can take a multi-GPU host's GPUs out of service: off in every process of every
# stage (ferry itself never changes the environment).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# cuFile's configuration: compatibility mode allowed (this machine has no nvidia-fs), logs out
# of the working tree.
export CUFILE_ENV_PATH_JSON=$root/tests/data/cufile.json
# This VM runs no udev, and cuFile refuses to register files whose block device has no udev
# attributes (ferry's error says so). Give the disk under /tmp the entry udev would write.
dev=$(python3 -c "import os; d = os.stat('/tmp').st_dev; print(f'{os.major(d)}:{os.minor(d)}')")
if [ ! -e "/run/udev/data/b$dev" ]; then
  mkdir -p /run/udev/data
  printf 'I:1\nE:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" \
    >"/run/udev/data/b$dev"
fi

# Build dependencies: the same Debian packages CI installs, unpacked into a private prefix.
mkdir -p /tmp/deps
for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
# Stages that use no wheel run without them (a fresh checkout's .whl/ is empty until the fetch).
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
else
  echo "gpu_check: no wheels in .whl/ (tools/fetch_gpu_deps.sh); stages that need them will fail" >&2
fi
export PYTHONPATH=/tmp/site

for part in common load core kv stream mgpu firstload; do
  # shellcheck source=/dev/null
  source "$root/tools/gpu/$part.sh"
done

if want build || [ ! -x "$ferry" ]; then build; fi
want firstload-tests && first_load tests
want firstload && first_load warm
want firstload-cold && first_load cold
want firstload4 && first_load group
want tpcold && tp_cold
want tests && tests
want compare && compare
want python && python_benches
want engine && engine_benches
want dropin && dropin
want core && core_checks
want core-full && core_checks full
want kv && kv_stage
want kvperf && KV_CRASH_SECONDS=${KV_CRASH_SECONDS:-30} kv_stage perf
want kvdma && kv_dma
want kvfleet && kv_fleet_stage
want kvlayout && kv_layout_stage
want kvother && kv_other_layouts_stage
want kvwarm && kv_warm_stage
want kvtier && kv_tier_stage
want requestsize && request_size_stage
want kvgroups && kv_groups_stage
want kvsweep && kv_sweep_stage
want kvbisect-build && kv_bisect_builds
want kvbisect && kv_bisect_stage
want stream && { stream_tests; stream_bench; }
want stream-tests && stream_tests
want stream-bench && stream_bench
want mgpu && mgpu
want mgpu-full && mgpu full
if want mgpu-sweep; then
  mgpu sweep
  log "multi-GPU benchmark, warm, with the machine's facts and one row per knob"
  (cd bench/multi_gpu && python3 multi_gpu_bench.py --ferry "$ferry" --dir "$ckpts" --sources warm \
    --no-peers --sweep --json "$OUT/multi_gpu_sweep.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
fi
if want warm || want tmpfs || want cold || want sizes; then checkpoints; tuned; fi
want warm && bench warm --sources warm
want tmpfs && bench tmpfs --sources tmpfs
want cold && bench cold --sources cold
if want sizes; then
  rm -rf "$ckpts"/*  # the 32 GB checkpoint needs the room
  bench sizes --sources --sizes
fi
exit $status
