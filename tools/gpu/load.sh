# Loading: the full test run with every path's hashes (tests), before/after loads (compare),
# the saver and from_pretrained (python), the engine benchmarks (engine) and the safetensors
# drop-in on the GPU (dropin).
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

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
  (cd bench/load && python3 make_gguf.py "$ckpts/gguf/llama3-8b-f16.gguf") | tee -a "$OUT/summary.txt"
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

# Side-by-side loads by the commit in .before/ and this one.
compare() {
  log "before/after loads (bench/load/compare_loads.py)"
  build_before || return
  checkpoints
  (cd bench/load && python3 compare_loads.py --before /tmp/build-before/cli/ferry --after "$ferry" \
    --dir "$ckpts" --out "$OUT/compare.json" ${COMPARE_ARGS:-}) 2>&1 | tee -a "$OUT/summary.txt"
}

# The saver (8B shape from cuda:0, beside raw O_DIRECT writes and safetensors) and the
# transformers front end (time to a ready 8B-shaped model beside transformers' own).
python_benches() {
  log "saver (bench/load/save_bench.py)"
  mkdir -p /tmp/save-bench
  (cd bench/load && python3 save_bench.py --device cuda:0 --dir /tmp/save-bench --runs 3 \
    --json "$OUT/save.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/save-bench
  log "from_pretrained (bench/load/from_pretrained_bench.py)"
  (cd bench/load && python3 from_pretrained_bench.py /tmp/fp-bench --model llama3-8b --runs 3 \
    --json "$OUT/from_pretrained.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/fp-bench
}

# The transfer core (latency, extent throughput both ways beside raw O_DIRECT and pinned copies),
# the KV store on the host path, per-key reads (safe_open) and opening 100,000 tensors.
engine_benches() {
  log "transfer core (bench/transfer/transfer_bench)"
  ninja -C /tmp/build transfer_bench >>"$OUT/build.log" 2>&1 || { status=1; return; }
  mkdir -p /tmp/tb && /tmp/build/transfer_bench --dir /tmp/tb --device cuda:0 \
    --json "$OUT/transfer.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/tb
  log "KV store, host path (bench/kv/kv_bench)"
  /tmp/build/tests/kv_bench /tmp/kvb --sizes 256K,1M,4M,16M --bytes 2G --batch 16 \
    --index-blocks 10000000 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvb
  log "per-key reads (bench/load/per_key_reads.py)"
  for args in "--device cpu" "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench/load && python3 per_key_reads.py $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "opening 100,000 tensors (bench/load/open_many_tensors.py)"
  (cd bench/load && python3 open_many_tensors.py --ferry-bin "$ferry") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}

# The safetensors drop-in: GPU tests of safe_open (small reads and the engine, read-ahead
# bit-exact, random access) and of the transformers front end (Llama, Qwen2, two MoE models
# against transformers' own from_pretrained), each file in a pytest process of its own (a CUDA
# error left by another test file cannot fail them); per-key reads on the generated 1,000-tensor
# file and on the Llama-3-8B shape (beside ferry.torch.load_file, safetensors, and ferry with
# its small-read path off), tensor-parallel slices with the bytes they read; time to a ready
# MoE model (moe-16x64, Qwen3-MoE layers whose experts transformers 5 fuses) beside transformers'.
dropin() {
  for file in test_dropin.py test_dropin_reads.py test_transformers.py test_hf_conversion.py; do
    log "tests/python/$file (cuda:0 included)"
    FERRY_BIN=$ferry FERRY_LIB=/tmp/build/libferry.so python3 -m pytest -q -p no:cacheprovider \
      "tests/python/$file" >"$OUT/pytest-${file%.py}.log" 2>&1 || status=1
    tail -12 "$OUT/pytest-${file%.py}.log" | tee -a "$OUT/summary.txt"
  done
  log "per-key reads, 1,000 x 256 KiB (bench/load/per_key_reads.py)"
  for args in "--device cpu" "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench/load && python3 per_key_reads.py $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "per-key reads, 256 x 1 MiB (the small-read path's limit for get_tensor)"
  (cd bench/load && python3 per_key_reads.py --device cuda:0 --tensors 256 --kib 1024) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  [ -d "$ckpts/llama3-8b" ] || { log "checkpoint llama3-8b"; (cd bench && python3 make_checkpoints.py "$ckpts" llama3-8b) | tee -a "$OUT/summary.txt"; }
  log "per-key reads, Llama-3-8B shape"
  for args in "--device cuda:0" "--device cuda:0 --slices"; do
    (cd bench/load && python3 per_key_reads.py --checkpoint "$ckpts/llama3-8b" --repeat 3 $args) 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  log "from_pretrained, MoE (bench/load/from_pretrained_bench.py --model moe-16x64)"
  (cd bench/load && python3 from_pretrained_bench.py /tmp/fp-bench --model moe-16x64 --runs 2 \
    --json "$OUT/from_pretrained_moe.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/fp-bench
}
