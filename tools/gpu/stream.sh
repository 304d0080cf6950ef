# Weight streaming (stages stream, stream-tests and stream-bench).
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

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
  log "weight streaming benchmark (bench/stream/stream_bench.py ${STREAM_BENCH_ARGS:-})"
  (cd bench/stream && python3 stream_bench.py --json "$OUT/stream.json" ${STREAM_BENCH_ARGS:-}) 2>&1 \
    | tee -a "$OUT/summary.txt" || status=1
  log "MoE expert cache benchmark (bench/stream/moe_bench.py)"
  (cd bench/stream && python3 moe_bench.py --json "$OUT/moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}
