#!/usr/bin/env bash
# Configures and builds Serval into build/ (binary: build/serval).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SERVAL_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
