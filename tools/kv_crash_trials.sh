#!/usr/bin/env bash
# The KV store's crash-consistency trials at full length: a writer child SIGKILLed at a random
# point, the store reopened and every key checked (tests/test_kv_crash.cpp). CI runs 50.
#   tools/kv_crash_trials.sh [TRIALS=1000] [BUILD_DIR=build]
set -euo pipefail
trials=${1:-1000}
build=${2:-build}
cmake --build "$build" --target test_kv_crash
FERRY_KV_CRASH_TRIALS=$trials "$build"/tests/test_kv_crash --gtest_brief=1
