# The transfer core (stages core and core-full).
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

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
  log "transfer core: loads after the first in one process: freed before, kept, refilled; defaults and page-cache DMA (bench/load/second_load.py --page-cache-pin 4GiB --forms)"
  (cd bench/load && python3 second_load.py --ferry "$ferry" "$ckpts/qwen3-0.6b" --device cuda:0 \
    --bound /tmp/build/staged_bound --page-cache-pin 4GiB --forms $sweep \
    --json "$OUT/second_load.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  [ "${1:-}" = full ] || return 0
  log "transfer core: bench/transfer/transfer_bench"
  mkdir -p /tmp/tb && /tmp/build/transfer_bench --dir /tmp/tb --device cuda:0 \
    --json "$OUT/transfer.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  /tmp/build/transfer_bench --dir /tmp/tb --device cpu --scale 0.02 \
    --json "$OUT/transfer-cpu.json" 2>&1 | grep latency | sed 's/^/cpu memory: /' | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/tb
  log "transfer core: the host (lscpu) and its copies (bench/transfer/copy_probe.py: by size, streams and source alignment)"
  lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA|L3)" | tee -a "$OUT/summary.txt" || true
  (cd bench/transfer && python3 copy_probe.py --gib 1) 2>&1 | grep -v "^allocate" |
    tee -a "$OUT/summary.txt" || status=1
  log "transfer core: moe-16x64 warm, the commit in .before beside this one (bench/load/compare_loads.py --runs 5)"
  build_before || return
  models=moe-16x64 checkpoints
  (cd bench/load && python3 second_load.py --ferry "$ferry" "$ckpts/moe-16x64" --device cuda:0 \
    --repeat 4 --bound /tmp/build/staged_bound --json "$OUT/second_load_moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  (cd bench/load && python3 compare_loads.py --before /tmp/build-before/cli/ferry --after "$ferry" \
    --dir "$ckpts" --models moe-16x64 --sources warm --runs 5 --out "$OUT/compare-moe.json") 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
}
