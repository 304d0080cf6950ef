#!/usr/bin/env bash
# The KV store's crash-consistency trials at full length: a writer child SIGKILLed at a random
# point, the store reopened and every key checked (tests/test_kv_crash.cpp). CI runs 50.
# Then the fleet's trials (a tenth as many).
#   tools/kv_crash_trials.sh [TRIALS=1000] [BUILD_DIR=build]
set -euo pipefail
trials=${1:-1000}
build=${2:-build}
cmake --build "$build" --target test_kv_crash test_kv_fleet
FERRY_KV_CRASH_TRIALS=$trials "$build"/tests/test_kv_crash --gtest_brief=1
# A fleet: three writer processes and two readers on one namespace, one writer SIGKILLed at a
# random point, every trial (tests/test_kv_fleet.cpp; CI runs one).
FERRY_KV_FLEET_TRIALS=$(( (trials + 9) / 10 )) "$build"/tests/test_kv_fleet --gtest_brief=1 \
  --gtest_filter='KvFleet.ThreeWriterProcessesOneKilledReadersFollowAll'
