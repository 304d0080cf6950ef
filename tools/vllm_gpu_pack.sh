#!/usr/bin/env bash
# Packs vLLM 0.26.0 (it pins torch==2.11.0, the GPU image's) for the GPU machine, which reaches no
# network and takes at most 64 MiB per device call: vLLM's wheel without the binaries offline
# inference with VLLM_ATTENTION_BACKEND=TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0 does not
# load (flash-attention, MoE, deep_gemm, FlashMLA, vllm-rs binaries), plus the wheels the image lacks, as
# one tar.xz split in parts of at most 42 MiB under .vllm_pack/ (git-ignored). On the GPU
# machine (kept warm between the calls), one call per part but the last stores it; the last call
# carries the last part and unpacks everything into /tmp/vllm026 (see docs/vllm.md, "GPU run").
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
# What vLLM 0.26 needs that the image (torch 2.11, transformers, tokenizers, safetensors, numpy,
# numba, huggingface_hub, ...) lacks: the closure of its wheel's requirements less the image's
# packages (resolved against the image's `pip list`, 2026-11-27), at the versions it asks for.
# Left out, as offline dense inference with Triton attention does not import them: flashinfer,
# cutlass-dsl, tilelang, tokenspeed-triton, pynvvideocodec, torchcodec, z3-solver, cudnn-frontend.
# xgrammar 0.2.7: 0.2.8 calls tvm-ffi's load_lib_module(extra_lib_paths=), which the
# apache-tvm-ffi 0.1.10 vLLM pins lacks (vLLM's engine fails at start on the GPU machine).
pip_download -d "$work/wheels" msgspec pydantic pydantic-core pydantic-extra-types annotated-types \
  typing-inspection pyzmq pybase64 cachetools cbor2 "openai>=2.0.0" httpx2 httpcore2 \
  "openai-harmony>=0.0.3" sniffio "llguidance>=1.7.0,<1.8.0" "xgrammar==0.2.7" \
  "apache-tvm-ffi==0.1.10" "fastapi>=0.133.0,<0.137.0" "starlette>=1.0.1" sse-starlette uvicorn \
  python-multipart partial-json-parser distro jiter httpx httpcore h11 anyio blake3 gguf diskcache \
  "lark==1.2.2" interegular "outlines_core==0.2.14" "lm-format-enforcer==0.11.3" \
  "compressed-tensors==0.17.0" "depyf==0.20.0" astor dill cloudpickle prometheus_client \
  "prometheus-fastapi-instrumentator>=8.0.0" py-cpuinfo psutil setproctitle einops \
  "mistral_common>=1.11.5" pycountry python-json-logger watchfiles ijson jmespath jsonschema \
  jsonschema-specifications referencing rpds-py loguru mcp mcp-types docstring-parser \
  model-hosting-container-standards nvtx pyelftools pyjwt truststore torch-c-dlpack-ext cuda-tile \
  quack-kernels tokenspeed-mla humming-kernels supervisor opentelemetry-api opentelemetry-sdk \
  opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai opentelemetry-proto \
  opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-common \
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http \
  opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common googleapis-common-protos
# The peer load formats' packages (fastsafetensors, runai-model-streamer, instanttensor) travel
# in .whl (tools/fetch_gpu_deps.sh), which tools/gpu_check.sh installs into /tmp/site.
python3 -m zipfile -e "$work"/vllm-0.26.0-*.whl "$work/site"
# Kernels offline dense inference with the Triton attention backend does not load (binaries
# only: the Python modules beside them are imported regardless). vllm_flash_attn must import on
# CUDA, so FlashAttention 3 (Hopper's) stays and FlashAttention 2 goes.
find "$work/site/vllm" \( -name '_vllm_fa2_C*.so' -o -name '_flashmla*.so' -o -name '_moe_C*.so' \
  -o -path '*/third_party/deep_gemm' -o -path '*/third_party/fmha_sm100' -o -name 'vllm-rs' \) \
  -prune -exec rm -rf {} +
echo "largest files left:"
find "$work/site" -type f -printf '%s %P\n' | sort -rn | awk 'NR <= 8 {printf "  %6.1f MiB %s\n", $1/1048576, $2}'
# Unpacked beside vLLM, so xz packs their files (far smaller than the zipped wheels) and the GPU
# machine needs no pip: the folder goes on PYTHONPATH.
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
tar -C "$work/site" -cf - . | xz -T2 -6 > "$work/vllm026.tar.xz"
# Parts of at most 42 MiB: each leaves room in a call's 64 MiB carry for .deps and .whl.
split -b 42M -d "$work/vllm026.tar.xz" "$out/part-"
{ ls "$out"/part-* | wc -l; sha256sum < "$work/vllm026.tar.xz" | cut -d' ' -f1; } > "$out/parts.txt"
ls -l "$out"
