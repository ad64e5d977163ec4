#!/usr/bin/env bash
# On the GPU machine, in the folder scripts/gpu-stage.sh made: serval bench
# --mode engine rows with async scheduling on (the default on a GPU; its
# continuations started late, the default, or early: --no-late-continuations) and off,
# alternated (so drift of the machine hits both alike), then one table:
# output tok/s, steps pipelined (queued while the step before ran) and the
# host's mean time between steps, for each run.
# Usage: ./gpu-engine-ab.sh [--repeats N] [--8b-offline] [--tuning KEY=VALUE,...] [--row "NAME|BENCH ARGS"]...
#   default rows (7B bf16): 64 x (128 + 128); 512 x (128 + 128) at 256 seats (a queue);
#     1 x (16 + 256)
#   --8b-offline: also the 8B row of issue 5, 1,000 x (1,000 + 1,000) (about 2 x 2 minutes)
#   --penalized: instead of the defaults, 64 x (128 + 128) with repetition/frequency/presence
#     penalties (with --tuning fed_penalties=0: not continued, the sampler told not to count fed tokens)
#   --tuning KEY=VALUE,...: every run with --cuda-tuning KEY=VALUE,... (docs/CUDA_TUNING.md)
#   --row: a row of your own instead of the defaults (serval bench engine flags, model M7 or M8)
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-engine-ab}
mkdir -p "$OUT_DIR" lib
[ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SERVAL_MODELS=$HERE/models
REPEATS=2; OFFLINE_8B=0; PENALIZED=0; TUNING=""; ROWS=()
while [ $# -gt 0 ]; do
  case $1 in
    --repeats) REPEATS=$2; shift ;;
    --8b-offline) OFFLINE_8B=1 ;;
    --penalized) PENALIZED=1 ;;
    --tuning) TUNING=$2; shift ;;
    --row) ROWS+=("$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done
if [ ${#ROWS[@]} = 0 ] && [ $PENALIZED = 0 ]; then
  ROWS=("7B 64 x (128 + 128)|M7 --requests 64 --input-len 128 --output-len 128"
        "7B 512 x (128 + 128), 256 seats|M7 --requests 512 --input-len 128 --output-len 128 --max-num-seqs 256"
        "7B 1 x (16 + 256)|M7 --requests 1 --input-len 16 --output-len 256")
fi
[ $OFFLINE_8B = 1 ] && ROWS+=("8B 1000 x (1000 + 1000)|M8 --requests 1000 --input-len 1000 --output-len 1000")
PEN=/tmp/penalized-64.jsonl
if [ $PENALIZED = 1 ]; then
  python3 -c '
import json, random
rng = random.Random(1)
for i in range(64):
    print(json.dumps({"prompt": [rng.randrange(1, 32000) for _ in range(128)], "max_tokens": 128,
                      "ignore_eos": True, "temperature": 0, "repetition_penalty": 1.1,
                      "frequency_penalty": 0.2, "presence_penalty": 0.1}))' >$PEN
  COUNTED=yes; [[ ",$TUNING," =~ ,fed_penalties=(0|off|false), ]] && COUNTED=no
  ROWS+=("7B 64 x (128 + 128), penalties (fed tokens counted: $COUNTED)|M7 --input $PEN")
fi
echo "build: $(cat COMMIT 2>/dev/null || echo staged build)"

M7=/tmp/llama-2-7b-bf16.gguf; M8=/tmp/llama-3.1-8b-bf16.gguf
[ -s $M7 ] || ./serval random-model --like llama-2-7b --dtype bf16 --out $M7 >/dev/null 2>&1
if [ $OFFLINE_8B = 1 ] || [[ "${ROWS[*]}" == *M8* ]]; then
  [ -s $M8 ] || ./serval random-model --like llama-3.1-8b --dtype bf16 --out $M8 >/dev/null 2>&1
fi

declare -A CELL
MODES=("async on" "async on, early" "async off")
for row in "${ROWS[@]}"; do
  name=${row%%|*}; args=${row#*|}; args=${args//M7/$M7}; args=${args//M8/$M8}
  for r in $(seq 1 "$REPEATS"); do
    for mode in "${MODES[@]}"; do
      case $mode in
        "async on") flag="--async-scheduling on" ;;
        "async on, early") flag="--async-scheduling on --no-late-continuations" ;;
        *) flag="--async-scheduling off" ;;
      esac
      j=$(timeout 400 ./serval bench --device cuda --mode engine --json --model $args $flag \
        ${TUNING:+--cuda-tuning "$TUNING"} \
        2>>"$OUT_DIR/bench-err.log" | tail -1)
      echo "$name | $mode | $j" >>"$OUT_DIR/bench.jsonl"
      cell=$(echo "$j" | python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    print("%.0f tok/s, %d/%d pipelined (%d after the step before ended), %.3f ms between" % (
        j["output_tokens_per_s"], j["pipelined_steps"], j["steps"], j["pipelined_after_end_steps"],
        j["host_between_steps_ms"]))
except Exception:
    print("failed")')
      CELL["$name|$mode"]+="${CELL["$name|$mode"]:+; }$cell"
      echo "$name, $mode, run $r: $cell"
    done
  done
done

echo
echo "== engine A/B ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)): output tok/s, steps queued while the one before ran, host time between steps"
echo "| row | --async-scheduling on (a GPU's default) | on, --no-late-continuations | --async-scheduling off |"
echo "| --- | --- | --- | --- |"
for row in "${ROWS[@]}"; do
  name=${row%%|*}
  echo "| $name | ${CELL["$name|async on"]:-} | ${CELL["$name|async on, early"]:-} | ${CELL["$name|async off"]:-} |"
done
