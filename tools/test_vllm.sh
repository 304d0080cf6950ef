#!/usr/bin/env bash
# ferry inside the real vLLM (tests/python/test_vllm_*.py): a venv outside the tree
# (FERRY_VLLM_VENV, default /tmp/ferry-vllm-venv) with vllm==0.33.0 for the CPU (made once, reused
# while it holds that vllm), ferry installed into it with `pip install .` (the extension builds for
# the venv's Python; vLLM brings torch 2.14), then pytest. About 4.3 GB downloaded the first time.
#   tools/test_vllm.sh [PYTEST ARGS]   the venv where missing, ferry into it, the tests
#   tools/test_vllm.sh --venv-only     only the venv (tools/test.sh makes it while it compiles)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_VLLM_VENV:-/tmp/ferry-vllm-venv}
base_python=${FERRY_VLLM_PYTHON:-/usr/bin/python3}
export VLLM_TARGET_DEVICE=cpu
if ! "$venv/bin/python" -c 'import sys, vllm; sys.exit(vllm.__version__ != "0.33.0")' 2>/dev/null; then
  echo "== a venv with vllm 0.33.0 at $venv"
  rm -rf "$venv"
  "$base_python" -m venv "$venv"
  # No pip cache: the 4.3 GB of wheels would stay on the disk beside the 9.4 GB venv.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir vllm==0.33.0
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir pytest xxhash
[ "${1:-}" = --venv-only ] && exit 0
# FERRY_WHEEL: a wheel of this tree already built for the venv's Python (tools/test.sh's).
echo "== ferry into $venv (${FERRY_WHEEL:-pip install .})"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "${FERRY_WHEEL:-.}"
echo "== the tests against vllm $("$venv/bin/python" -c 'import vllm; print(vllm.__version__)')"
cd tests/python
"$venv/bin/python" -m pytest -q -p no:cacheprovider test_vllm_*.py "$@"
