#!/usr/bin/env bash
# Installs, builds and runs every test: the sanitizer build (ASan + UBSan), a libFuzzer smoke
# run of the safetensors reader, then the release build's full suite (its summary prints last).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

echo "== sanitizers (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=ON >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j2

echo "== fuzzing the safetensors reader (60 s)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFERRY_FUZZ=ON -DFERRY_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz --target fuzz_safetensors
corpus=$(mktemp -d)
cp fuzz/corpus/* "$corpus"/
build-fuzz/fuzz/fuzz_safetensors -max_total_time=60 -print_final_stats=1 "$corpus" 2>&1 | tail -5
rm -rf "$corpus"

echo "== tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j2
