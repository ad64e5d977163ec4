#!/usr/bin/env bash
# Runs every test: C++ units (CTest/GoogleTest) and end-to-end tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
export SERVAL_MODELS="${SERVAL_MODELS:-$(cd .. && pwd)/shared/models}"
scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")
# Where the build above has the CUDA backend, the C++ units once more from a
# build without it, as a machine without nvcc builds Serval.
if grep -q -- "-DSERVAL_WITH_CUDA" build/build.ninja; then
  cmake -S . -B build-cpu-only -G Ninja -DCMAKE_BUILD_TYPE=Release -DSERVAL_CUDA=OFF >/dev/null
  cmake --build build-cpu-only -j"$(nproc)" --target serval serval_tests
  build-cpu-only/serval_tests --gtest_brief=1
fi
python3 -m pytest -q tests/python
# The server's end-to-end tests again with async scheduling forced on, as it
# is by default on a GPU (on the CPU its steps still run one after the other).
SERVAL_SERVER_ARGS="--async-scheduling on" python3 -m pytest -q tests/python/test_server_*.py
