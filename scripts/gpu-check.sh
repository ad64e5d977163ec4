#!/usr/bin/env bash
# One command for the GPU machine: every CUDA test, then the benchmarks of
# issue 5 on a random Llama-2-7B-shape bf16 model, then a short table.
# Layout it expects (scripts/gpu-stage.sh builds it): serval, serval_tests,
# lib.tar.xz (shared libraries the GPU host lacks), models/stories260K/.
# Usage: ./gpu-check.sh [--quick]   (--quick: tests and batch-1 figures only)
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT_DIR" lib
[ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SERVAL_MODELS=$HERE/models
QUICK=0; [ "${1:-}" = "--quick" ] && QUICK=1
declare -a ROWS

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
ldd ./serval | grep -E "not found" && { echo "missing libraries"; exit 1; }

echo "== CUDA tests"
timeout 300 ./serval_tests --gtest_filter='Cuda*:StoriesGolden*' 2>&1 | tee "$OUT_DIR/tests.log" | grep -E "^\[( +OK|  FAILED|  PASSED|  SKIPPED) |^\[[a-z0-9_]+\] worst|Failure|Expected|Which is|rel_diff|leaves" 
TESTS=$(grep -E "^\[  (PASSED|FAILED)" "$OUT_DIR/tests.log" | tr '\n' ' ')
ROWS+=("tests | ${TESTS:-none ran}")

echo "== Engine on CUDA (stories260K, JSONL batch)"
ENGINE=$(timeout 120 ./gpu-engine-check.sh | tail -1)
echo "$ENGINE"
ROWS+=("$ENGINE")

MODEL=/tmp/llama-2-7b-bf16.gguf
echo "== random Llama-2-7B bf16 model"
/usr/bin/time -f "%e s" ./serval random-model --like llama-2-7b --dtype bf16 --out $MODEL 2>&1 | tail -2

echo "== 7B-shape model: CUDA against the CPU backend (prompt logits, 32 greedy tokens)"
gen() { timeout 200 ./serval generate --model $MODEL --prompt "The quick brown fox jumps over the lazy dog" \
  --max-tokens 32 --temperature 0 --ignore-eos --json --dump-logits --device "$@"; }
gen cpu > "$OUT_DIR/gen-cpu.json" 2>/dev/null
gen cuda > "$OUT_DIR/gen-cuda.json" 2>/dev/null
CMP=$(python3 - "$OUT_DIR/gen-cpu.json" "$OUT_DIR/gen-cuda.json" <<'PY'
import json, sys
try:
    a, b = (json.load(open(f)) for f in sys.argv[1:3])
except Exception as e:
    print("failed:", e); sys.exit()
la, lb = a["prompt_logits"], b["prompt_logits"]
rel = max(abs(x - y) for x, y in zip(la, lb)) / max(abs(x) for x in la)
ta, tb = a["token_ids"], b["token_ids"]
same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
print(f"prompt-logit rel error {rel:.2e}; greedy tokens equal for {same} of {len(ta)}")
PY
)
echo "$CMP"
ROWS+=("7B-shape CUDA vs CPU | $CMP")

bench() {  # label, then serval bench arguments
  local label=$1; shift
  echo "== bench $label: $*"
  local j
  j=$(timeout 240 ./serval bench --model $MODEL --device cuda --json "$@" 2>"$OUT_DIR/bench-err.log")
  if [ -z "$j" ]; then tail -3 "$OUT_DIR/bench-err.log"; ROWS+=("$label | failed"); return; fi
  echo "$j" | tee -a "$OUT_DIR/bench.jsonl"
  ROWS+=("$label | $(echo "$j" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("prefill %.0f tok/s (MFU %.1f%%) | decode %.1f tok/s, %.2f ms/step (%.1f%% of roofline) | load %.1f s" % (j["prefill_tokens_per_s"], 100*j["prefill_mfu"], j["decode_tokens_per_s"], j["decode_step_ms"], 100*j["decode_roofline_fraction"], j["load_s"]))')")
}
bench "batch-1 decode tg128" --requests 1 --input-len 1 --output-len 129
bench "prefill 512" --requests 1 --input-len 512 --output-len 2
if [ $QUICK = 0 ]; then
  bench "64 x (128 in, 128 out)" --requests 64 --input-len 128 --output-len 128
  bench "256 x (128 in, 128 out)" --requests 256 --input-len 128 --output-len 128
fi
rm -f $MODEL

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader))"
for r in "${ROWS[@]}"; do echo "$r"; done
