# The first-load stages (issue 27): firstload-tests, firstload, firstload-cold, firstload4; and
# tpcold (a group load by a process per GPU from a cold disk: the ranks' shared readers).
# shellcheck shell=bash

# The first load of a fresh process beside later ones, pinned H2D and the peers (issue 27).
# $1: warm (one GPU), cold (one GPU, page cache dropped, beside raw O_DIRECT) or group (a
# process per GPU).
first_load() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local dir=/tmp/first-load common
  mkdir -p "$dir"
  common="--dir $dir --ferry-bin $ferry --scale ${FIRST_LOAD_SCALE:-1} --later ${FIRST_LOAD_LATER:-2} --timeout ${FIRST_LOAD_TIMEOUT:-180}"
  case $1 in
    warm)
      log "first loads, one GPU, warm (bench/load/first_load.py)"
      (cd bench/load && python3 first_load.py $common --cases one-file,moe,shm --temps warm \
        ${FIRST_LOAD_LOADERS:+--loaders $FIRST_LOAD_LOADERS} --json "$OUT/first_load.json") 2>&1 |
        tee -a "$OUT/summary.txt" || status=1 ;;
    cold)
      log "first loads, one GPU, cold (bench/load/first_load.py; raw O_DIRECT in the same run)"
      (cd bench/load && python3 first_load.py $common --cases one-file,moe --temps cold \
        --loaders ${FIRST_LOAD_LOADERS:-ferry,ferry-cli,instanttensor,instanttensor-buffered} \
        --json "$OUT/first_load_cold.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1 ;;
    tests)
      log "first-load tests: staging pinned slot by slot (transfer core, CPU and GPU), process-group loads, the benchmark's smoke run"
      (cd /tmp/build && ctest -R "PinnedPool|Transfer|Pipeline|Engine|Gpu\.|StagedPlan|StagedUnits|WorkerPool" --output-on-failure \
        >"$OUT/ctest-firstload.log" 2>&1) || { status=1; grep -B5 -A30 "FAILED\|Failure" "$OUT/ctest-firstload.log" | head -80; }
      tail -3 "$OUT/ctest-firstload.log" | tee -a "$OUT/summary.txt"
      FERRY_BIN=$ferry python3 -m pytest -q -p no:cacheprovider tests/python/test_distributed.py \
        tests/python/test_first_load_bench.py tests/python/test_overlapped_views.py tests/python/test_vs_safetensors.py >"$OUT/pytest-firstload.log" 2>&1 || status=1
      tail -5 "$OUT/pytest-firstload.log" | tee -a "$OUT/summary.txt" ;;
    group)
      local gpus
      gpus=$(nvidia-smi -L | wc -l)
      log "torch.distributed loads, gloo and NCCL on $gpus GPUs (tests/python/test_distributed.py)"
      FERRY_BIN=$ferry python3 -m pytest -q -p no:cacheprovider tests/python/test_distributed.py 2>&1 |
        tail -3 | tee -a "$OUT/summary.txt" || status=1
      log "first loads, a process per GPU on $gpus GPUs, warm (bench/load/first_load.py --nproc $gpus)"
      (cd bench/load && python3 first_load.py $common --cases llama --temps warm --nproc "$gpus" \
        ${FIRST_LOAD_LOADERS:+--loaders $FIRST_LOAD_LOADERS} --json "$OUT/first_load_group.json") 2>&1 |
        tee -a "$OUT/summary.txt" || status=1
      # The same loaders on one GPU (tensor-parallel ones have no single-GPU form): replicas are
      # judged against the single-GPU first load of the same loader.
      local single
      single=$(tr , '\n' <<<"${FIRST_LOAD_LOADERS:-ferry,ferry-prepared,ferry-cli}" | grep -v -- '-tp' | paste -sd, -)
      log "the same checkpoint's single-GPU first load ($single)"
      (cd bench/load && python3 first_load.py $common --cases llama --temps warm --loaders "${single:-ferry}" \
        --json "$OUT/first_load_single.json") 2>&1 | tee -a "$OUT/summary.txt" || status=1 ;;
  esac
}

# A group load by a process per GPU (up to 4), as vLLM's ranks run ferry's group load: the
# engine's readers (the node's ranks share 16 from a cold disk) beside 16 a rank (each as one
# load), cold then warm, alternating, a fresh group per run (bench/load/group_cold.py).
# TP_COLD_THREADS (fixed reader threads a rank, comma-separated) and TP_COLD_STATES change what
# it compares: on one GPU, `TP_COLD_THREADS=4,8,32 TP_COLD_STATES=cold` is a depth sweep of the
# disk under one load.
tp_cold() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local gpus
  gpus=$(python3 -c "import torch; print(min(4, torch.cuda.device_count()))")
  models=llama3-8b checkpoints
  log "group loads by $gpus ranks, cold and warm (bench/load/group_cold.py)"
  python3 bench/load/group_cold.py --dir "$ckpts/llama3-8b" --ranks "$gpus" --device cuda \
    --runs "${TP_COLD_RUNS:-3}" --states "${TP_COLD_STATES:-cold,warm}" \
    --threads-per-rank "${TP_COLD_THREADS:-16}" 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
}
