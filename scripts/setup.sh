#!/usr/bin/env bash
# One command on a fresh Debian machine: install dependencies, build, and run the
# main job (a greedy generation on the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
./build/serval generate --prompt "Once upon a time" --temperature 0 --max-tokens 64
