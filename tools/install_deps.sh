#!/usr/bin/env bash
# Installs what ferry's build and tests need on Debian (run as root): compilers, CMake, the
# header and static libraries (nlohmann-json, CLI11, xxHash, GoogleTest), clang for the fuzzer,
# and the Python packages the tests compare with (Hugging Face safetensors, numpy, xxhash, pytest).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ clang libclang-rt-14-dev binutils \
  nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev python3 >/dev/null
python3 -m pip --version >/dev/null 2>&1 || apt-get install -y -qq python3-pip >/dev/null
# Debian's own python3 refuses system-wide pip installs unless told; other pythons ignore this.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
  "safetensors==0.8.0" numpy xxhash pytest
