#!/usr/bin/env bash
# How the GPU machine's disk serves O_DIRECT reads by request size, in one short device call
# (about 110 s; carry .deps): builds the CLI, writes a 4 GB safetensors file of random bytes,
# loads it cold onto cuda:0 with reads of 4, 1 and 0.5 MiB (--chunk-mib), three rounds, then
# the KV store's host path beside raw O_DIRECT (one piece of 2 MiB; vLLM's layout).
# BENCHMARKS.md (2026-12-05, fourth) has its figures.
set -euo pipefail
out=${OUT:-/tmp/ferry-out}
mkdir -p "$out" /tmp/deps /tmp/ck /tmp/kvb
for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
cmake -S . -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
  -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include \
  -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu >"$out/build.log" 2>&1
ninja -C /tmp/build ferry_cli >>"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
ferry=/tmp/build/cli/ferry

python3 - <<'PY'
import json, os, struct
count, size = 40, 96 << 20
header, offset = {}, 0
for i in range(count):
    header[f"t{i}"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
    offset += size
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open("/tmp/ck/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    block = os.urandom(size)
    for i in range(count):
        f.write(block[i:] + block[:i])
    f.flush()
    os.fsync(f.fileno())
PY
drop() {
  python3 -c "import os; fd = os.open('/tmp/ck/model.safetensors', os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)"
}
for round in 1 2 3; do
  for mib in 4 1 0.5; do
    drop
    printf "round %s, cold load, reads of %s MiB: " "$round" "$mib"
    "$ferry" load /tmp/ck --device cuda:0 --io direct --chunk-mib "$mib" 2>&1 | grep -E "^loaded"
  done
done
vllm="--layout vllm --layers 32 --block-tokens 16 --kv-heads 8 --head-dim 128"
for layout in "--sizes 2M" "$vllm"; do
  # shellcheck disable=SC2086  # the layout's words
  "$ferry" kv bench /tmp/kvb --device cpu $layout --batch 128 --bytes 1G --rounds 3 2>&1 |
    grep -v "ms per pass"
done
rm -rf /tmp/ck /tmp/kvb
