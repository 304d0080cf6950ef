#!/usr/bin/env bash
# Installs, builds and runs every test: the sanitizer build (ASan + UBSan), libFuzzer smoke
# runs of the readers, the Python package (pip install .), then the release build's full suite
# (its summary prints last). Python tests run on Debian's python3, which has PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
python=/usr/bin/python3
cufile_include=$($python -c 'import importlib.util as u; print(u.find_spec("nvidia").submodule_search_locations[0])')/cu13/include
# One compiler cache in the clone (build-ccache/) for every build below. The wheel's engine and
# command are compiled as the release build's are (same build type, a build folder as deep as
# build/, paths made relative to the clone, the folder left out of the hash), so the release
# build takes them from the cache instead of compiling them a second time.
export CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache} CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1

# The disk is shared with whatever else the machine runs, and a full one fails tests far from the
# cause (a CI run lost two Windows tests to "Disk full"): each stage says how much is left, and
# the builds nothing later reads are removed once their tests passed (FERRY_KEEP_BUILDS=1 keeps
# them for incremental rebuilds).
free_space() { echo "   (free: $(df -h --output=avail . | tail -1 | tr -d ' ') here, $(df -h --output=avail /tmp | tail -1 | tr -d ' ') in /tmp)"; }
drop_build() { [ -n "${FERRY_KEEP_BUILDS:-}" ] || rm -rf "$1"; free_space; }
free_space

# vLLM's venv (4.3 GB from PyPI) downloads while the builds below compile; its tests wait for it.
mkdir -p build-logs
tools/test_vllm.sh --venv-only >build-logs/vllm-venv.log 2>&1 &
vllm_venv=$!

echo "== sanitizers (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=ON \
  -DPython3_EXECUTABLE=$python >/dev/null
cmake --build build-asan
# The Python package's tests load the extension into an uninstrumented interpreter: not here.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 FERRY_SKIP_PACKAGE_TESTS=1 \
  ctest --test-dir build-asan --output-on-failure -j2
drop_build build-asan

echo "== ThreadSanitizer: the transfer core's tests, the KV store's lifetime under close and callbacks, its background registration of page-cache windows"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$python \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -Wno-error=tsan" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan --target test_transfer test_transfer_pipeline test_engine test_kv_lifetime \
  test_window_registrar
# test_transfer forks children after threads ran; TSan checks the parent's threads.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/test_transfer
TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_transfer_pipeline
TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_engine
TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_kv_lifetime
TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_window_registrar
drop_build build-tsan

echo "== fuzzing the safetensors, GGUF, index and KV journal readers (30 s each; tools/fuzz_long.sh: longer)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz-smoke -G Ninja -DFERRY_FUZZ=ON -DFERRY_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz-smoke --target fuzz_safetensors fuzz_gguf fuzz_index fuzz_kv_journal
for target in safetensors gguf index kv_journal; do
  corpus=$(mktemp -d)
  seeds=fuzz/corpus
  [ $target != safetensors ] && seeds=fuzz/corpus_$target
  seconds=30
  cp "$seeds"/* "$corpus"/
  build-fuzz-smoke/fuzz/fuzz_$target -max_total_time=$seconds -print_final_stats=1 \
    -artifact_prefix="$corpus/" "$corpus" 2>&1 | tail -3
  rm -rf "$corpus"
done
drop_build build-fuzz-smoke  # not build-fuzz: tools/fuzz_long.sh grows its corpus there

echo "== the Python package"
# Built once as a wheel: tools/test_vllm.sh installs the same one into vLLM's venv.
rm -rf build/wheel
# CC and CXX as CMake picks them for build/ (scikit-build-core would take Python's
# x86_64-linux-gnu-g++, and ccache hashes the compiler's name).
CC=cc CXX=c++ $python -m pip wheel -q --no-deps -w build/wheel --config-settings=build-dir=build-wheel \
  --config-settings=cmake.build-type=RelWithDebInfo \
  --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache \
  --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache .
PIP_BREAK_SYSTEM_PACKAGES=1 $python -m pip install -q --root-user-action=ignore --force-reinstall \
  --no-deps build/wheel/ferry_tensors-*.whl

echo "== tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$python \
  -DFERRY_CUFILE_INCLUDE_DIR="$cufile_include" -DCMAKE_C_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build build

echo "== Windows: mingw-w64 cross build, its tests under Wine, --hash equal to this build's"
tools/windows_check.sh build/cli/ferry
free_space

echo "== ferry inside the real vLLM 0.33 (CPU venv outside the tree; tools/test_vllm.sh)"
wait $vllm_venv || { cat build-logs/vllm-venv.log; exit 1; }
FERRY_WHEEL=$(ls build/wheel/ferry_tensors-*.whl) tools/test_vllm.sh

echo "== tests"
ctest --test-dir build --output-on-failure -j2
