#!/usr/bin/env bash
# On the GPU machine (device tool), after tools/vllm_gpu_pack.sh here: vLLM 0.26 carried in parts.
#   tools/vllm_gpu_run.sh stash          keeps the carried .vllm_pack/part-* in /tmp/vllm-pack
#   tools/vllm_gpu_run.sh bench [ARGS]   stashes, unpacks vLLM into /tmp/vllm026 once every part
#                                        is there, then runs bench/vllm_gpu.py ARGS with ferry
#                                        from /tmp/site (tools/gpu_check.sh build puts it there)
set -euo pipefail
cd "$(dirname "$0")/.."
stash=/tmp/vllm-pack
site=/tmp/vllm026
mkdir -p "$stash"
for f in .vllm_pack/part-* .vllm_pack/parts.txt; do [ -f "$f" ] && cp "$f" "$stash/"; done
want=$(head -1 "$stash/parts.txt" 2>/dev/null || echo "?")
have=$(ls "$stash"/part-* 2>/dev/null | wc -l)
echo "vLLM 0.26 pack: $have of $want parts in $stash"
[ "${1:-}" = stash ] && exit 0
shift || true
if [ ! -d "$site/vllm" ]; then
  [ "$have" = "$want" ] || { echo "parts missing: carry the rest of .vllm_pack"; exit 1; }
  (cd "$stash" && cat part-* | sha256sum -c <(sed -n 2p parts.txt | sed 's/$/  -/'))
  mkdir -p "$site"
  cat "$stash"/part-* | xz -d | tar -x -C "$site"
fi
export PYTHONPATH=/tmp/site:$site
export VLLM_ATTENTION_BACKEND=TRITON_ATTN VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import vllm, ferry.vllm; print("vllm", vllm.__version__, "with ferry", ferry.__file__)'
python3 bench/vllm_gpu.py "$@"
