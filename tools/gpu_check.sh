#!/usr/bin/env bash
# Everything that needs the GPU machine, in one call (device tool):
#   builds ferry there, runs every test (GPU ones included), compares `ferry load --hash` on
#   cuda:0 with cpu, and runs the benchmark. Full logs go to $OUT; a short table prints last.
# Carry: .deps and .whl, made here by tools/fetch_gpu_deps.sh (Debian .debs of the build's
#   header/static dependencies, and Python wheels:
#   xxhash, pytest and its needs, scikit-build-core, pathspec, nanobind, gguf).
#   usage (from the repo root, on the GPU machine): tools/gpu_check.sh [STAGE ...]
#   stages: build, tests, bench (default: all three). A warm machine keeps /tmp/build and
#   /tmp/ckpts between calls, so `tests` and `bench` may go in separate calls when one call's
#   time is capped.
set -euo pipefail
OUT=${OUT:-/tmp/ferry-out}
mkdir -p "$OUT"
stages=" ${*:-build tests bench} "
want() { [[ "$stages" == *" $1 "* ]]; }
root=$PWD
# cuFile's configuration for the tests: compatibility mode allowed (this machine has no
# nvidia-fs), logs out of the working tree.
export CUFILE_ENV_PATH_JSON=$root/tests/data/cufile.json
# This VM runs no udev, and cuFile refuses to register files whose block device has no udev
# attributes (ferry's error says so). Give the disk under /tmp the entry udev would write.
dev=$(python3 -c "import os; d = os.stat('/tmp').st_dev; print(f'{os.major(d)}:{os.minor(d)}')")
if [ ! -e "/run/udev/data/b$dev" ]; then
  mkdir -p /run/udev/data
  printf 'I:1\nE:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" \
    >"/run/udev/data/b$dev"
fi
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# Build dependencies: the same Debian packages CI installs, unpacked into a private prefix.
mkdir -p /tmp/deps
for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi

ferry=/tmp/build/cli/ferry
status=0
if want build; then
log "build"
cmake -S . -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
  -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu \
  >"$OUT/build.log" 2>&1
ninja -C /tmp/build >>"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }

log "doctor"
"$ferry" doctor /tmp | tee -a "$OUT/summary.txt"

log "python package (pip install .)"
CMAKE_PREFIX_PATH=/tmp/deps/usr CMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
  CMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu \
  python3 -m pip install --no-build-isolation --no-deps --no-index --target /tmp/site . \
  >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; status=1; }
fi

ckpts=/tmp/ckpts
if want tests; then
log "tests"
# A failing test is reported (and fails the script at the end) without stopping the benchmark.
(cd /tmp/build && ctest --output-on-failure -j4 >"$OUT/ctest.log" 2>&1) || { status=1; grep -A30 "FAILED\|Failure" "$OUT/ctest.log" | head -80; }
tail -3 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
grep -E "Gpu\." "$OUT/ctest.log" | tee -a "$OUT/summary.txt" || true

log "checkpoints"
ckpts=/tmp/ckpts
models="qwen3-0.6b llama3-8b"
quick=
(cd bench && python3 make_checkpoints.py "$ckpts" $models) | tee -a "$OUT/summary.txt"
gguf_args=()
if [ "$quick" != "--quick" ]; then
  mkdir -p "$ckpts/gguf" && (cd bench && python3 make_gguf.py "$ckpts/gguf/llama3-8b-f16.gguf") | tee -a "$OUT/summary.txt"
  "$ferry" load "$ckpts/gguf/llama3-8b-f16.gguf" --device cuda:0 --hash >/tmp/gguf-cuda.txt 2>/dev/null
  "$ferry" load "$ckpts/gguf/llama3-8b-f16.gguf" --device cpu --hash >/tmp/gguf-cpu.txt 2>/dev/null
  cmp -s /tmp/gguf-cuda.txt /tmp/gguf-cpu.txt && echo "gguf: cuda:0 --hash identical to cpu ($(wc -l </tmp/gguf-cpu.txt) tensors)" | tee -a "$OUT/summary.txt" || { echo "gguf: DIFFERENT"; status=1; }
  gguf_args=(--gguf "$ckpts/gguf/llama3-8b-f16.gguf")
fi

log "cuda:0 --hash equals cpu --hash"
hashes=/tmp/hashes
mkdir -p $hashes
for m in $models; do
  "$ferry" load "$ckpts/$m" --device cuda:0 --hash >"$hashes/cuda-$m.txt" 2>/dev/null
  "$ferry" load "$ckpts/$m" --device cpu --hash >"$hashes/cpu-$m.txt" 2>/dev/null
  if cmp -s "$hashes/cuda-$m.txt" "$hashes/cpu-$m.txt"; then
    echo "$m: identical ($(wc -l <"$hashes/cuda-$m.txt") tensors)" | tee -a "$OUT/summary.txt"
  else
    echo "$m: DIFFERENT" | tee -a "$OUT/summary.txt"; diff "$hashes/cuda-$m.txt" "$hashes/cpu-$m.txt" | head; status=1
  fi
done
for m in $models; do
  "$ferry" load "$ckpts/$m" --device cuda:0 --backend cufile --allow-compat --hash \
    >"$hashes/cufile-$m.txt" 2>"$hashes/cufile-$m.log" || { cat "$hashes/cufile-$m.log"; status=1; }
  if cmp -s "$hashes/cufile-$m.txt" "$hashes/cpu-$m.txt"; then
    echo "$m: --backend cufile identical to cpu ($(grep -o 'cufile-[a-z]*' "$hashes/cufile-$m.log" | sort -u | tr '\n' ' '))" | tee -a "$OUT/summary.txt"
  else
    echo "$m: --backend cufile DIFFERENT from cpu" | tee -a "$OUT/summary.txt"; status=1
  fi
done
log "backend choice"
"$ferry" load "$ckpts/qwen3-0.6b" --device cuda:0 --backend cufile 2>&1 | tee -a "$OUT/summary.txt" || true
"$ferry" load "$ckpts/qwen3-0.6b" --device cuda:0 | grep "^path" | tee -a "$OUT/summary.txt"
python3 - "$ckpts/qwen3-0.6b" "$hashes/cpu-qwen3-0.6b.txt" <<'PY' | tee -a "$OUT/summary.txt" || status=1
# ferry's digests equal those of the bytes safetensors itself returns.
import sys, torch, xxhash
from safetensors import safe_open
want = {l.split("\t")[0]: l.split("\t")[3].strip() for l in open(sys.argv[2])}
with safe_open(sys.argv[1] + "/model.safetensors", framework="pt") as f:
    bad = [k for k in f.keys() if xxhash.xxh3_64_hexdigest(f.get_tensor(k).contiguous().view(-1).view(torch.uint8).numpy().tobytes()) != want[k]]
print(f"qwen3-0.6b vs safetensors.safe_open: {len(want) - len(bad)}/{len(want)} tensors equal")
sys.exit(1 if bad else 0)
PY

log "doctor on the 8B checkpoint"
[ -d "$ckpts/llama3-8b" ] && "$ferry" doctor "$ckpts/llama3-8b" --read-limit-gib 4 | tee -a "$OUT/summary.txt"

fi
if want bench; then
log "benchmark"
cold=--cold
[ "$quick" = "--quick" ] && cold=
(cd bench && python3 run_bench.py --ferry "$ferry" --dir "$ckpts" --out "$OUT" --runs 5 $cold --models $models "${gguf_args[@]}") \
  2>&1 | tee "$OUT/bench.txt"
fi
exit $status
