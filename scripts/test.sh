#!/usr/bin/env bash
# Runs every test: C++ units (CTest/GoogleTest) and end-to-end tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
export SERVAL_MODELS="${SERVAL_MODELS:-$(cd .. && pwd)/shared/models}"
scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")
python3 -m pytest -q tests/python
# The server's end-to-end tests again with async scheduling forced on, as it
# is by default on a GPU (on the CPU its steps still run one after the other).
SERVAL_SERVER_ARGS="--async-scheduling on" python3 -m pytest -q tests/python/test_server_*.py
