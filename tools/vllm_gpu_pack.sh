#!/usr/bin/env bash
# Packs vLLM 0.26.0 (it pins torch==2.11.0, the GPU image's) for the GPU machine, which reaches no
# network and takes at most 64 MiB per device call: vLLM's wheel without the binaries offline
# inference with VLLM_ATTENTION_BACKEND=TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0 does not
# load (flash-attention, MoE, deep_gemm, FlashMLA, vllm-rs), plus the wheels the image lacks, as
# one tar.xz split in two halves under .vllm_pack/ (git-ignored). On the GPU
# machine (kept warm between the calls), call 1 carries part 00 and stores it; the last call
# carries the rest and unpacks everything into /tmp/vllm026 (see docs/vllm.md, "GPU run").
set -euo pipefail
cd "$(dirname "$0")/.."
out=.vllm_pack
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out" "$work/wheels" "$work/site"
pip_download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "$@"
}
pip_download -d "$work" "vllm==0.26.0"
# What vLLM 0.26 imports for offline inference that the image (torch 2.11, transformers,
# tokenizers, safetensors, numpy, huggingface_hub, ...) does not have, at the versions its
# wheel's metadata asks for.
pip_download -d "$work/wheels" msgspec pydantic pydantic-core annotated-types typing-inspection \
  pyzmq pybase64 cachetools cbor2 "openai>=2.0.0" "openai-harmony>=0.0.3" sniffio \
  "llguidance>=1.7.0,<1.8.0" "xgrammar>=0.2.1,<1.0.0" "apache-tvm-ffi==0.1.10" \
  "fastapi>=0.133.0,<0.137.0" "starlette>=1.0.1" partial-json-parser distro jiter httpx httpcore \
  h11 anyio blake3 gguf diskcache "lark==1.2.2" interegular "outlines_core==0.2.14" \
  "lm-format-enforcer==0.11.3" "compressed-tensors==0.17.0" "depyf==0.20.0" astor cloudpickle \
  prometheus_client "prometheus-fastapi-instrumentator>=8.0.0" py-cpuinfo psutil setproctitle \
  einops "mistral_common>=1.11.5" pycountry python-json-logger watchfiles ijson
# The peer load formats' packages (fastsafetensors, runai-model-streamer, instanttensor) travel
# in .whl (tools/fetch_gpu_deps.sh), which tools/gpu_check.sh installs into /tmp/site.
python3 -m zipfile -e "$work"/vllm-0.26.0-*.whl "$work/site"
# Kernels offline dense inference with the Triton attention backend does not load.
find "$work/site" \( -name 'vllm_flash_attn' -o -name '_flashmla*' -o -name '_moe_C*' \
  -o -name '*deep_gemm*' -o -name 'fmha_sm100' -o -name '*vllm_rs*' -o -name '*vllm-rs*' -o -name 'flash_attn*' \) \
  -prune -exec rm -rf {} +
echo "largest files left:"
find "$work/site" -type f -printf '%s %P\n' | sort -rn | awk 'NR <= 8 {printf "  %6.1f MiB %s\n", $1/1048576, $2}'
mv "$work/wheels" "$work/site/.wheels"
tar -C "$work/site" -cf - . | xz -T2 -6 > "$work/vllm026.tar.xz"
# Two halves: each leaves room in a call's 64 MiB carry for .deps and .whl (gpu_check.sh).
split -n 2 -d "$work/vllm026.tar.xz" "$out/part-"
{ ls "$out"/part-* | wc -l; sha256sum < "$work/vllm026.tar.xz" | cut -d' ' -f1; } > "$out/parts.txt"
ls -l "$out"
