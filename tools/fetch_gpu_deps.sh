#!/usr/bin/env bash
# Fetches, on this (networked) machine, what tools/gpu_check.sh needs on the GPU machine, which
# reaches no network: Debian .debs of the build's header/static libraries into .deps/, and
# Python 3.12 wheels into .whl/. Both folders are git-ignored; name them in the device tool's
# `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps .whl
(cd .deps && apt-get download nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl xxhash pytest pluggy iniconfig "scikit-build-core==1.1.2" pathspec "nanobind==3.1.0" \
  "gguf==0.19.0"
# Peers the benchmark compares with (their other needs are already on the GPU machine).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "fastsafetensors==0.5.0" "runai-model-streamer==0.16.1"
# InstantTensor (bench/load/first_load.py's strongest peer): its wheel names manylinux_2_27/2_28 only;
# it needs nothing beyond torch, which the GPU machine has.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl "instanttensor==0.2.2"
