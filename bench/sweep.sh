#!/usr/bin/env bash
# Tuning sweep on the GPU machine: reader threads x read size x staging for each checkpoint,
# warm page cache. usage: bench/sweep.sh FERRY_BIN CHECKPOINT_DIR
set -euo pipefail
ferry=$1
dir=$2
for model in qwen3-0.6b llama3-8b; do
  cat "$dir/$model"/* >/dev/null  # warm: the page cache holds the checkpoint
  for cfg in ${CONFIGS:-"16 8 256" "16 4 256" "16 2 64" "8 4 64"}; do
    set -- $cfg
    "$ferry" load "$dir/$model" --device cuda:0 --json --repeat 3 --threads "$1" --chunk-mib "$2" \
      --staging-mib "$3" | python3 -c "
import json, sys
runs = json.load(sys.stdin)
print('$model threads=$1 chunk=$2MiB staging=$3MiB:', ' '.join(
    f\"{r['gigabytes_per_second']:.1f}GB/s({r['seconds']*1e3:.0f}ms,stage {r['staging_seconds']*1e3:.0f}ms)\" for r in runs))"
  done
done
