# Multi-GPU loading (stages mgpu, mgpu-full and mgpu-sweep).
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

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
  log "multi-GPU benchmark (bench/multi_gpu/multi_gpu_bench.py)"
  local args="--sources warm --no-peers --page-cache-pin ${MGPU_PAGE_CACHE_PIN:-64GiB}"
  [ "${1:-}" = full ] && args="--sources warm cold --page-cache-pin ${MGPU_PAGE_CACHE_PIN:-64GiB}"
  (cd bench/multi_gpu && python3 multi_gpu_bench.py --ferry "$ferry" --dir "$ckpts" --gpus "$gpus" \
    $args --json "$OUT/multi_gpu.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1
}
