#!/usr/bin/env bash
# Everything that needs the GPU machine (device tool): builds ferry there, runs every test (GPU
# ones included), checks that every path lands the same bytes as the host path, and runs the
# benchmark suite (bench/run_bench.py). Full logs go to $OUT; short tables print as it goes.
#   usage (from the repo root, on the GPU machine): tools/gpu_check.sh [STAGE ...]
#   stages: build tests warm tmpfs cold sizes (default: all, about 20 minutes), and compare (not in
#   the default): loads by the build in .before/ferry-before.tar.gz (`git archive --prefix=
#   ferry-before/ COMMIT | gzip`, carried in .before) beside this one, run by run
#   (bench/compare_loads.py); python (not in the default): the saver and from_pretrained
#   benchmarks; engine (not in the default): transfer core, KV store, per-key and open benchmarks;
#   dropin (not in the default): the safe_open and transformers tests on the GPU (each file in
#   its own pytest process), per-key reads (cpu, cuda:0 with read-ahead and small reads,
#   tensor-parallel slices with bytes read) on the generated file and the 8B shape beside
#   load_file, and time to a ready MoE model beside transformers' from_pretrained (about 6 min
#   after `build`).
#   core (not in the default; about 5 minutes with `build`, which then skips the Python package):
#   the transfer core's tests with a GPU (page-cache DMA's included) and loads after the first of
#   the Qwen3-0.6B shape (where their time goes, GPU copy busy time, beside pinned H2D and
#   bench/staged_bound: the machine's bound for a warm staged load), then with page-cache DMA
#   (first load, which registers, and later ones), then later loads in each form a process meets
#   them (each freed right before the next, beside pinned H2D right after such a free; every load
#   kept, --keep; refilled into the first load's memory, --refill; freed into the opt-in device
#   memory cache, --cache-device-memory; their hashes beside a cpu
#   load first), ending in one table: pinned H2D, each form on the defaults and with page-cache
#   DMA; core-full: the same plus the transfer benchmark, the copy probe (pinned copies by size,
#   streams and source alignment), a sweep of threads, read sizes, slots and copy streams (with
#   page-cache DMA by threads and copy streams too), and
#   moe-16x64 warm by the commit in .before beside this one (carry .before);
#   kv (not in the default): the KV store's tests (GPU ones included), its Python tests on cuda:0,
#   `ferry kv bench` on cuda:0 beside raw O_DIRECT and pinned copies, torch.save/torch.load of the
#   same blocks, and up to 1,000 crash trials (KV_CRASH_SECONDS, 60 by default; the stage
#   about 5 minutes; kvperf: the same without the index, torch.save and CPU rows, 30 s of crash
#   trials, and with rows of 256 MiB prefixes per call: `tools/gpu_check.sh build kvperf`): run
#   `tools/gpu_check.sh build`, then `tools/gpu_check.sh kv`);
#   kvdma (not in the default; about 5 minutes with `build`, which then skips the Python
#   package): KV gets by page-cache DMA, each block checked by the GPU checksum where it landed:
#   its tests (GPU and CPU, the GPU checksum's, the registry's and the loader's page-cache DMA
#   tests beside them) and `ferry kv bench --page-cache-pin` on cuda:0, staged, batches of 16,
#   prefixes of 256 MiB, and prefixes of per-layer blocks (16 pieces, through the device bounce
#   buffer): warm gets without page-cache DMA (staged), registering the windows (their
#   registration time apart) and from registered windows, beside pinned H2D, and where the
#   registered pass's time went (device ms of DMA, GPU checksum, scatter);
#   kvlayout (not in the default; `tools/gpu_check.sh build kvlayout`): the engines' KV layouts
#   (vLLM, vLLM canonical, MLA, SGLang) on the GPU: their tests, then `ferry kv bench --layout`
#   beside one piece, pinned H2D and raw O_DIRECT (128 and 16 blocks per call, page-cache DMA),
#   host memory, and bench/kv_vs_fs_tier.py;
#   stream (not in the default): weight streaming's GPU tests and bench/stream_bench.py,
#   bench/moe_bench.py; stream-tests: the tests alone (about 5 minutes with `build`);
#   stream-bench: the benchmarks alone (about 6 minutes with `build`).
#   mgpu (not in the default; 2+ GPUs): multi-GPU loading (the multi-GPU C++ tests, replicas'
#   hashes beside a single-GPU load, staged and by page-cache DMA, bench/multi_gpu_bench.py warm
#   with the machine's facts and bound: single GPU, replicas and tensor parallel, each default and
#   with page-cache DMA (MGPU_PAGE_CACHE_PIN, 64GiB by default; the second load in a process),
#   ferry only: about 4 minutes with `build`, which then skips the Python package);
#   mgpu-full: the same plus the torch.distributed tests and the benchmark warm and cold beside
#   torch.distributed and fastsafetensors (needs `build` with the package); mgpu-sweep: the
#   multi-GPU C++ tests, the replicas' hashes, then the benchmark warm with the machine's facts,
#   where the time went, and one row per engine knob (no Python package is built for it:
#   `tools/gpu_check.sh build mgpu-sweep` runs in about 6 minutes). The device tool
#   caps one call at 10 minutes, so split them, e.g. `build tests warm`, then `tmpfs cold`, then
#   `sizes`; each stage builds and writes checkpoints first where a fresh machine lacks them.
#   Each benchmark stage leaves $OUT/results-STAGE.json; bench/report.py merges them into
#   BENCHMARKS.md and the chart.
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site

build() {
  log "build"
  cmake -S . -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
    -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
    -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu >"$OUT/build.log" 2>&1
  ninja -C /tmp/build >>"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
  # The sweep alone needs only the C++ build.
  case "$(echo $stages)" in
    "build mgpu" | mgpu | "build mgpu-sweep" | mgpu-sweep | "build core" | core | "build kvdma" | kvdma | "build kvlayout" | kvlayout) nopip=1 ;;
    *) nopip=0 ;;
  esac
  if [ "$nopip" = 1 ]; then
    log "doctor"
    "$ferry" doctor /tmp | tee -a "$OUT/summary.txt"
    return
  fi
  # --upgrade: a warm machine keeps /tmp/site from an earlier run (another branch's ferry).
  log "python package (pip install .)"
  CMAKE_PREFIX_PATH=/tmp/deps/usr CMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
    CMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu \
    python3 -m pip install --no-build-isolation --no-deps --no-index --upgrade --target /tmp/site . \
    >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; status=1; }
  log "doctor"
  "$ferry" doctor /tmp | tee -a "$OUT/summary.txt"
}

checkpoints() {
  local missing=""
  for m in $models; do [ -d "$ckpts/$m" ] || missing="$missing $m"; done
  [ -z "$missing" ] && return
  log "checkpoints"
  (cd bench && python3 make_checkpoints.py "$ckpts" $missing) | tee -a "$OUT/summary.txt"
}

# `ferry load --hash` of $1 with extra flags $3... must equal the cpu hashes in $2.
same_hashes() {
  local path=$1 want=$2 label=$3; shift 3
  if "$ferry" load "$path" --hash "$@" >/tmp/hashes.txt 2>/tmp/hashes.log && cmp -s /tmp/hashes.txt "$want"; then
    echo "$label: identical to cpu ($(wc -l <"$want") tensors; $(grep -o 'cufile-[a-z]*\|odirect\|buffered' /tmp/hashes.log | sort -u | tr '\n' ' '))" | tee -a "$OUT/summary.txt"
  else
    echo "$label: DIFFERENT from cpu" | tee -a "$OUT/summary.txt"; tail -3 /tmp/hashes.log; status=1
  fi
}

tests() {
  log "tests"
  # A failing test is reported (and fails the script at the end) without stopping the rest.
  (cd /tmp/build && ctest --output-on-failure -j4 >"$OUT/ctest.log" 2>&1) || { status=1; grep -A30 "FAILED\|Failure" "$OUT/ctest.log" | head -80; }
  tail -3 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
  checkpoints
  log "every path lands the bytes of the host path (ferry load --hash)"
  mkdir -p /tmp/hashes
  for m in $models; do
    "$ferry" load "$ckpts/$m" --device cpu --hash >"/tmp/hashes/cpu-$m.txt" 2>/dev/null
    same_hashes "$ckpts/$m" "/tmp/hashes/cpu-$m.txt" "$m cuda:0 auto" --device cuda:0
    same_hashes "$ckpts/$m" "/tmp/hashes/cpu-$m.txt" "$m cuda:0 O_DIRECT" --device cuda:0 --io direct
    same_hashes "$ckpts/$m" "/tmp/hashes/cpu-$m.txt" "$m cuda:0 cuFile" --device cuda:0 --backend cufile --allow-compat
  done
  mkdir -p "$ckpts/gguf"
  (cd bench && python3 make_gguf.py "$ckpts/gguf/llama3-8b-f16.gguf") | tee -a "$OUT/summary.txt"
  "$ferry" load "$ckpts/gguf/llama3-8b-f16.gguf" --device cpu --hash >/tmp/hashes/cpu-gguf.txt 2>/dev/null
  same_hashes "$ckpts/gguf/llama3-8b-f16.gguf" /tmp/hashes/cpu-gguf.txt "gguf 8B cuda:0" --device cuda:0
  "$ferry" load "$ckpts/gguf/llama3-8b-f16.gguf" --device cuda:0 | head -1 | tee -a "$OUT/summary.txt"
  rm -rf "$ckpts/gguf"  # the disk holds 64 GiB: room for the size sweep
  log "backend choice"
  "$ferry" load "$ckpts/qwen3-0.6b" --device cuda:0 --backend cufile 2>&1 | tee -a "$OUT/summary.txt" || true
  "$ferry" load "$ckpts/qwen3-0.6b" --device cuda:0 | grep "^path" | tee -a "$OUT/summary.txt"
  python3 - "$ckpts/qwen3-0.6b" /tmp/hashes/cpu-qwen3-0.6b.txt <<'PY' | tee -a "$OUT/summary.txt" || status=1
# ferry's digests equal those of the bytes safetensors itself returns.
import sys, torch, xxhash
from safetensors import safe_open
want = {l.split("\t")[0]: l.split("\t")[3].strip() for l in open(sys.argv[2])}
with safe_open(sys.argv[1] + "/model.safetensors", framework="pt") as f:
    bad = [k for k in f.keys() if xxhash.xxh3_64_hexdigest(f.get_tensor(k).contiguous().view(-1).view(torch.uint8).numpy().tobytes()) != want[k]]
print(f"qwen3-0.6b vs safetensors.safe_open: {len(want) - len(bad)}/{len(want)} tensors equal")
sys.exit(1 if bad else 0)
PY
}

# The engine's settings measured on this machine (ferry doctor --tune), once, before any
# benchmark: the suite measures ferry as a user runs it after tuning.
tuned() {
  [ -f "${FERRY_TUNING_FILE:-$HOME/.cache/ferry/tuning.json}" ] && return
  log "tuning (ferry doctor --tune)"
  "$ferry" doctor "$ckpts/llama3-8b" --tune | tee -a "$OUT/summary.txt" || status=1
}

bench() {
  local stage=$1; shift
  log "benchmark: $stage"
  (cd bench && python3 run_bench.py --ferry "$ferry" --dir "$ckpts" --out "$OUT/results-$stage.json" "$@") \
    2>&1 | tee -a "$OUT/bench.txt"
}

# The `ferry` command of the commit in .before/, built the same way, at /tmp/build-before.
build_before() {
  [ -f .before/ferry-before.tar.gz ] || { echo "no .before/ferry-before.tar.gz (carry it)" | tee -a "$OUT/summary.txt"; status=1; return 1; }
  rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf .before/ferry-before.tar.gz -C /tmp/before
  cmake -S /tmp/before/ferry-before -B /tmp/build-before -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFERRY_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=/tmp/deps/usr -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
    -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu >"$OUT/build-before.log" 2>&1
  ninja -C /tmp/build-before ferry_cli >>"$OUT/build-before.log" 2>&1 || { tail -30 "$OUT/build-before.log"; status=1; return 1; }
}

# Side-by-side loads by the commit in .before/ and this one.
compare() {
  log "before/after loads (bench/compare_loads.py)"
  build_before || return
  checkpoints
  (cd bench && python3 compare_loads.py --before /tmp/build-before/cli/ferry --after "$ferry" \
    --dir "$ckpts" --out "$OUT/compare.json" ${COMPARE_ARGS:-}) 2>&1 | tee -a "$OUT/summary.txt"
}

# The saver (8B shape from cuda:0, beside raw O_DIRECT writes and safetensors) and the
# transformers front end (time to a ready 8B-shaped model beside transformers' own).
python_benches() {
  log "saver (bench/save_bench.py)"
  mkdir -p /tmp/save-bench
  (cd bench && python3 save_bench.py --device cuda:0 --dir /tmp/save-bench --runs 3 \
    --json "$OUT/save.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/save-bench
  log "from_pretrained (bench/from_pretrained_bench.py)"
  (cd bench && python3 from_pretrained_bench.py /tmp/fp-bench --model llama3-8b --runs 3 \
    --json "$OUT/from_pretrained.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/fp-bench
}

# The transfer core (latency, extent throughput both ways beside raw O_DIRECT and pinned copies),
# the KV store on the host path, per-key reads (safe_open) and opening 100,000 tensors.
engine_benches() {
  log "transfer core (bench/transfer_bench)"
  ninja -C /tmp/build transfer_bench >>"$OUT/build.log" 2>&1 || { status=1; return; }
  mkdir -p /tmp/tb && /tmp/build/transfer_bench --dir /tmp/tb --device cuda:0 \
    --json "$OUT/transfer.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/tb
  log "KV store, host path (bench/kv_bench)"
  /tmp/build/tests/kv_bench /tmp/kvb --sizes 256K,1M,4M,16M --bytes 2G --batch 16 \
    --index-blocks 10000000 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvb
  log "per-key reads (bench/per_key_reads.py)"
  for args in "--device cpu" "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench && python3 per_key_reads.py $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "opening 100,000 tensors (bench/open_many_tensors.py)"
  (cd bench && python3 open_many_tensors.py --ferry-bin "$ferry") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}

# The safetensors drop-in: GPU tests of safe_open (small reads and the engine, read-ahead
# bit-exact, random access) and of the transformers front end (Llama, Qwen2, two MoE models
# against transformers' own from_pretrained), each file in a pytest process of its own (a CUDA
# error left by another test file cannot fail them); per-key reads on the generated 1,000-tensor
# file and on the Llama-3-8B shape (beside ferry.torch.load_file, safetensors, and ferry with
# its small-read path off), tensor-parallel slices with the bytes they read; time to a ready
# MoE model (moe-16x64, Qwen3-MoE layers whose experts transformers 5 fuses) beside transformers'.
dropin() {
  for file in test_dropin.py test_transformers.py test_hf_conversion.py; do
    log "tests/python/$file (cuda:0 included)"
    FERRY_BIN=$ferry FERRY_LIB=/tmp/build/libferry.so python3 -m pytest -q -p no:cacheprovider \
      "tests/python/$file" >"$OUT/pytest-${file%.py}.log" 2>&1 || status=1
    tail -12 "$OUT/pytest-${file%.py}.log" | tee -a "$OUT/summary.txt"
  done
  log "per-key reads, 1,000 x 256 KiB (bench/per_key_reads.py)"
  for args in "--device cpu" "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench && python3 per_key_reads.py $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "per-key reads, 256 x 1 MiB (the small-read path's limit for get_tensor)"
  (cd bench && python3 per_key_reads.py --device cuda:0 --tensors 256 --kib 1024) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  [ -d "$ckpts/llama3-8b" ] || { log "checkpoint llama3-8b"; (cd bench && python3 make_checkpoints.py "$ckpts" llama3-8b) | tee -a "$OUT/summary.txt"; }
  log "per-key reads, Llama-3-8B shape"
  for args in "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench && python3 per_key_reads.py --checkpoint "$ckpts/llama3-8b" --repeat 3 $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "from_pretrained, MoE (bench/from_pretrained_bench.py --model moe-16x64)"
  (cd bench && python3 from_pretrained_bench.py /tmp/fp-bench --model moe-16x64 --runs 2 \
    --json "$OUT/from_pretrained_moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/fp-bench
}

# The transfer core (issue 10): its tests with a GPU and loads after the first in one process of
# the Qwen3-0.6B shape, beside pinned H2D, with and without page-cache DMA; with `full`, the
# benchmark (pipelined staged writes, submission latency, beside raw O_DIRECT and pinned copies),
# the copy probe, a sweep of the engine's knobs and moe-16x64 by the commit in .before.
core_checks() {
  log "transfer core: tests (GPU and host)"
  (cd /tmp/build && ctest --output-on-failure -j2 -R 'Gpu|Pipeline|Transfer\.|RoundTrip|PinnedPool|Save|HandleCache|StagedPlan|WorkerPool|PageCache' \
    >"$OUT/ctest-core.log" 2>&1) || { status=1; grep -A30 "FAILED\|Failure" "$OUT/ctest-core.log" | head -80; }
  tail -3 "$OUT/ctest-core.log" | tee -a "$OUT/summary.txt"
  ninja -C /tmp/build transfer_bench staged_bound >>"$OUT/build.log" 2>&1 || { status=1; return; }
  local sweep=""
  [ "${1:-}" = full ] && sweep="--sweep --page-cache-sweep"
  models=qwen3-0.6b checkpoints
  log "transfer core: later loads kept (--keep), refilled (--refill) and from the device memory cache (--cache-device-memory) land the bytes of a cpu load"
  mkdir -p /tmp/hashes
  "$ferry" load "$ckpts/qwen3-0.6b" --device cpu --hash >/tmp/hashes/cpu-qwen3-0.6b.txt 2>/dev/null
  for form in --keep --refill --cache-device-memory; do
    same_hashes "$ckpts/qwen3-0.6b" /tmp/hashes/cpu-qwen3-0.6b.txt "qwen3-0.6b cuda:0 --repeat 3 $form" \
      --device cuda:0 --repeat 3 $form
    same_hashes "$ckpts/qwen3-0.6b" /tmp/hashes/cpu-qwen3-0.6b.txt "qwen3-0.6b cuda:0 --repeat 3 $form, page-cache DMA" \
      --device cuda:0 --repeat 3 $form --page-cache-pin 4GiB
  done
  FERRY_BIN=$ferry python3 -m pytest -q -p no:cacheprovider tests/python/test_cli_repeat.py \
    >"$OUT/pytest-cli-repeat.log" 2>&1 || { status=1; tail -30 "$OUT/pytest-cli-repeat.log"; }
  tail -1 "$OUT/pytest-cli-repeat.log" | sed 's/^/tests\/python\/test_cli_repeat.py (cuda:0): /' | tee -a "$OUT/summary.txt"
  log "transfer core: loads after the first in one process: freed before, kept, refilled; defaults and page-cache DMA (bench/second_load.py --page-cache-pin 4GiB --forms)"
  (cd bench && python3 second_load.py --ferry "$ferry" "$ckpts/qwen3-0.6b" --device cuda:0 \
    --bound /tmp/build/staged_bound --page-cache-pin 4GiB --forms $sweep \
    --json "$OUT/second_load.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  [ "${1:-}" = full ] || return 0
  log "transfer core: bench/transfer_bench"
  mkdir -p /tmp/tb && /tmp/build/transfer_bench --dir /tmp/tb --device cuda:0 \
    --json "$OUT/transfer.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  /tmp/build/transfer_bench --dir /tmp/tb --device cpu --scale 0.02 \
    --json "$OUT/transfer-cpu.json" 2>&1 | grep latency | sed 's/^/cpu memory: /' | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/tb
  log "transfer core: the host (lscpu) and its copies (bench/copy_probe.py: by size, streams and source alignment)"
  lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA|L3)" | tee -a "$OUT/summary.txt" || true
  (cd bench && python3 copy_probe.py --gib 1) 2>&1 | grep -v "^allocate" |
    tee -a "$OUT/summary.txt" || status=1
  log "transfer core: moe-16x64 warm, the commit in .before beside this one (bench/compare_loads.py --runs 5)"
  build_before || return
  models=moe-16x64 checkpoints
  (cd bench && python3 second_load.py --ferry "$ferry" "$ckpts/moe-16x64" --device cuda:0 \
    --repeat 4 --bound /tmp/build/staged_bound --json "$OUT/second_load_moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  (cd bench && python3 compare_loads.py --before /tmp/build-before/cli/ferry --after "$ferry" \
    --dir "$ckpts" --models moe-16x64 --sources warm --runs 5 --out "$OUT/compare-moe.json") 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
}

# The KV block store on the GPU (issue 13). `kv`: everything below; `kvperf`: the tests, the
# bench rows and the crash trials (no index, torch.save or CPU rows: about 4 minutes after build).
kv_tests() {
  log "KV store tests (ctest -R 'Kv|kv_|c_header|c_abi')"
  (cd /tmp/build && ctest --output-on-failure -R 'Kv|kv_|c_header|c_abi' >"$OUT/kv-ctest.log" 2>&1) ||
    { status=1; grep -B5 -A30 "FAILED\|Failure" "$OUT/kv-ctest.log" | head -80; }
  tail -3 "$OUT/kv-ctest.log" | tee -a "$OUT/summary.txt"
  # The GPU binary's own summary: which ran, which were skipped (no GPU, no cuFile) and why.
  /tmp/build/tests/test_gpu_kv >"$OUT/kv-gpu-tests.log" 2>&1 || status=1
  grep -E "^\[ +(PASSED|SKIPPED|FAILED) +\]" "$OUT/kv-gpu-tests.log" | tee -a "$OUT/summary.txt" || true
  log "KV Python tests (cuda:0 and cpu)"
  python3 -m pytest -q -rs tests/python/test_kv.py 2>&1 | tail -8 | tee -a "$OUT/summary.txt" || status=1
}

kv_bench_rows() {
  log "ferry kv bench (cuda:0, staged and direct; medians of 3 rounds alternating with raw I/O)"
  mkdir -p /tmp/kvbench
  # Batches of 16 blocks, then prefixes of 256 MiB per call (16 to 256 blocks) on the staged
  # path (the default one), where the per-call cost is not what is measured.
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 64K,256K,1M,4M,16M --bytes 512M --rounds 3 \
    --json "$OUT/kv-bench.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 1M,4M,16M --batch-bytes 256M --bytes 1G \
    --path staged --rounds 3 --json "$OUT/kv-bench-prefix.json" 2>&1 | tee -a "$OUT/summary.txt" ||
    status=1
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 2M --bytes 512M --pieces 64 --path staged \
    --rounds 3 --json "$OUT/kv-bench-pieces.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

kv_extras() {
  mkdir -p /tmp/kvbench
  log "ferry kv bench (cpu memory, the host path)"
  "$ferry" kv bench /tmp/kvbench --device cpu --sizes 64K,1M,16M --bytes 512M --rounds 3 \
    --json "$OUT/kv-bench-cpu.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  log "KV index: lookup and reopen at 10 million blocks (kv_bench)"
  /tmp/build/tests/kv_bench /tmp/kvbench/index --sizes 4K --bytes 4M --batch 16 \
    --index-blocks 10000000 2>&1 | tail -1 | tee -a "$OUT/summary.txt" || status=1
  log "KV beside torch.save/torch.load and per-file writes (bench/kv_torch_compare.py)"
  python3 bench/kv_torch_compare.py --dir /tmp/kvbench/cmp --device cuda:0 --drop-caches 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

kv_crash() {
  # KV_CRASH_SECONDS=180 for the full 1,000 (tools/kv_crash_trials.sh runs them too).
  local crash_seconds=${KV_CRASH_SECONDS:-60}
  log "KV crash trials (up to 1,000 in runs of 100, stopping after $crash_seconds s)"
  local done_trials=0 start=$SECONDS
  while [ $done_trials -lt 1000 ] && [ $((SECONDS - start)) -lt $crash_seconds ]; do
    if ! FERRY_KV_CRASH_FIRST=$done_trials FERRY_KV_CRASH_TRIALS=100 \
        /tmp/build/tests/test_kv_crash --gtest_brief=1 >>"$OUT/kv-crash.log" 2>&1; then
      echo "crash trials $done_trials-$((done_trials + 99)): FAILED" | tee -a "$OUT/summary.txt"
      tail -20 "$OUT/kv-crash.log"; status=1; break
    fi
    done_trials=$((done_trials + 100))
  done
  echo "$done_trials crash trials passed in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

# KV gets by page-cache DMA (KVStoreOptions::page_cache_pin_bytes).
kv_dma() {
  log "KV page-cache DMA tests (test_gpu_kv_dma, test_gpu_checksum, test_kv_page_cache, test_page_cache_registry, test_page_cache_dma)"
  for t in test_gpu_kv_dma test_gpu_checksum test_kv_page_cache test_page_cache_registry test_page_cache_dma; do
    /tmp/build/tests/$t >"$OUT/$t.log" 2>&1 || { status=1; grep -B5 -A20 "FAILED\|Failure" "$OUT/$t.log" | head -60; }
    grep -E "^\[ +(PASSED|SKIPPED|FAILED) +\]" "$OUT/$t.log" | sed "s/^/$t: /" | tee -a "$OUT/summary.txt" || true
  done
  log "ferry kv bench --page-cache-pin 4G (cuda:0, staged; batches of 16, 256 MiB prefixes, per-layer prefixes)"
  mkdir -p /tmp/kvbench
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 256K,1M,4M,16M --bytes 1G --rounds 3 \
    --path staged --page-cache-pin 4G --json "$OUT/kv-dma-bench.json" 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 1M,4M,16M --batch-bytes 256M --bytes 1G \
    --rounds 3 --path staged --page-cache-pin 4G --json "$OUT/kv-dma-bench-prefix.json" 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --sizes 1M,4M --pieces 16 --batch-bytes 256M \
    --bytes 1G --rounds 3 --path staged --page-cache-pin 4G \
    --json "$OUT/kv-dma-bench-pieces.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

# The engines' KV layouts (many small per-layer pieces per block): the layout tests on the GPU
# (staged, direct, page-cache DMA; the SIGKILL test with a refilled GPU source), the crash trials
# with refilled sources, then `ferry kv bench` per layout on cuda:0 beside pinned H2D and raw
# O_DIRECT of the same bytes: vLLM (64 x 32 KiB) and one piece of the same size, 128 blocks and
# 16 blocks per call, with page-cache DMA; vLLM canonical, MLA, SGLang; host memory too.
kv_layout_stage() {
  log "KV layouts: tests (test_gpu_kv_layouts, test_kv_layouts, test_gpu_kv, test_gpu_kv_dma, test_kv_crash)"
  for t in test_gpu_kv_layouts test_kv_layouts test_gpu_kv test_gpu_kv_dma test_kv_crash; do
    /tmp/build/tests/$t >"$OUT/$t.log" 2>&1 || { status=1; grep -B5 -A20 "FAILED\|Failure" "$OUT/$t.log" | head -60; }
    grep -E "^\[ +(PASSED|SKIPPED|FAILED) +\]" "$OUT/$t.log" | sed "s/^/$t: /" | tee -a "$OUT/summary.txt" || true
  done
  mkdir -p /tmp/kvbench
  local common="--device cuda:0 --bytes 1G --rounds 3 --path staged"
  local vllm="--layout vllm --layers 32 --block-tokens 16 --kv-heads 8 --head-dim 128"
  for batch in 128 16; do
    log "ferry kv bench: one piece of 2 MiB, then vLLM 64 x 32 KiB, $batch blocks per call, page-cache DMA on"
    "$ferry" kv bench /tmp/kvbench $common --sizes 2M --batch $batch --page-cache-pin 8G \
      --json "$OUT/kvlayout-one-$batch.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
    "$ferry" kv bench /tmp/kvbench $common $vllm --batch $batch --page-cache-pin 8G \
      --json "$OUT/kvlayout-vllm-$batch.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "ferry kv bench: vLLM canonical, MLA (61 layers, 64 tokens), SGLang, vLLM fp8 128 layers; 128 blocks per call"
  for l in "--layout vllm-canonical --layers 32" "--layout mla --layers 61 --block-tokens 64" \
           "--layout sglang --layers 32" "--layout vllm --layers 128 --kv-heads 4 --dtype fp8"; do
    "$ferry" kv bench /tmp/kvbench $common $l --batch 128 --page-cache-pin 8G 2>&1 |
      tee -a "$OUT/summary.txt" || status=1
  done
  log "ferry kv bench: host memory, one piece and vLLM's layout (beside raw O_DIRECT)"
  "$ferry" kv bench /tmp/kvbench --device cpu --sizes 2M --batch 128 --bytes 1G --rounds 3 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cpu $vllm --batch 128 --bytes 1G --rounds 3 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  log "bench/kv_vs_fs_tier.py: ferry beside a vLLM-fs-tier equivalent (file per block, O_DIRECT, 16 threads)"
  python3 bench/kv_vs_fs_tier.py --dir /tmp/kvbench/fs --lib /tmp/build/libferry.so 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  python3 bench/kv_vs_fs_tier.py --dir /tmp/kvbench/fs --lib /tmp/build/libferry.so --pieces 64 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

kv_stage() {
  kv_tests
  kv_bench_rows
  [ "${1:-}" = perf ] || kv_extras
  kv_crash
}

# Weight streaming (ferry.torch.offload): the C++ and Python GPU tests (eager, torch.compile,
# CUDA graphs, slot safety, expert caches), then the benchmarks (Llama-3-8B shapes with half the
# layers streamed; a Mixtral-shaped MoE decoding through expert caches).
stream_tests() {
  log "weight streaming: GPU tests (test_gpu_stream, test_offload*.py, test_experts.py)"
  python3 -c "import ferry.torch as t; t.offload, t.offload_experts" 2>&1 || {
    echo "the ferry in /tmp/site has no weight streaming: run the build stage" | tee -a "$OUT/summary.txt"
    status=1; return; }
  ninja -C /tmp/build test_gpu_stream test_weight_stream >>"$OUT/build.log" 2>&1 || { status=1; return; }
  for t in test_weight_stream test_gpu_stream; do
    /tmp/build/tests/$t >"$OUT/$t.log" 2>&1 || { status=1; grep -B2 -A12 "Failure\|FAILED" "$OUT/$t.log" | head -60 || true; }
    tail -1 "$OUT/$t.log" | sed "s/^/$t: /" | tee -a "$OUT/summary.txt"
  done
  # No log capture: torch.compile's debug records would bury the failures.
  python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short tests/python/test_offload.py \
    tests/python/test_offload_gpu.py tests/python/test_experts.py \
    >"$OUT/offload-tests.log" 2>&1 || { status=1; grep -B5 -A30 "^E \|Error" "$OUT/offload-tests.log" | head -120 || true; }
  grep -E "^(FAILED|ERROR) " "$OUT/offload-tests.log" | tee -a "$OUT/summary.txt" || true
  tail -1 "$OUT/offload-tests.log" | tee -a "$OUT/summary.txt"
  if grep -q "^FAILED.*test_torch_compile\[" "$OUT/offload-tests.log"; then
    # Inductor's code for the resident and the offloaded compile, to see where they part.
    log "torch.compile's output code of the first failing case ($OUT/compile-code.txt)"
    TORCH_LOGS=output_code TORCH_LOGS_OUT="$OUT/compile-code.txt" python3 -m pytest -q -x \
      -p no:cacheprovider -p no:logging tests/python/test_offload_gpu.py::test_torch_compile \
      >"$OUT/compile-rerun.log" 2>&1 || true
    tail -1 "$OUT/compile-rerun.log" | tee -a "$OUT/summary.txt"
  fi
}

stream_bench() {
  log "weight streaming benchmark (bench/stream_bench.py ${STREAM_BENCH_ARGS:-})"
  (cd bench && python3 stream_bench.py --json "$OUT/stream.json" ${STREAM_BENCH_ARGS:-}) 2>&1 \
    | tee -a "$OUT/summary.txt" || status=1
  log "MoE expert cache benchmark (bench/moe_bench.py)"
  (cd bench && python3 moe_bench.py --json "$OUT/moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}

# Multi-GPU loading (issue 15) on every GPU of the machine. NVLink multicast can take a host's
# GPUs out of service: every process of this stage runs with it off (ferry never turns it on
# itself and never changes the user's environment).
mgpu() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  log "multi-GPU tests on $gpus GPUs (ctest -L gpu2; planner and host-rank tests)"
  (cd /tmp/build && ctest -R "ShardPlan|FanoutLoad|CApiFanout|Gpu2|PageCacheRegistry" --output-on-failure >"$OUT/ctest-mgpu.log" 2>&1) || \
    { status=1; grep -B5 -A30 "FAILED\|Failure" "$OUT/ctest-mgpu.log" | head -80; }
  grep -E "tests passed|SKIPPED|Skipped" "$OUT/ctest-mgpu.log" | tee -a "$OUT/summary.txt"
  if [ "${1:-}" = full ]; then
    log "torch.distributed loads (gloo on the CPU, NCCL on the GPUs)"
    python3 -m pytest -q tests/python/test_distributed.py 2>&1 | tail -5 | tee -a "$OUT/summary.txt" || status=1
  fi
  models=llama3-8b checkpoints
  local all="cuda:0"
  for ((i = 1; i < gpus; i++)); do all="$all,cuda:$i"; done
  log "replicas on $all: every GPU's hashes equal a single-GPU load's"
  mkdir -p /tmp/hashes
  "$ferry" load "$ckpts/llama3-8b" --device cuda:0 --hash >/tmp/hashes/single.txt 2>/dev/null
  "$ferry" load "$ckpts/llama3-8b" --device "$all" --hash >/tmp/hashes/multi.txt 2>/tmp/hashes/multi.log || \
    { status=1; tail -5 /tmp/hashes/multi.log; }
  grep -E "^(loaded|read from|cuda|collectives)" /tmp/hashes/multi.log | tee -a "$OUT/summary.txt"
  # Page-cache DMA: the second load in the process copies straight from the registrations the
  # first one made (its hashes are printed).
  local pin="--page-cache-pin ${MGPU_PAGE_CACHE_PIN:-64GiB}"
  "$ferry" load "$ckpts/llama3-8b" --device "$all" --hash --repeat 2 $pin >/tmp/hashes/multi-dma.txt \
    2>/tmp/hashes/multi-dma.log || { status=1; tail -5 /tmp/hashes/multi-dma.log; }
  awk '/^loaded/ { last = "" } { last = last $0 "\n" } END { printf "%s", last }' /tmp/hashes/multi-dma.log |
    grep -E "^(loaded|read from|page-cache DMA|path)" | tee -a "$OUT/summary.txt"
  for run in multi multi-dma; do
    for ((i = 0; i < gpus; i++)); do
      if grep -P "^cuda:$i\t" /tmp/hashes/$run.txt | cut -f2- | cmp -s - /tmp/hashes/single.txt; then
        echo "cuda:$i replica ($run): identical to the single-GPU load ($(wc -l </tmp/hashes/single.txt) tensors)" | tee -a "$OUT/summary.txt"
      else
        echo "cuda:$i replica ($run): DIFFERENT from the single-GPU load" | tee -a "$OUT/summary.txt"; status=1
      fi
    done
  done
  "$ferry" load "$ckpts/llama3-8b" --device "$all" --tensor-parallel 2>/dev/null | tee -a "$OUT/summary.txt" || status=1
  [ "${1:-}" = sweep ] && return
  log "multi-GPU benchmark (bench/multi_gpu_bench.py)"
  local args="--sources warm --no-peers --page-cache-pin ${MGPU_PAGE_CACHE_PIN:-64GiB}"
  [ "${1:-}" = full ] && args="--sources warm cold --page-cache-pin ${MGPU_PAGE_CACHE_PIN:-64GiB}"
  (cd bench && python3 multi_gpu_bench.py --ferry "$ferry" --dir "$ckpts" --gpus "$gpus" \
    $args --json "$OUT/multi_gpu.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}

if want build || [ ! -x "$ferry" ]; then build; fi
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
want kvlayout && kv_layout_stage
want stream && { stream_tests; stream_bench; }
want stream-tests && stream_tests
want stream-bench && stream_bench
want mgpu && mgpu
want mgpu-full && mgpu full
if want mgpu-sweep; then
  mgpu sweep
  log "multi-GPU benchmark, warm, with the machine's facts and one row per knob"
  (cd bench && python3 multi_gpu_bench.py --ferry "$ferry" --dir "$ckpts" --sources warm \
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
