#!/usr/bin/env bash
# Structured output's cost in decode throughput: one `serval serve` (async
# scheduling and CUDA graphs as they default on a GPU), then `serval bench
# --mode serve` at --concurrency requests in flight with the same token
# prompts, unconstrained, with response_format json_object, with a small
# json_schema, and with a schema of a list of at least 10 objects (nearly
# every token then comes from a real mask, not the EOS-only one of a finished
# text); every request runs to max_tokens (ignore_eos), so each variant makes
# the same number of tokens. One table at the end: output tok/s, TPOT p50 / p99,
# and the loss against the unconstrained run. On the GPU machine, in the
# folder scripts/gpu-stage.sh made; or anywhere with --binary and --model.
# Usage: ./gpu-constrained-ab.sh [--requests N] [--concurrency C] [--input-len I] [--output-len O]
#                                [--model PATH] [--device cuda|cpu] [--binary PATH] [--repeats N]
#   default: a random Llama 3.1 8B (bf16, its 128k vocabulary), 192 requests of 128 + 256 tokens, 64 in flight.
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-constrained-ab}
mkdir -p "$OUT_DIR"
if [ -f lib.tar.xz ]; then
  mkdir -p lib && tar -xJf lib.tar.xz -C lib
  export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fi
VARIANTS="none json_object json_schema json_list"
REQUESTS=192; CONC=64; IN=128; OUTLEN=256; MODEL=""; DEVICE=cuda; BIN=./serval; REPEATS=1
while [ $# -gt 0 ]; do
  case $1 in
    --requests) REQUESTS=$2; shift ;;
    --concurrency) CONC=$2; shift ;;
    --input-len) IN=$2; shift ;;
    --output-len) OUTLEN=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --device) DEVICE=$2; shift ;;
    --binary) BIN=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done
if [ -z "$MODEL" ]; then
  MODEL=/tmp/llama-3.1-8b-bf16.gguf
  [ -s $MODEL ] || $BIN random-model --like llama-3.1-8b --dtype bf16 --out $MODEL >/dev/null 2>&1
fi
echo "build: $(cat COMMIT 2>/dev/null || echo unknown)"

# The request files: the same random token prompts, three constraints.
python3 - "$OUT_DIR" "$REQUESTS" "$IN" "$OUTLEN" <<'EOF'
import json, random, sys
out, n, inlen, outlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(7)
schema = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string",
                "pattern": "^[0-9]{5}$"}}, "required": ["city"]}},
    "required": ["name", "age", "tags", "address"]}
# A list of at least 10 objects (some 200 tokens at the least): nearly every
# token is drawn from a mask that is not trivial (a finished text leaves only
# EOS, a cheap mask).
long_list = {"type": "array", "minItems": 10, "items": {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}}, "required": ["id", "name"]}}
variants = {
    "none": {},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}},
    "json_list": {"response_format": {"type": "json_schema", "json_schema": {"name": "list", "schema": long_list}}},
}
prompts = [[rng.randint(3, 255) for _ in range(inlen)] for _ in range(n)]
for name, extra in variants.items():
    with open(f"{out}/{name}.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "max_tokens": outlen, "ignore_eos": True, **extra}) + "\n")
    with open(f"{out}/warm-{name}.jsonl", "w") as f:
        for p in prompts[:64]:
            f.write(json.dumps({"prompt": p, "max_tokens": 16, "ignore_eos": True, **extra}) + "\n")
EOF

PORT=$((20000 + RANDOM % 20000))
$BIN serve --model "$MODEL" --device "$DEVICE" --port $PORT >"$OUT_DIR/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 900); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
    >/dev/null 2>&1 && break
  kill -0 $PID 2>/dev/null || break
  sleep 0.2
done
# A warm-up of each variant, unmeasured: graphs, matmul plans, grammar caches.
for v in $VARIANTS; do
  $BIN bench --mode serve --url "http://127.0.0.1:$PORT" --input "$OUT_DIR/warm-$v.jsonl" \
    --max-concurrency "$CONC" >/dev/null 2>>"$OUT_DIR/bench-err.log"
done
metric() {
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=5).read().decode())" \
    2>/dev/null | awk -v m="$1" '$1 ~ "^"m"[{ ]" || $1 == m {print $2}' | head -1
}
MASKS0=$(metric serval:structured_output_masks_total); SECS0=$(metric serval:structured_output_mask_seconds_total)
declare -A CELL TPOT
for r in $(seq 1 "$REPEATS"); do
  for v in $VARIANTS; do
    j=$(timeout 500 $BIN bench --mode serve --url "http://127.0.0.1:$PORT" --json --input "$OUT_DIR/$v.jsonl" \
      --max-concurrency "$CONC" 2>>"$OUT_DIR/bench-err.log" | tail -1)
    echo "$v | $j" >>"$OUT_DIR/bench.jsonl"
    read -r tps p50 p99 failed <<<"$(echo "$j" | python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    print("%.0f %.2f %.2f %d" % (j["output_tokens_per_s"], j["tpot_ms_p50"], j["tpot_ms_p99"], j["failed"]))
except Exception:
    print("0 0 0 -1")')"
    CELL[$v]+="${CELL[$v]:+ }$tps"
    TPOT[$v]="$p50 / $p99 (failed $failed)"
    echo "$v, run $r: $tps tok/s, TPOT p50 / p99 $p50 / $p99 ms, failed $failed"
  done
done
MASKS=$(metric serval:structured_output_masks_total); SECS=$(metric serval:structured_output_mask_seconds_total)
kill $PID 2>/dev/null
wait $PID 2>/dev/null

best() { tr ' ' '\n' <<<"$1" | sort -n | tail -1; }
base=$(best "${CELL[none]}")
echo
echo "== structured output at $CONC in flight ($DEVICE, $(basename "$MODEL"), $REQUESTS x ($IN + $OUTLEN), ignore_eos)"
echo "| constraint | output tok/s (runs) | TPOT p50 / p99 ms | vs none |"
echo "| --- | --- | --- | --- |"
for v in $VARIANTS; do
  b=$(best "${CELL[$v]}")
  echo "| $v | ${CELL[$v]} | ${TPOT[$v]} | $(python3 -c "print('%+.1f%%' % (100.0 * ($b / $base - 1)) if $base > 0 else 'n/a')") |"
done
python3 -c "
m, s = float('${MASKS:-0}') - float('${MASKS0:-0}'), float('${SECS:-0}') - float('${SECS0:-0}')
print('masks made in the measured runs: %d, %.2f us each (host; async scheduling overlaps them with the forward pass)'
      % (m, 1e6 * s / m) if m > 0 else 'no masks counted')"
grep -h "serving '" "$OUT_DIR/serve.log" | head -2
