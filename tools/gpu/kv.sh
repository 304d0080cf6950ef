# The KV block store (stages kv, kvperf, kvdma, kvlayout, kvtier, kvfleet, kvgroups, kvsweep,
# kvbisect) and how the disk serves O_DIRECT by request size (requestsize).
# Sourced by tools/gpu_check.sh, which sets OUT, ferry, ckpts, models, status and log.

# vLLM's paged KV cache of a Llama-3-8B-shaped model (per layer a K and a V page of 16 tokens x
# 8 heads x 128 in bf16: 64 pieces of 32 KiB a block): the layout issue 26 names. Word-split
# where used.
kv_vllm_layout="--layout vllm --layers 32 --block-tokens 16 --kv-heads 8 --head-dim 128"

# Each named test binary of /tmp/build/tests, its log in $OUT, its gtest summary in the summary.
run_test_binaries() {
  local t
  for t in "$@"; do
    /tmp/build/tests/$t >"$OUT/$t.log" 2>&1 || { status=1; grep -B5 -A20 "FAILED\|Failure" "$OUT/$t.log" | head -60; }
    grep -E "^\[ +(PASSED|SKIPPED|FAILED) +\]" "$OUT/$t.log" | sed "s/^/$t: /" | tee -a "$OUT/summary.txt" || true
  done
}

# `ferry kv bench` on cuda:0, staged, one piece of 2 MiB then vLLM's 64 x 32 KiB pages, at each
# of the given blocks per call; $1 names the JSON files ($OUT/$1-one-N.json, $1-vllm-N.json).
kv_one_beside_vllm() {
  local name=$1 batch
  shift
  local common="--device cuda:0 --bytes 1G --rounds 3 --path staged"
  local vllm=$kv_vllm_layout
  mkdir -p /tmp/kvbench
  for batch in "$@"; do
    log "ferry kv bench: one piece of 2 MiB, then vLLM 64 x 32 KiB, $batch blocks per call"
    "$ferry" kv bench /tmp/kvbench $common --sizes 2M --batch $batch \
      --json "$OUT/$name-one-$batch.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
    "$ferry" kv bench /tmp/kvbench $common $vllm --batch $batch \
      --json "$OUT/$name-vllm-$batch.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
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
  log "KV beside torch.save/torch.load and per-file writes (bench/kv/kv_torch_compare.py)"
  python3 bench/kv/kv_torch_compare.py --dir /tmp/kvbench/cmp --device cuda:0 --drop-caches 2>&1 |
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
  run_test_binaries test_gpu_kv_dma test_gpu_checksum test_kv_page_cache test_page_cache_registry test_page_cache_dma
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

kv_stage() {
  kv_tests
  kv_bench_rows
  [ "${1:-}" = perf ] || kv_extras
  kv_crash
}

# The engines' KV layouts (many small per-layer pieces per block): the layout tests on the GPU
# (staged, direct, page-cache DMA; the SIGKILL test with a refilled GPU source), the crash trials
# with refilled sources, then `ferry kv bench` per layout on cuda:0 beside pinned H2D and raw
# O_DIRECT of the same bytes: vLLM (64 x 32 KiB) and one piece of the same size, 1024, 128 and 16
# blocks per call, then vLLM's with page-cache DMA (the other layouts and host memory:
# kv_other_layouts_stage).
kv_layout_stage() {
  log "KV layouts: tests (test_gpu_kv_layouts, test_kv_layouts, test_gpu_kv, test_gpu_kv_dma, test_kv_crash)"
  run_test_binaries test_gpu_kv_layouts test_kv_layouts test_gpu_kv test_gpu_kv_dma test_kv_crash
  local common="--device cuda:0 --bytes 1G --rounds 3 --path staged"
  local vllm=$kv_vllm_layout
  # The store as it opens by default (puts, cold gets O_DIRECT, staged warm gets), one piece and
  # vLLM's pages in the same call; then page-cache DMA for the warm gets (with it on, cold gets
  # read through the page cache, and puts first release the windows over the slots they replace).
  kv_one_beside_vllm kvlayout 1024 128 16
  log "ferry kv bench: vLLM 64 x 32 KiB, 128 blocks per call, page-cache DMA on"
  "$ferry" kv bench /tmp/kvbench $common $vllm --batch 128 --page-cache-pin 8G \
    --json "$OUT/kvlayout-vllm-128-dma.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

# The engines' other layouts and host memory, beside raw O_DIRECT (kvlayout fills a 10-minute
# call with its build; about 3 minutes after `build`).
kv_other_layouts_stage() {
  local common="--device cuda:0 --bytes 1G --rounds 3 --path staged"
  local vllm=$kv_vllm_layout
  mkdir -p /tmp/kvbench
  log "ferry kv bench: vLLM canonical, MLA (61 layers, 64 tokens), SGLang, vLLM fp8 128 layers; 128 blocks per call"
  for l in "--layout vllm-canonical --layers 32" "--layout mla --layers 61 --block-tokens 64" \
           "--layout sglang --layers 32" "--layout vllm --layers 128 --kv-heads 4 --dtype fp8"; do
    "$ferry" kv bench /tmp/kvbench $common $l --batch 128 2>&1 |
      tee -a "$OUT/summary.txt" || status=1
  done
  log "ferry kv bench: host memory, one piece and vLLM's layout (beside raw O_DIRECT)"
  "$ferry" kv bench /tmp/kvbench --device cpu --sizes 2M --batch 128 --bytes 1G --rounds 3 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cpu $vllm --batch 128 --bytes 1G --rounds 3 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

# vLLM's layout at 1,024 and 128 blocks per call, staged: its warm gets in turn with one-piece
# blocks' in every round (`ferry kv bench` does so for any row of several pieces), beside raw
# O_DIRECT. About 3 minutes after `build`.
kv_warm_stage() {
  local vllm=$kv_vllm_layout
  mkdir -p /tmp/kvbench
  local batch
  for batch in 1024 128; do
    log "ferry kv bench: vLLM 64 x 32 KiB, $batch blocks per call, warm gets beside one piece's"
    # shellcheck disable=SC2086  # the layout's words
    "$ferry" kv bench /tmp/kvbench --device cuda:0 --bytes 1G --rounds 3 --path staged $vllm \
      --batch "$batch" --json "$OUT/kvwarm-vllm-$batch.json" 2>&1 | grep -v "ms per pass" |
      tee -a "$OUT/summary.txt" || status=1
  done
  rm -rf /tmp/kvbench
}

# The store's host path beside an equivalent of vLLM's fs tier (a file per block, O_DIRECT, 16
# threads) on this disk, one piece and 64 a block: a stage of its own, as kvlayout fills a call.
# ferry's calls 4 at once, as the ferry tier runs vLLM's jobs (the fs tier's threads never wait
# at a batch's end). About 2 minutes after build.
kv_tier_stage() {
  log "bench/kv/kv_vs_fs_tier.py: ferry beside a vLLM-fs-tier equivalent (file per block, O_DIRECT, 16 threads)"
  mkdir -p /tmp/kvbench
  local pieces
  for pieces in 1 64; do
    python3 bench/kv/kv_vs_fs_tier.py --dir /tmp/kvbench/fs --lib /tmp/build/libferry.so \
      --pieces "$pieces" --inflight 4 2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  rm -rf /tmp/kvbench
}

# How this disk serves O_DIRECT reads by size (about 60 s after build): a 4 GB file of random
# bytes loaded cold onto cuda:0 with reads of 4, 1 and 0.5 MiB (--chunk-mib; unbuffered calls are
# at most 1 MiB, src/platform/file.hpp), three rounds, then the store's host path beside raw
# O_DIRECT (one piece of 2 MiB; vLLM's layout).
request_size_stage() {
  log "cold loads by read size, then the KV host path beside raw O_DIRECT"
  mkdir -p /tmp/reqsize /tmp/kvbench
  python3 - <<'PY'
import json, os, struct
count, size = 40, 96 << 20
header, offset = {}, 0
for i in range(count):
    header[f"t{i}"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
    offset += size
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open("/tmp/reqsize/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    block = os.urandom(size)
    for i in range(count):
        f.write(block[i:] + block[:i])
    f.flush()
    os.fsync(f.fileno())
PY
  local round mib layout
  for round in 1 2 3; do
    for mib in 4 1 0.5; do
      python3 -c "import os; fd = os.open('/tmp/reqsize/model.safetensors', os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)"
      printf "round %s, cold load, reads of %s MiB: " "$round" "$mib" | tee -a "$OUT/summary.txt"
      "$ferry" load /tmp/reqsize --device cuda:0 --io direct --chunk-mib "$mib" 2>&1 |
        grep -E "^loaded" | tee -a "$OUT/summary.txt" || status=1
    done
  done
  local vllm=$kv_vllm_layout
  for layout in "--sizes 2M" "$vllm"; do
    # shellcheck disable=SC2086  # the layout's words
    "$ferry" kv bench /tmp/kvbench --device cpu $layout --batch 128 --bytes 1G --rounds 3 2>&1 |
      grep -v "ms per pass" | tee -a "$OUT/summary.txt" || status=1
  done
  rm -rf /tmp/reqsize /tmp/kvbench
}

# A fleet of writer processes on one namespace (issue 26): the fleet tests, then `ferry kv bench
# --writers 4` (vLLM's layout, 128 blocks per put, 512 MiB per writer) from GPU memory and from host
# memory: 4 writers' aggregate durable put rate beside one writer's alone (target >= 0.9 x) and
# beside raw O_DIRECT writes of the same bytes by one and by 4 processes (the disk's own ratio), a
# 16-key prefix lookup's p50/p99 while they write (each folds in the other writers' journals), a
# reader's cold gets of all their blocks (bit-exact). Then the host path beside raw O_DIRECT of
# the same bytes (put >= 0.9 x raw write, cold get >= 0.9 x raw read) for one piece and vLLM's
# layout. About 4 minutes after build.
kv_fleet_stage() {
  log "KV fleet tests (test_kv_fleet, test_kv_cli)"
  run_test_binaries test_kv_fleet test_kv_cli
  mkdir -p /tmp/kvbench
  local vllm=$kv_vllm_layout
  # Every writer on GPU 0, the writers spread over the GPUs where there are several (writer w on
  # the (w mod n)-th of up to four: a node's engines), and from host memory.
  # KV_FLEET_DEVICES, KV_FLEET_BATCHES (blocks per put, "128"), KV_FLEET_BYTES (a writer's pass)
  # and KV_FLEET_ROUNDS change what it runs.
  local devices=cuda:0 all
  all=$(python3 -c "import torch; n = min(4, torch.cuda.device_count()); print(','.join(f'cuda:{i}' for i in range(n)) if n >= 2 else '')")
  [ -n "$all" ] && devices="cuda:0 $all"
  local batch
  for device in ${KV_FLEET_DEVICES:-$devices cpu}; do
    for batch in ${KV_FLEET_BATCHES:-128}; do
      log "ferry kv bench --writers 4 ($device memory, vLLM's layout, $batch blocks per put)"
      "$ferry" kv bench /tmp/kvbench --device "$device" $vllm --writers 4 --batch "$batch" \
        --bytes "${KV_FLEET_BYTES:-512M}" --rounds "${KV_FLEET_ROUNDS:-3}" \
        --json "$OUT/kv-fleet-${device//[:,]/}-$batch.json" 2>&1 | tee -a "$OUT/summary.txt" ||
        status=1
    done
  done
  [ -n "${KV_FLEET_DEVICES:-}" ] && { rm -rf /tmp/kvbench; return; }
  log "ferry kv bench: host memory beside raw O_DIRECT (one piece of 2 MiB; vLLM's layout)"
  "$ferry" kv bench /tmp/kvbench --device cpu --sizes 2M --batch 128 --bytes 1G --rounds 5 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  "$ferry" kv bench /tmp/kvbench --device cpu $vllm --batch 128 --bytes 1G --rounds 5 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}

# The CLI of each tree carried in .before/ (`git archive --prefix=ferry-NAME/ COMMIT | gzip >
# .before/NAME.tar.gz`, or a patched copy of one), built in /tmp/bisect/build-NAME: a stage of its
# own, so a first call can build them while a second, on the warm machine, measures.
kv_bisect_builds() {
  local tarball name
  for tarball in .before/*.tar.gz; do
    [ -f "$tarball" ] || continue
    name=$(basename "$tarball" .tar.gz)
    [ -x "/tmp/bisect/build-$name/cli/ferry" ] && continue
    log "build ferry_cli at $name"
    rm -rf "/tmp/bisect/$name" && mkdir -p "/tmp/bisect/$name"
    tar -xzf "$tarball" -C "/tmp/bisect/$name" --strip-components=1
    cmake -S "/tmp/bisect/$name" -B "/tmp/bisect/build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFERRY_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
      -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
      -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu >"$OUT/build-$name.log" 2>&1
    ninja -C "/tmp/bisect/build-$name" ferry_cli >>"$OUT/build-$name.log" 2>&1 ||
      { tail -20 "$OUT/build-$name.log"; status=1; }
  done
}

# Each tree of .before/ beside the working tree, in one call on one GPU (kv_bisect_builds first,
# where not built yet): one piece of 2 MiB and vLLM's per-layer pages at 1,024 blocks a call
# (2 GiB: many groups), vLLM's pages at 128 (two groups). Where a change made them slower or
# faster, one call of a few minutes.
kv_bisect_stage() {
  local v=$kv_vllm_layout
  local common="--device cuda:0 --rounds 3 --path staged --sizes 2M"
  local tarball name cli run
  kv_bisect_builds
  mkdir -p /tmp/kvbench
  for tarball in .before/*.tar.gz ""; do
    if [ -n "$tarball" ]; then
      name=$(basename "$tarball" .tar.gz)
      cli="/tmp/bisect/build-$name/cli/ferry"
      [ -x "$cli" ] || continue
    else
      name="working tree"
      cli="$ferry"
    fi
    for run in "--pieces 1 --bytes 2G --batch 1024" "$v --bytes 2G --batch 1024" \
               "$v --bytes 1G --batch 128"; do
      log "ferry kv bench at $name: staged, $run"
      "$cli" kv bench /tmp/kvbench $common $run 2>&1 | grep -v "^layout" |
        tee -a "$OUT/summary.txt" || status=1
    done
  done
  rm -rf /tmp/kvbench
}

# Warm gets of vLLM's layout (64 x 32 KiB) at 1,024 blocks a call under several group shapes
# (KVGpuGroups: bytes, flights, workers each), beside one-piece blocks of the same size, in one
# build: which shape closes the gap to one piece (0.75 x at the default, 128 MiB x 3 on half the
# workers). Each row's JSON keeps its shape; KV_SWEEP_SHAPES="BYTES,FLIGHTS,WORKERS ..." (0
# workers: the default) replaces the list.
kv_sweep_stage() {
  mkdir -p /tmp/kvbench
  local common=(--device cuda:0 --bytes 2G --rounds 3 --path staged --batch 1024)
  log "ferry kv bench: one piece of 2 MiB, 1024 blocks per call"
  "$ferry" kv bench /tmp/kvbench "${common[@]}" --sizes 2M --json "$OUT/kvsweep-one-piece.json" \
    2>&1 | tee -a "$OUT/summary.txt" || status=1
  local shape bytes flights threads
  # About 100 s a shape on an H200, so three fit one call beside the one-piece row: the default,
  # the best of the 2026-11-28 sweep, and the whole call in one group on every worker (the
  # transfer as one piece's, the scatter after it: BENCHMARKS.md). KV_SWEEP_SHAPES for others
  # (that sweep: 128M,3,16 128M,3,5 128M,2,0 256M,3,0 256M,2,16 64M,4,0).
  local shapes="128M,3,0 512M,2,16 2G,1,16"
  for shape in ${KV_SWEEP_SHAPES:-$shapes}; do
    IFS=, read -r bytes flights threads <<<"$shape"
    local flags=()  # "default": ferry's own shapes
    [ "$shape" != default ] && flags=(--group-bytes "$bytes" --group-flights "$flights")
    [ "$shape" != default ] && [ "$threads" != 0 ] && flags+=(--group-threads "$threads")
    log "ferry kv bench: vLLM layout, 1024 blocks per call, groups $bytes x $flights, workers ${threads/#0/default}"
    # shellcheck disable=SC2086  # the layout's words
    "$ferry" kv bench /tmp/kvbench "${common[@]}" $kv_vllm_layout "${flags[@]}" --json "$OUT/kvsweep-vllm-$bytes-$flights-$threads.json" \
      2>&1 | tee -a "$OUT/summary.txt" || status=1
  done
  rm -rf /tmp/kvbench
}

# A GPU batch's groups in flight (a short check after a change there): the GPU KV tests (page-cache
# DMA's too: its windows registered in the background), then vLLM's layout with page-cache DMA at
# 1,024 blocks a call (the first get beside the later ones). kvbisect measures the rest.
kv_groups_stage() {
  run_test_binaries test_gpu_transfer test_gpu_kv_layouts test_gpu_kv test_gpu_kv_dma test_kv_page_cache
  log "ferry kv bench: vLLM 64 x 32 KiB, 1024 blocks per call, page-cache DMA on"
  mkdir -p /tmp/kvbench
  # shellcheck disable=SC2086  # the layout's words
  "$ferry" kv bench /tmp/kvbench --device cuda:0 --bytes 2G --rounds 3 --path staged \
    $kv_vllm_layout --batch 1024 \
    --page-cache-pin 8G --json "$OUT/kvgroups-vllm-1024-dma.json" 2>&1 |
    tee -a "$OUT/summary.txt" || status=1
  rm -rf /tmp/kvbench
}
