#!/usr/bin/env bash
# Tests that measure the engine against the wall clock (a simulated device
# with real step times): disabled in the suite, since a loaded machine can
# fail them, and run here, on a quiet machine, after changes to async
# scheduling or the continuation timer.
# Usage: scripts/timing-checks.sh [BUILD_DIR]   (default: build)
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export SERVAL_MODELS=${SERVAL_MODELS:-$ROOT/../shared/models}
"$BUILD/serval_tests" --gtest_also_run_disabled_tests --gtest_filter='EngineLateContinuation.DISABLED_*'
