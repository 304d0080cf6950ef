#!/usr/bin/env bash
# Cross-builds ferry for 64-bit Windows with mingw-w64 (cmake/toolchain-mingw64.cmake): the
# library (ferry.dll), the CLI (ferry.exe) and the Windows test subset, then runs the tests under
# Wine, so the Win32 code paths really execute (host memory: no GPU or DirectStorage under Wine),
# and compares `ferry load --hash` of a checkpoint with non-ASCII name between the Linux and the
# Windows build. Usage: tools/windows_check.sh [LINUX_FERRY_BINARY]. Needs tools/install_deps.sh
# (mingw-w64, Wine); about 4 minutes on 2 cores, most of it compiling.
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
fi
