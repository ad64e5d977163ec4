#!/usr/bin/env bash
# On the GPU machine, in the folder scripts/gpu-stage.sh made: decode of a 7B-shape random model
# written in each GGUF block type, Serval's packed kernels (packed_blocks=on) beside the same binary with
# packed_blocks=off (the matrices dequantized to bf16 at load), packed_int8_x=1 (1-2 rows of x in int8
# through dp4a) and the bf16 model, and, with
# --llama, llama.cpp's llama-bench tg128 on the same files (built here first: ~5 minutes).
# Prints one table: tok/s, ms a step and the fraction of the copy-bandwidth roofline for the
# bytes a step reads in the weights' real format (BW GB/s: 3021 on an H100, 4261 on an H200).
# Usage: ./gpu-quant-ab.sh [--types "q4_0 q8_0"] [--seqs "1 16 64 p512"] [--tests] [--llama llama.cpp-TAR]
#   --types: GGUF block types random-model writes (q4_0 q8_0 q4_1 q4_k q5_k ...), and Serval's own
#            int8, int4-g32|g64|g128 (asymmetric) and int4-g128-sym, quantized from the bf16 model
#   --seqs: 1: tg128 with 1 input token; N: N sequences of 128 in + 128 out; pN: one N-token prefill
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-quant-ab}
mkdir -p "$OUT_DIR" lib
[ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SERVAL_MODELS=$HERE/models
TYPES="q4_0 q8_0"; SEQS="1"; TESTS=0; LLAMA=""
while [ $# -gt 0 ]; do
  case $1 in
    --types) TYPES=$2; shift ;;
    --seqs) SEQS=$2; shift ;;
    --tests) TESTS=1 ;;
    --llama) LLAMA=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$CARD" in *H200*) BW=${BW:-4261} ;; *) BW=${BW:-3021} ;; esac
echo "card: $CARD; roofline bandwidth $BW GB/s; commit $(cat COMMIT 2>/dev/null || echo '?')"

if [ -n "$LLAMA" ]; then
  (bash build-llama-cpp.sh "$LLAMA" /tmp/llama-build >"$OUT_DIR/llama-build.log" 2>&1) &
fi
for t in bf16 $TYPES; do
  case $t in int*) continue ;; esac
  [ -s /tmp/m-$t.gguf ] || ./serval random-model --like llama-2-7b --dtype $t --out /tmp/m-$t.gguf >/dev/null 2>&1 &
done
wait
for t in $TYPES; do  # serval quantize: int8, int4-gG, int4-gG-sym
  case $t in
    int8) q=(--to int8) ;;
    int4-g*) g=${t#int4-g}; g=${g%-sym}; q=(--to int4 --group-size "$g"); [[ $t == *-sym ]] && q+=(--symmetric) ;;
    *) continue ;;
  esac
  [ -s /tmp/m-$t.gguf ] || ./serval quantize /tmp/m-bf16.gguf "${q[@]}" --out /tmp/m-$t.gguf >/dev/null 2>&1 &
done
if [ $TESTS = 1 ]; then
  timeout 400 ./serval_tests --gtest_filter='CudaPacked*:CudaModel.*Gguf*:CudaModel.*Packed*:GpuBlockPack*' >"$OUT_DIR/tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) " "$OUT_DIR/tests.log"
  grep -E "^\[packed|packed\]" "$OUT_DIR/tests.log" | head -40
fi
wait  # the models, and llama.cpp's build: nothing else loads the CPUs while the benchmarks run

declare -A CELL
ROWS=()
bench() {  # row column model [tuning]
  local j
  j=$(timeout 300 ./serval bench --model "$3" --device cuda --json --bandwidth-gbs $BW "${ARGS[@]}" \
    ${4:+--cuda-tuning "$4"} 2>>"$OUT_DIR/bench-err.log" | tail -1)
  echo "$1 | $2 | $j" >>"$OUT_DIR/bench.jsonl"
  CELL["$1|$2"]=$(echo "$j" | python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    if j["input_len"] > 1 and j["output_len"] == 2:
        print("prefill %.0f tok/s, %.1f%% MFU" % (j["prefill_tokens_per_s"], 100 * j["prefill_mfu"]))
    else:
        print("%.1f tok/s, %.3f ms, %.0f%% of %.2f GB" % (j["decode_tokens_per_s"], j["decode_step_ms"],
              100 * j["decode_roofline_fraction"], j["weight_bytes_per_step"] / 1e9))
except Exception:
    print("failed")')
  echo "$1 | $2: ${CELL["$1|$2"]}"
}
for N in $SEQS; do
  if [ "$N" = 1 ]; then ARGS=(--requests 1 --input-len 1 --output-len 129); label="batch 1, tg128"
  elif [[ $N == p* ]]; then ARGS=(--requests 1 --input-len "${N#p}" --output-len 2); label="prefill ${N#p}"
  else ARGS=(--requests "$N" --input-len 128 --output-len 128); label="$N seqs, 128 + 128"; fi
  row="bf16, $label"; ROWS+=("$row"); bench "$row" "serval" /tmp/m-bf16.gguf
  for t in $TYPES; do
    row="$t, $label"; ROWS+=("$row")
    bench "$row" "serval" /tmp/m-$t.gguf packed_blocks=on
    bench "$row" "serval, int8 x" /tmp/m-$t.gguf packed_blocks=on,packed_int8_x=1
    bench "$row" "serval, dequantized at load" /tmp/m-$t.gguf packed_blocks=off
  done
done

if [ -n "$LLAMA" ]; then
  LLAMA_BIN=/tmp/llama-build/bin/llama-bench
  for t in bf16 $TYPES; do
    row="$t, batch 1, tg128"
    r=$(timeout 240 $LLAMA_BIN -m /tmp/m-$t.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o json 2>>"$OUT_DIR/llama-err.log" |
      python3 -c 'import json, sys; print("%.1f tok/s" % json.load(sys.stdin)[0]["avg_ts"])' 2>/dev/null)
    CELL["$row|llama.cpp"]=${r:-failed}
    echo "$row | llama.cpp: ${CELL["$row|llama.cpp"]}"
  done
fi

echo
COLS=("serval" "serval, int8 x" "serval, dequantized at load")
[ -n "$LLAMA" ] && COLS+=("llama.cpp")
printf "| %s |" "$CARD"; for c in "${COLS[@]}"; do printf " %s |" "$c"; done; echo
printf "| --- |"; for c in "${COLS[@]}"; do printf " --- |"; done; echo
for r in "${ROWS[@]}"; do
  printf "| %s |" "$r"; for c in "${COLS[@]}"; do printf " %s |" "${CELL["$r|$c"]:-}"; done; echo
done
