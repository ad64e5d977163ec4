#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan + UBSan) in build-fuzz and runs
# each for the given number of seconds (default 60) on its seed corpus.
#   scripts/fuzz.sh [seconds] [fuzzer ...]     e.g. scripts/fuzz.sh 600 fuzz_gguf
# Needs clang and libomp-14-dev (apt-get install -y clang libomp-14-dev); fuzz_openai_request
# reads the Qwen3 tokenizer from $SERVAL_MODELS (default ../shared/models).
# New interesting inputs go to build-fuzz/corpus/<name>/ (the checked-in seeds stay
# untouched); crashes are written to build-fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
fuzzers=("$@")
[ ${#fuzzers[@]} -eq 0 ] && fuzzers=(fuzz_gguf fuzz_safetensors fuzz_tokenizer_json fuzz_chat_template fuzz_openai_request fuzz_grammar)

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSERVAL_BUILD_FUZZERS=ON -DSERVAL_BUILD_TESTS=OFF -DSERVAL_CUDA=OFF >/dev/null
cmake --build build-fuzz -j2 --target "${fuzzers[@]}"

mkdir -p build-fuzz/crashes
for f in "${fuzzers[@]}"; do
  corpus="build-fuzz/corpus/${f#fuzz_}"
  mkdir -p "$corpus"
  echo "== $f for ${seconds}s"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "build-fuzz/$f" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
    -timeout=10 -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/ \
    "$corpus" "tests/fuzz/corpus/${f#fuzz_}" \
    $([ "$f" = fuzz_chat_template ] && echo tests/python/chat_templates)
done
