# What every stage shares: the build, the benchmark checkpoints, hash checks, tuning, the
# benchmark suite, and the build of the commit in .before/.
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

build() {
  log "build"
  cmake -S . -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
    -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
    -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu >"$OUT/build.log" 2>&1
  # Stages that need only some targets build those alone (and the Python package only where they
  # use it); several such stages in one call build their union. Any other stage builds everything.
  local targets="" everything=0 nopip=1 stage
  [ "$(echo $stages)" = build ] && nopip=0  # `build` alone: everything
  for stage in $stages; do
    case "$stage" in
      build) ;;
      firstload-tests)
        targets+=" ferry_cli test_transfer test_transfer_pipeline test_engine test_gpu test_gpu_transfer"
        nopip=0 ;;
      firstload*) targets+=" ferry_cli"; nopip=0 ;;
      kvbisect | requestsize | kvwarm | kvother) targets+=" ferry_cli" ;;
      kvfleet) targets+=" ferry_cli test_kv_fleet test_kv_cli" ;;
      kvlayout)
        targets+=" ferry_cli test_gpu_kv_layouts test_kv_layouts test_gpu_kv test_gpu_kv_dma test_kv_crash" ;;
      kvtier) targets+=" ferry" ;;
      kvgroups | kvsweep)
        targets+=" ferry_cli test_gpu_transfer test_gpu_kv_layouts test_gpu_kv test_gpu_kv_dma test_kv_page_cache" ;;
      # tools/vllm_gpu_run.sh needs the Python package alone.
      vllm) targets+=" ferry_cli"; nopip=0 ;;
      mgpu | mgpu-sweep | core | kvdma) everything=1 ;;
      *) everything=1; nopip=0 ;;
    esac
  done
  [ "$everything" = 1 ] && targets=""
  # shellcheck disable=SC2086  # the targets are words
  ninja -C /tmp/build $(echo $targets | tr ' ' '\n' | sort -u) >>"$OUT/build.log" 2>&1 ||
    { tail -50 "$OUT/build.log"; exit 1; }
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
  (cd bench/load && python3 run_bench.py --ferry "$ferry" --dir "$ckpts" --out "$OUT/results-$stage.json" "$@") \
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
