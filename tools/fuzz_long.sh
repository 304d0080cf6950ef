#!/usr/bin/env bash
# Nightly-length fuzzing: every libFuzzer target (fuzz/fuzz_*.cpp) for SECONDS each (default
# 3600), on all cores, from a corpus kept between runs. CI runs each for 60 s (tools/test.sh).
#   tools/fuzz_long.sh [SECONDS] [CORPUS_ROOT]
# CORPUS_ROOT (default build-fuzz/corpus) keeps one directory per target, grown run after run;
# the seeds in fuzz/ are read but never written. A crash leaves its input as
# CORPUS_ROOT/TARGET/crash-* and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-3600}
corpus_root=${2:-build-fuzz/corpus}
jobs=$(nproc)

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFERRY_FUZZ=ON -DFERRY_BUILD_TESTS=OFF >/dev/null
targets=()
for source in fuzz/fuzz_*.cpp; do
  name=$(basename "$source" .cpp)
  targets+=("$name")
done
cmake --build build-fuzz --target "${targets[@]}"

failed=0
for target in "${targets[@]}"; do
  kind=${target#fuzz_}
  seeds=fuzz/corpus
  [ "$kind" != safetensors ] && seeds=fuzz/corpus_$kind
  corpus=$corpus_root/$kind
  mkdir -p "$corpus"
  echo "== $target: $seconds s on $jobs jobs, corpus $corpus"
  # -fork keeps going past one crash and uses every core; each crash is saved and reported.
  if ! build-fuzz/fuzz/$target -fork="$jobs" -ignore_crashes=1 -max_total_time="$seconds" \
      -print_final_stats=1 -artifact_prefix="$corpus/" "$corpus" "$seeds" 2>&1 | tail -5; then
    failed=1
  fi
  if compgen -G "$corpus/crash-*" >/dev/null || compgen -G "$corpus/leak-*" >/dev/null ||
     compgen -G "$corpus/timeout-*" >/dev/null || compgen -G "$corpus/oom-*" >/dev/null; then
    echo "$target: inputs that failed are in $corpus (crash-*, leak-*, timeout-*, oom-*)"
    failed=1
  fi
done
exit $failed
