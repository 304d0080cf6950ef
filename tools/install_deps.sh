#!/usr/bin/env bash
# Installs what ferry's build and tests need on Debian (run as root): compilers, CMake, the
# header and static libraries (nlohmann-json, CLI11, xxHash, GoogleTest), clang for the fuzzer,
# mingw-w64 (posix threads) and Wine for the Windows cross build (tools/windows_check.sh), Go
# (golang-go: the go/ package's tests, with cgo and cross-built for Windows),
# Debian's CPU PyTorch, and the Python packages the tests compare with (Hugging Face
# safetensors, gguf, xxhash, pytest; transformers 4.40, the newest checked with Debian's torch 1.13;
# ml_dtypes for ferry.numpy's BF16/F8/F4; fsspec, which safetensors' own tests use) for Debian's
# python3, which the tests use.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  cmake ninja-build ccache g++ clang libclang-rt-14-dev binutils \
  nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev \
  g++-mingw-w64-x86-64-posix wine64 golang-go \
  python3 python3-dev python3-pip python3-venv python3-numpy python3-torch >/dev/null
# Debian's python3 refuses system-wide pip installs unless told so.
PIP_BREAK_SYSTEM_PACKAGES=1 /usr/bin/python3 -m pip install -q --disable-pip-version-check \
  --root-user-action=ignore "safetensors==0.8.0" "gguf==0.19.0" xxhash pytest \
  "transformers==4.40.2" \
  nvidia-cufile  # only its cufile.h: the build checks ferry's cuFile declarations against it
# ml_dtypes' newest releases want numpy 2, which Debian's torch cannot use: keep Debian's numpy.
PIP_BREAK_SYSTEM_PACKAGES=1 /usr/bin/python3 -m pip install -q --disable-pip-version-check \
  --root-user-action=ignore ml_dtypes fsspec \
  "numpy==$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')"
