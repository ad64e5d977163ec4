#!/usr/bin/env bash
# On the GPU machine, in the folder scripts/gpu-stage.sh made plus the builds
# scripts/gpu-stage-variant.sh added (variants/NAME.tar.xz): the CUDA tests of
# each build, then decode benchmarks (7B; 8B with --8b) with the builds interleaved (so drift
# of the machine hits all alike), then one table, a column per build ("base":
# the staged build). For A/B runs of kernel changes in one device call.
# Usage: [MODEL=GGUF] ./gpu-ab.sh [--no-tests | --base-tests] [--8b] [--seqs "1 20 32 48 64"] [--tuning KEY=VALUE,...]...
#        [--flag "--FLAG ..."]... [--gemv FILTER]
#   --base-tests: the CUDA tests of the staged build only (not of the variants)
#   --8b: the benchmarks on a random Llama-3.1-8B-shape model (GQA 32/8) instead of Llama-2-7B
#   --seqs: sequence counts (1: tg128 with 1 input token; others: 128 in + 128 out; pN: one N-token prefill)
#   --tuning KEY=VALUE,...: also the base build with --cuda-tuning KEY=VALUE,... (a column
#     "base KEY=VALUE,..."; keys: docs/CUDA_TUNING.md)
#   --flag "--FLAG ...": also the base build with those serval bench flags (a column "base FLAG ...")
#   --gemv FILTER: also each build's cuda_gemv_bench --benchmark_filter=FILTER (GB/s)
#   --attn "BATCHES:CONTEXTS": also decode attention alone in each column (serval bench --mode
#     attention, the 7B's 32 heads of 128; e.g. "16,64,256:128,192,256"; us per launch;
#     ATTN_DEVICE=cpu runs it on the CPU, to check the table without a GPU)
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-ab}
mkdir -p "$OUT_DIR" lib variants
[ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SERVAL_MODELS=$HERE/models
TESTS=1; SEQS="1 20 32 48 64"; GEMV=""; ATTN=""; EXTRA_TUNINGS=(); EXTRA_FLAGS=(); LIKE=llama-2-7b
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) TESTS=0 ;;
    --base-tests) TESTS=base ;;
    --8b) LIKE=llama-3.1-8b ;;
    --seqs) SEQS=$2; shift ;;
    --tuning) EXTRA_TUNINGS+=("$2"); shift ;;
    --flag) EXTRA_FLAGS+=("$2"); shift ;;
    --gemv) GEMV=$2; shift ;;
    --attn) ATTN=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done

NAMES=(base); DIRS=("$HERE"); TUNINGS=(""); FLAGS=("")
for v in variants/*.tar.xz; do
  [ -f "$v" ] || continue
  tar -xJf "$v" -C variants
  n=$(basename "$v" .tar.xz)
  NAMES+=("$n"); DIRS+=("$HERE/variants/$n"); TUNINGS+=(""); FLAGS+=("")
done
for t in "${EXTRA_TUNINGS[@]}"; do NAMES+=("base $t"); DIRS+=("$HERE"); TUNINGS+=("$t"); FLAGS+=(""); done
for f in "${EXTRA_FLAGS[@]}"; do NAMES+=("base $f"); DIRS+=("$HERE"); TUNINGS+=(""); FLAGS+=("$f"); done
for i in "${!NAMES[@]}"; do echo "${NAMES[$i]}: $(cat "${DIRS[$i]}/COMMIT" 2>/dev/null || echo staged build)"; done

M7=${MODEL:-/tmp/$LIKE-bf16.gguf}  # written here unless it exists (gpu-check.sh --keep leaves it)
[ -s $M7 ] || ./serval random-model --like $LIKE --dtype bf16 --out $M7 >/dev/null 2>&1 &
MODEL_PID=$!

declare -A CELL
ROWS=()
if [ $TESTS != 0 ]; then
  ROWS+=("CUDA tests")
  for i in "${!NAMES[@]}"; do
    n=${NAMES[$i]}
    [ -n "${TUNINGS[$i]}${FLAGS[$i]}" ] && { CELL["CUDA tests|$n"]="(same binary)"; continue; }
    [ $TESTS = base ] && [ $i -gt 0 ] && { CELL["CUDA tests|$n"]="(not run)"; continue; }
    log="$OUT_DIR/tests-$n.log"
    (cd "${DIRS[$i]}" && timeout 420 ./serval_tests --gtest_filter='Cuda*:StoriesGolden*:EngineOnCuda*' >"$log" 2>&1)
    passed=$(grep -oE "^\[  PASSED  \] [0-9]+" "$log" | grep -oE "[0-9]+$")
    failed=$(grep -E "^\[  FAILED  \] [A-Z]" "$log" | sed 's/\[  FAILED  \] //' | tr '\n' ' ')
    skipped=$(grep -oE "^\[  SKIPPED \] [0-9]+" "$log" | grep -oE "[0-9]+$")
    CELL["CUDA tests|$n"]="${passed:-0} passed${skipped:+, $skipped skipped}${failed:+; FAILED: $failed}"
    echo "tests $n: ${CELL["CUDA tests|$n"]}"
  done
fi
wait $MODEL_PID 2>/dev/null

for N in $SEQS; do
  if [ "$N" = 1 ]; then
    row="batch 1, tg128"; args=(--requests 1 --input-len 1 --output-len 129)
  elif [[ $N == p* ]]; then
    row="prefill ${N#p}"; args=(--requests 1 --input-len "${N#p}" --output-len 2)
  else
    row="$N seqs, 128 + 128"; args=(--requests "$N" --input-len 128 --output-len 128)
  fi
  # A count given twice (--seqs "64 1 64") gets a row per run: "..., run 2".
  base_row=$row; k=1
  while [[ " ${ROWS[*]} " == *" $row "* ]]; do k=$((k + 1)); row="$base_row, run $k"; done
  ROWS+=("$row")
  for i in "${!NAMES[@]}"; do
    n=${NAMES[$i]}
    j=$(cd "${DIRS[$i]}" && timeout 300 ./serval bench --model $M7 --device cuda --json "${args[@]}" ${FLAGS[$i]} \
      ${TUNINGS[$i]:+--cuda-tuning "${TUNINGS[$i]}"} \
      2>>"$OUT_DIR/bench-err.log" | tail -1)
    echo "$n | $row | $j" >>"$OUT_DIR/bench.jsonl"
    CELL["$row|$n"]=$(echo "$j" | python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    if sys.argv[1].startswith("prefill"):
        print("%.0f tok/s" % j["prefill_tokens_per_s"])
    else:
        print("%.1f tok/s, %.3f ms" % (j["decode_tokens_per_s"], j["decode_step_ms"]))
except Exception:
    print("failed")' "$row")
    echo "$row $n: ${CELL["$row|$n"]}"
  done
done

if [ -n "$GEMV" ]; then
  for i in "${!NAMES[@]}"; do
    n=${NAMES[$i]}
    [ -x "${DIRS[$i]}/cuda_gemv_bench" ] || continue
    # (cuda_gemv_bench calls the kernels directly: a --tuning column runs them as the base does.)
    (cd "${DIRS[$i]}" && timeout 200 ./cuda_gemv_bench --benchmark_filter="$GEMV" \
      --benchmark_min_time=0.01 >"$OUT_DIR/gemv-${n//[^A-Za-z0-9_.-]/_}.txt" 2>&1)
    while read -r name rest; do
      r="gemv ${name#BM_}"
      [[ " ${ROWS[*]} " == *" $r "* ]] || ROWS+=("$r")
      CELL["$r|$n"]=$(echo "$rest" | grep -oE "GB/s=[0-9.]+k?" | head -1)
    done < <(grep -E "^BM_" "$OUT_DIR/gemv-${n//[^A-Za-z0-9_.-]/_}.txt" | sed 's@/manual_time@@; s@/iterations:[0-9]*@@')
  done
fi

if [ -n "$ATTN" ]; then
  for i in "${!NAMES[@]}"; do
    n=${NAMES[$i]}
    log="$OUT_DIR/attn-${n//[^A-Za-z0-9_.-]/_}.txt"
    (cd "${DIRS[$i]}" && timeout 200 ./serval bench --mode attention --device ${ATTN_DEVICE:-cuda} \
      --heads 32 --kv-heads 32 --head-dim 128 --batch-sizes "${ATTN%%:*}" --context-lens "${ATTN##*:}" \
      ${TUNINGS[$i]:+--cuda-tuning "${TUNINGS[$i]}"} >"$log" 2>&1)
    # Rows of the bench's table: batch, context, us per call, ...
    while read -r b c us rest; do
      r="attention ${b} x ${c}"
      [[ " ${ROWS[*]} " == *" $r "* ]] || ROWS+=("$r")
      CELL["$r|$n"]="$us us"
    done < <(grep -E "^ *[0-9]+ +[0-9]+ +[0-9.]+ " "$log")
  done
fi

echo
echo "== A/B table ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null))"
header="| measure |"; sep="| --- |"
for n in "${NAMES[@]}"; do header+=" $n |"; sep+=" --- |"; done
echo "$header"; echo "$sep"
for r in "${ROWS[@]}"; do
  line="| $r |"
  for n in "${NAMES[@]}"; do line+=" ${CELL["$r|$n"]:-} |"; done
  echo "$line"
done
