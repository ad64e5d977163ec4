#!/usr/bin/env bash
# A server under load with async scheduling on (continuations started late,
# the default, or early: --no-late-continuations) and off: for each setting,
# `serval serve` on a loopback port, then `serval bench --mode serve` against
# it at each request rate, then the server stops; one table at the end
# (output tok/s, TTFT and TPOT p50 / p99). On the GPU machine, in the folder
# scripts/gpu-stage.sh made; or anywhere with --binary and --model.
# Usage: ./gpu-serve-ab.sh [--rates "4 16 inf"] [--requests N] [--input-len I] [--output-len O]
#                          [--model PATH] [--device cuda|cpu] [--binary PATH] [--repeats N]
#                          [--modes "late early off"]
#   default: the 7B bf16 random model on cuda, 256 requests of 128 + 128 tokens at 8, 32 and
#   inf requests a second.
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-serve-ab}
mkdir -p "$OUT_DIR"
if [ -f lib.tar.xz ]; then
  mkdir -p lib && tar -xJf lib.tar.xz -C lib
  export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fi
RATES="8 32 inf"; REQUESTS=256; IN=128; OUTLEN=128; MODEL=""; DEVICE=cuda; BIN=./serval; REPEATS=1
MODES="late early off"
while [ $# -gt 0 ]; do
  case $1 in
    --rates) RATES=$2; shift ;;
    --requests) REQUESTS=$2; shift ;;
    --input-len) IN=$2; shift ;;
    --output-len) OUTLEN=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --device) DEVICE=$2; shift ;;
    --binary) BIN=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    --modes) MODES=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done
if [ -z "$MODEL" ]; then
  MODEL=/tmp/llama-2-7b-bf16.gguf
  [ -s $MODEL ] || $BIN random-model --like llama-2-7b --dtype bf16 --out $MODEL >/dev/null 2>&1
fi
echo "build: $(cat COMMIT 2>/dev/null || $BIN --version 2>/dev/null || echo unknown)"
PORT=$((20000 + RANDOM % 20000))

declare -A CELL
for r in $(seq 1 "$REPEATS"); do
  for mode in $MODES; do
    case $mode in
      late) FLAGS="--async-scheduling on" ;;
      early) FLAGS="--async-scheduling on --no-late-continuations" ;;
      off) FLAGS="--async-scheduling off" ;;
      *) echo "unknown mode $mode" >&2; exit 1 ;;
    esac
    $BIN serve --model "$MODEL" --device "$DEVICE" --port $PORT $FLAGS \
      >"$OUT_DIR/serve-$mode.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
        >/dev/null 2>&1 && break
      kill -0 $PID 2>/dev/null || break
      sleep 0.2
    done
    # A warm-up burst, unmeasured: graphs and matmul plans are made at first use.
    $BIN bench --mode serve --url "http://127.0.0.1:$PORT" --requests "$REQUESTS" --input-len "$IN" \
      --output-len 8 --seed 99 >/dev/null 2>>"$OUT_DIR/bench-err.log"
    for rate in $RATES; do
      j=$(timeout 500 $BIN bench --mode serve --url "http://127.0.0.1:$PORT" --json --requests "$REQUESTS" \
        --input-len "$IN" --output-len "$OUTLEN" --request-rate "$rate" --seed "$r" 2>>"$OUT_DIR/bench-err.log" | tail -1)
      echo "$mode | rate $rate | $j" >>"$OUT_DIR/bench.jsonl"
      cell=$(echo "$j" | python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    print("%.0f tok/s, TTFT %.0f / %.0f ms, TPOT %.2f / %.2f ms" % (j["output_tokens_per_s"], j["ttft_ms_p50"],
          j["ttft_ms_p99"], j["tpot_ms_p50"], j["tpot_ms_p99"]))
except Exception:
    print("failed")')
      CELL["$rate|$mode"]+="${CELL["$rate|$mode"]:+; }$cell"
      echo "$mode, rate $rate, run $r: $cell"
    done
    kill $PID 2>/dev/null
    wait $PID 2>/dev/null
  done
done

echo
echo "== serving A/B ($DEVICE, $(basename "$MODEL"), $REQUESTS x ($IN + $OUTLEN)): output tok/s, TTFT p50 / p99, TPOT p50 / p99"
HEAD="| request rate |"; RULE="| --- |"
for mode in $MODES; do
  case $mode in
    late) HEAD+=" async on, late continuations |" ;;
    early) HEAD+=" async on, --no-late-continuations |" ;;
    off) HEAD+=" --async-scheduling off |" ;;
  esac
  RULE+=" --- |"
done
echo "$HEAD"; echo "$RULE"
for rate in $RATES; do
  line="| $rate |"
  for mode in $MODES; do line+=" ${CELL["$rate|$mode"]:-} |"; done
  echo "$line"
done
echo
echo "== the servers' start-up (the warm-up before they listen)"
for mode in $MODES; do grep -h "warm-up\|serving '" "$OUT_DIR/serve-$mode.log"; done
