#!/usr/bin/env bash
# Cross-builds ferry for 64-bit Windows with mingw-w64 (cmake/toolchain-mingw64.cmake): the
# library (ferry.dll), the CLI (ferry.exe) and the Windows test subset, then runs the tests under
# Wine, so the Win32 code paths really execute (host memory: no GPU under Wine; DirectStorage
# through a stand-in runtime, tests/fake_dstorage, as Microsoft's cannot start there), and compares
# `ferry load --hash` of a checkpoint with non-ASCII name between the Linux and the Windows build.
# Usage: tools/windows_check.sh [LINUX_FERRY_BINARY]. Needs tools/install_deps.sh (mingw-w64,
# Wine); about 4 minutes on 2 cores, most of it compiling.
# FERRY_WINE_DSTORAGE=1 also tries Microsoft's DirectStorage runtime under Wine: it downloads the
# dstorage-gpu wheel from PyPI (which ships dstorage.dll and dstoragecore.dll; nothing is kept in
# the repository), puts the DLLs beside a copy of ferry.exe and runs a DirectStorage load,
# reporting what happened. Wine 8.0 cannot start that runtime (it lacks the I/O ring API that
# dstoragecore.dll calls), so this is an experiment that reports, not a test that gates.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_WINDOWS_BUILD:-build-mingw}
linux_ferry=${1:-}
wine=$(command -v wine64 || command -v wine || echo /usr/lib/wine/wine64)
export WINEDEBUG=-all WINEPREFIX=${WINEPREFIX:-$PWD/$build/wineprefix}

# -O1: under Wine the tests check behaviour, not speed, and it halves the compile time.
cmake -S . -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-mingw64.cmake \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_C_FLAGS_RELEASE=-O1 >/dev/null
cmake --build "$build"
"$wine" wineboot --init >/dev/null 2>&1 || true  # make the prefix once, outside the timings
ctest --test-dir "$build" --output-on-failure -j2

# DirectStorage into GPU memory needs nvcuda.dll, a D3D12 device on the CUDA GPU's adapter and
# CUDA's external memory: none exists under Wine, so `ferry doctor` must name the step of the
# D3D12 -> CUDA bridge that fails and the piece that is missing.
"$wine" "$build/bin/ferry.exe" doctor 2>/dev/null | tr -d '\r' > "$build/doctor.txt"
if ! grep -q "DirectStorage into cuda:0: .*step 1 of 11 .*nvcuda.dll" "$build/doctor.txt"; then
  echo "windows_check: ferry doctor does not name the DirectStorage bridge's failing step:" >&2
  cat "$build/doctor.txt" >&2
  exit 1
fi
echo "windows_check: ferry doctor names the DirectStorage bridge's missing step (nvcuda.dll)"
# Its storage facts for a path: each an allowed value and a reason (Wine answers few of the
# questions: "unknown: " and the call that failed is the honest answer there).
"$wine" "$build/bin/ferry.exe" doctor tests/data --json --read-limit-gib 0.001 2>/dev/null \
  | tr -d '\r' > "$build/doctor.json"
/usr/bin/python3 - "$build/doctor.json" <<'PY'
import json, re, sys
path = json.load(open(sys.argv[1]))["path"]
storage, unbuffered = path["storage"], path["odirect"]
checks = [(re.fullmatch(r"(yes|no|unknown): .+", storage["nvme"]), "nvme", storage["nvme"]),
          (re.fullmatch(r"(on|off|unknown): .+", storage["bypass_io"]), "bypass_io",
           storage["bypass_io"]),
          (unbuffered["flag"] == "FILE_FLAG_NO_BUFFERING", "odirect.flag", unbuffered["flag"]),
          # Windows cannot report page-cache residency: unknown (null), never a made-up 0.
          (path["page_cache_fraction"] is None, "page_cache_fraction", path["page_cache_fraction"])]
for ok, name, value in checks:
    if not ok:
        sys.exit(f"windows_check: ferry doctor's {name} is not an allowed value and a reason: {value}")
    print(f"windows_check: ferry doctor: {name} = {value}")
PY

# `ferry kv bench` at tiny sizes: the KV store and its raw baselines through the Win32 seam (its
# figures under Wine mean nothing; it must run and finish). It used to stall in some runs (its
# threads met at a std::barrier, which loses wake-ups in this build: platform/thread_barrier.hpp),
# so it runs five times, each bounded: a stall fails the check.
kv_root=$(mktemp -d)
for run in 1 2 3 4 5; do
  if ! timeout 120 "$wine" "$build/bin/ferry.exe" kv bench "$kv_root/kv-$run" --sizes 4K,64K \
      --bytes 1M >/dev/null; then
    echo "windows_check: ferry kv bench under Wine failed or stalled (run $run of 5)" >&2
    exit 1
  fi
done
rm -rf "$kv_root"
echo "windows_check: ferry kv bench runs (5 runs)"
# std::barrier, std::latch and the semaphores wait through libstdc++'s atomic wait, which loses
# wake-ups without a futex (mingw-w64's GCC 12): none may come back into the library or the CLI.
if grep -rnE 'std::(barrier|latch|counting_semaphore|binary_semaphore)\b|#include <(barrier|latch|semaphore)>' \
    src cli include | grep -vE '^[^:]+:[0-9]+: *//'; then
  echo "windows_check: these lose wake-ups in the Windows build: use platform/thread_barrier.hpp" \
    "or a mutex and condition variable" >&2
  exit 1
fi

# The Go package (go/) built for Windows without cgo (syscall.LoadDLL): its tests run beside
# ferry.dll and compare their digests with ferry.exe's `load --hash`, all under Wine.
if command -v go >/dev/null; then
  bin_dir=$(cd "$build/bin" && pwd)
  (cd go && GOOS=windows GOARCH=amd64 CGO_ENABLED=0 go test -c -o "$bin_dir/ferry_go_test.exe" .)
  ferry_exe=$("$wine" winepath -w "$bin_dir/ferry.exe" 2>/dev/null | tr -d '\r')
  (cd "$build/bin" && FERRY_BIN="$ferry_exe" "$wine" ./ferry_go_test.exe -test.v 2>&1 | tr -d '\r' \
    > ../go_test.txt) || { cat "$build/go_test.txt" >&2; exit 1; }
  grep -q '^PASS$' "$build/go_test.txt" && grep -q -- '--- PASS: TestGGUFTensorsAndDigestsMatchCLI' \
    "$build/go_test.txt" || { cat "$build/go_test.txt" >&2; exit 1; }
  echo "windows_check: the Go package's tests pass under Wine (ferry.dll through syscall.LoadDLL)"
else
  echo "windows_check: go not found: the Go package's Windows tests did not run"
fi

# The Windows CLI on a checkpoint whose name is not ASCII and whose data holds CR LF and 0x1A:
# the digests must equal the Linux build's, byte for byte.
if [ -n "$linux_ferry" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  model="$scratch/modèle-模型.safetensors"
  /usr/bin/python3 - "$model" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
trap = np.frombuffer(bytes([13, 10, 26, 10, 13, 13, 10, 26]) * 70001, dtype=np.uint8).copy()
save_file({"crlf": trap, "w": np.arange(300000, dtype=np.float32).reshape(600, 500)}, sys.argv[1])
PY
  "$linux_ferry" load "$model" --device cpu --hash > "$scratch/linux.txt"
  for io in buffered direct auto; do
    "$wine" "$build/bin/ferry.exe" load "$model" --device cpu --io $io --hash 2>/dev/null \
      | tr -d '\r' > "$scratch/windows-$io.txt"
    diff "$scratch/linux.txt" "$scratch/windows-$io.txt"
  done
  echo "windows_check: ferry.exe --hash (buffered, direct, auto) equals the Linux build's"
  # doctor on that file: its name comes back intact, its storage facts well formed.
  "$wine" "$build/bin/ferry.exe" doctor "$model" --json --read-limit-gib 0.001 2>/dev/null \
    | tr -d '\r' > "$scratch/doctor.json"
  /usr/bin/python3 - "$scratch/doctor.json" <<'PY'
import json, re, sys
path = json.load(open(sys.argv[1], encoding="utf-8"))["path"]
assert path["path"].endswith("modèle-模型.safetensors"), path["path"]
assert re.fullmatch(r"(yes|no|unknown): .+", path["storage"]["nvme"]), path["storage"]
assert re.fullmatch(r"(on|off|unknown): .+", path["storage"]["bypass_io"]), path["storage"]
PY
  echo "windows_check: ferry.exe doctor on the non-ASCII file names it and reports its storage"
  # The DirectStorage backend's host path, through the stand-in runtime (tests/fake_dstorage):
  # ferry.exe looks for dstorage.dll beside itself, so a copy goes beside the fake.
  cp "$build/bin/ferry.exe" "$build/bin/fake-dstorage/ferry.exe"
  "$wine" "$build/bin/fake-dstorage/ferry.exe" load "$model" --device cpu --backend directstorage \
    --hash 2>/dev/null | tr -d '\r' > "$scratch/windows-directstorage.txt"
  diff "$scratch/linux.txt" "$scratch/windows-directstorage.txt"
  echo "windows_check: ferry.exe --backend directstorage (stand-in runtime) equals the Linux build's"
  # ... and into cuda:0 through the D3D12 -> CUDA bridge, every library a stand-in
  # (tests/fake_gpu; Wine told to take the native d3d12.dll and dxgi.dll).
  cp "$build/bin/ferry.exe" "$build/bin/fake-gpu/ferry.exe"
  WINEDLLOVERRIDES="d3d12,dxgi=n" "$wine" "$build/bin/fake-gpu/ferry.exe" load "$model" \
    --device cuda:0 --backend directstorage --hash 2>/dev/null | tr -d '\r' \
    > "$scratch/windows-bridge.txt"
  diff "$scratch/linux.txt" "$scratch/windows-bridge.txt"
  echo "windows_check: ferry.exe --device cuda:0 --backend directstorage (stand-ins) equals it too"
fi

if [ "${FERRY_WINE_DSTORAGE:-0}" = 1 ]; then
  experiment="$build/dstorage-experiment"
  rm -rf "$experiment" && mkdir -p "$experiment/wheel"
  /usr/bin/python3 -m pip download -q dstorage-gpu --platform win_amd64 --python-version 3.12 \
    --only-binary=:all: --no-deps -d "$experiment/wheel"
  /usr/bin/python3 -c 'import sys, zipfile, glob, os
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
for n in z.namelist():
    if n.endswith(".dll"):
        open(os.path.join(sys.argv[2], os.path.basename(n)), "wb").write(z.read(n))' \
    "$experiment/wheel" "$experiment"
  cp "$build/bin/ferry.exe" "$experiment/"
  echo "windows_check: a DirectStorage load under Wine, with Microsoft's runtime beside ferry.exe:"
  set +e
  "$wine" "$experiment/ferry.exe" load tests/data/tiny_crlf.safetensors --device cpu \
    --backend directstorage --hash > "$experiment/out.txt" 2>&1
  status=$?
  set -e
  if grep -q 'Unhandled exception: 0xc06d007f' "$experiment/out.txt"; then
    echo "  the runtime died inside DirectStorage's start-up: a delay-loaded function is missing"
    echo "  (0xc06d007f; under Wine 8.0: api-ms-win-core-ioring-l1-1-0.dll!QueryIoRingCapabilities)"
  else
    head -8 "$experiment/out.txt"
    echo "  exit status $status"
  fi
  echo "windows_check: (DirectStorage under Wine is reported, not required)"
fi
