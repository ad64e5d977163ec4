#!/usr/bin/env bash
# Checkpoints written by the real quantization tools load in Serval and match Hugging Face
# transformers running the same checkpoint on the CPU within 1e-3 relative (issue 52's
# acceptance for the import paths; not in CI: each tool lives in its own virtualenv under
# ~/.cache/serval/venvs, made with --system-site-packages so the system torch is reused).
#   scripts/real-tool-checkpoints.sh [llmc] [awq] [gptq]     (default: all three)
# A tiny random Llama (hidden 256, FFN 512: groups of 128 fit) is built with the system's
# transformers, quantized by each tool with a short calibration text from
# /work/shared/data (../shared/data), and run by transformers in the tool's venv (the
# reference, activation quantization off) and by `serval generate --dump-logits`.
# llm-compressor (torch <= 2.14) and AutoAWQ (tested on torch 2.6) pin torches other than the
# system's: they are installed with --no-deps beside their other requirements, pinned here.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SERVAL="${SERVAL_BINARY:-$ROOT/build-cpu/serval}"
VENVS="$HOME/.cache/serval/venvs"
WORK="${WORK:-$HOME/.cache/serval/real-tool-checkpoints}"
DATA="${SERVAL_DATA:-$ROOT/../shared/data}/wikitext-2-test.raw"
TOK="${SERVAL_MODELS:-$ROOT/../shared/models}/tokenizers/llama3"
PY="$ROOT/scripts/real_tool_checkpoints.py"
TOOLS=("${@:-llmc awq gptq}")
mkdir -p "$VENVS" "$WORK"
cd "$WORK"  # GPTQModel writes logs/ into the working directory

venv() {  # NAME PIP-ARGS...: a venv on the system site-packages with the tool installed
  local name=$1; shift
  if [ ! -x "$VENVS/$name/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENVS/$name"
    "$VENVS/$name/bin/pip" install -q "$@"
  fi
}

if [ ! -f "$WORK/base/config.json" ]; then
  python3 "$PY" base "$WORK/base"
  cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$WORK/base/"
fi

for tool in ${TOOLS[*]}; do
  case $tool in
    llmc)
      venv llmc --no-deps "llmcompressor==0.14.0" "transformers==5.17.0" "compressed-tensors==0.19.0" "accelerate==1.15.0" \
        "datasets==5.0.1" "auto-round==0.15.1" "nvidia-ml-py<=13.610.43" "huggingface-hub>=1.5.0,<2.0" \
        "tokenizers>=0.23.1,<0.24" loguru httpx pydantic
      schemes="W4A16 W4A16_ASYM W8A8" ;;
    awq)
      venv awq --no-deps "autoawq==0.2.9" "transformers==4.51.3" "tokenizers>=0.21,<0.22" "huggingface-hub<1.0" \
        "accelerate<1.8" "datasets<4" zstandard
      schemes="gemm" ;;
    gptq)
      venv gptq "gptqmodel==7.7.0" "optimum"  # its requirements leave the system torch alone; transformers
                                               # loads GPTQ through optimum and GPTQModel's CPU kernels
      export GPTQMODEL_CPU_WORKERS=2
      schemes="sym asym sym-desc" ;;
    *) echo "unknown tool $tool (llmc, awq, gptq)"; exit 2 ;;
  esac
  for scheme in $schemes; do
    out="$WORK/$tool-$scheme"
    [ -f "$out/config.json" ] || "$VENVS/$tool/bin/python" "$PY" quantize "$tool" "$scheme" "$WORK/base" "$out" "$DATA"
    "$VENVS/$tool/bin/python" "$PY" reference "$out" "$out/reference.npy"
    python3 "$PY" compare "$out" "$out/reference.npy" "$SERVAL"
  done
done
