#!/usr/bin/env bash
# One command for the GPU machine (issue 5): the ceilings of this GPU, every
# CUDA test, the Engine on CUDA, whether cuBLASLt's kernels honour programmatic
# dependent launch, then the issue's benchmarks on random
# Llama-2-7B-shape (and, with --8b, Llama-3.1-8B-shape) bf16 models, then a
# short table. Layout it expects (scripts/gpu-stage.sh builds it): serval,
# serval_tests, lib.tar.xz (shared libraries the GPU host lacks), models/.
# Usage: ./gpu-check.sh [--quick] [--8b] [--no-tests] [--no-7b] [--keep]
#   --quick: tests and the 7B batch-1/prefill figures only
#   --keep: leave the random models in /tmp (and reuse them if there) for later runs
set -u
cd "$(dirname "$0")"
HERE=$(pwd)
OUT_DIR=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT_DIR" lib
[ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$HERE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SERVAL_MODELS=$HERE/models
QUICK=0; EIGHT=0; TESTS=1; SEVEN=1; KEEP=0
for a in "$@"; do
  case $a in --quick) QUICK=1 ;; --8b) EIGHT=1 ;; --no-tests) TESTS=0 ;; --no-7b) SEVEN=0 ;; --keep) KEEP=1 ;; esac
done
declare -a ROWS
row() { ROWS+=("$*"); echo "  -> $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
ldd ./serval | grep -E "not found" && { echo "missing libraries"; exit 1; }

echo "== ceilings of this GPU (torch: device copy, 8192^3 bf16 matmul on random data)"
CEIL=$(timeout 60 python3 - <<'PY' 2>&1 | tail -1
import torch, time
x = torch.empty(int(4e9) // 2, dtype=torch.bfloat16, device="cuda").normal_()
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); s = torch.cuda.Event(True); e = torch.cuda.Event(True)
s.record(); [y.copy_(x) for _ in range(10)]; e.record(); torch.cuda.synchronize()
bw = 2 * x.numel() * 2 * 10 / (s.elapsed_time(e) / 1e3) / 1e9
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
for _ in range(3): a @ b
s.record(); [a @ b for _ in range(10)]; e.record(); torch.cuda.synchronize()
tf = 2 * 8192**3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12
print(f"copy {bw:.0f} GB/s, bf16 matmul {tf:.0f} TFLOP/s")
PY
)
row "ceilings | $CEIL"

if [ $TESTS = 1 ]; then
  echo "== CUDA tests"
  timeout 420 ./serval_tests --gtest_filter='Cuda*:StoriesGolden*:EngineOnCuda*' 2>&1 | tee "$OUT_DIR/tests.log" |
    grep -E "^\[( +OK|  FAILED|  PASSED|  SKIPPED) |^\[[a-z0-9_ ,=-]+\]|Failure|Expected|Which is|rel_diff|leaves|error"
  row "tests | $(grep -E "^\[  (PASSED|FAILED)" "$OUT_DIR/tests.log" | tr '\n' ' ')"
  row "failed | $(grep -E "^\[  FAILED  \] [A-Z]" "$OUT_DIR/tests.log" | sed 's/\[  FAILED  \] //' | tr '\n' ' ')"
  echo "== Engine on CUDA (stories260K, JSONL batch)"
  row "$(timeout 120 ./gpu-engine-check.sh | tail -1)"
fi

# Whether cuBLASLt's kernels wait (griddepcontrol.wait) when made programmatic
# dependents of the kernel before them: if a cuBLAS release starts to, the
# decode graphs could overlap every matmul's launch with that kernel.
if [ -x ./cuda_lt_pdl_bench ]; then
  echo "== cuBLASLt matmuls as programmatic dependents (cuda_lt_pdl_bench 64)"
  timeout 120 ./cuda_lt_pdl_bench 64 >"$OUT_DIR/lt-pdl.log" 2>&1
  grep -E "^probe T|verdict|small kernel|late-release|L2 prefetch" "$OUT_DIR/lt-pdl.log"
  row "cuBLASLt PDL | $(grep -m1 "probe verdict" "$OUT_DIR/lt-pdl.log" | sed 's/probe verdict: //')"
fi

# The GPU's clock and power state while a benchmark runs (nvidia-smi every
# 0.5 s): at the software power cap (throttle reason 0x4) the SM clock falls
# and runs of one binary spread by several percent (docs/PERFORMANCE.md, Method).
clocks_start() {
  nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader,nounits \
    -lms 500 >"$OUT_DIR/clocks.csv" 2>/dev/null &
  CLOCKS_PID=$!
}
clocks_summary() {
  kill "$CLOCKS_PID" 2>/dev/null; wait "$CLOCKS_PID" 2>/dev/null
  python3 - "$OUT_DIR/clocks.csv" <<'PY'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1])]
busy = [r for r in rows if len(r) == 3 and r[0].isdigit() and float(r[1]) > 200]
if busy:
    capped = sum(int(r[2], 16) & 0x4 != 0 for r in busy)
    print("SM %.0f MHz, %.0f W, power-capped %d/%d samples" % (
        sum(float(r[0]) for r in busy) / len(busy), sum(float(r[1]) for r in busy) / len(busy), capped, len(busy)))
PY
}

bench() {  # label, model, then serval bench arguments
  local label=$1 model=$2; shift 2
  echo "== bench $label: $*"
  local j
  clocks_start
  j=$(timeout ${BENCH_TIMEOUT:-300} ./serval bench --model "$model" --device cuda --json "$@" 2>"$OUT_DIR/bench-err.log" | tail -1)
  local clocks; clocks=$(clocks_summary)
  if [ -z "$j" ]; then tail -3 "$OUT_DIR/bench-err.log"; row "$label | failed"; return; fi
  echo "$j" | tee -a "$OUT_DIR/bench.jsonl"
  row "$label | $(echo "$j" | python3 -c '
import json, sys
j = json.load(sys.stdin)
f = []
if j.get("prefill_tokens_per_s"): f.append("prefill %.0f tok/s (MFU %.1f%%)" % (j["prefill_tokens_per_s"], 100 * j["prefill_mfu"]))
if j.get("decode_tokens_per_s"): f.append("decode %.1f tok/s, %.3f ms/step (%.1f%% of roofline)" % (j["decode_tokens_per_s"], j["decode_step_ms"], 100 * j["decode_roofline_fraction"]))
if j.get("decode_tokens_per_s_min"): f.append("median of %d runs, range %.1f-%.1f tok/s" % (j["repeats"], j["decode_tokens_per_s_min"], j["decode_tokens_per_s_max"]))
for k in ("output_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50", "mean_decode_batch",
          "us_per_call", "kv_gbs", "bandwidth_fraction", "graph_replays", "graphs_captured", "graphs_captured_in_run", "load_s",
          "host_between_steps_ms"):
    if k in j: f.append("%s %.4g" % (k, j[k]))
print(" | ".join(f))')${clocks:+ | $clocks}"
}

compare_cpu() {  # model, label, then extra flags for the CUDA run (e.g. --dtype float32)
  local model=$1 label=$2; shift 2
  gen() { timeout 300 ./serval generate --model "$model" --prompt "The quick brown fox jumps over the lazy dog" \
    --max-tokens 32 --temperature 0 --ignore-eos --json --dump-logits "$@"; }
  [ -s "$OUT_DIR/gen-cpu-$label.json" ] || gen --device cpu > "$OUT_DIR/gen-cpu-$label.json" 2>/dev/null
  gen --device cuda "$@" > "$OUT_DIR/gen-cuda.json" 2>"$OUT_DIR/gen-cuda.err"
  local cmp
  cmp=$(python3 - "$OUT_DIR/gen-cpu-$label.json" "$OUT_DIR/gen-cuda.json" <<'PY'
import json, math, sys
try:
    a, b = (json.load(open(f)) for f in sys.argv[1:3])
except Exception as e:
    print("failed:", e); sys.exit()
la, lb = a["prompt_logits"], b["prompt_logits"]
rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(la, lb)) / sum(x * x for x in la))
mx = max(abs(x - y) for x, y in zip(la, lb)) / max(abs(x) for x in la)
ta, tb = a["token_ids"], b["token_ids"]
same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
print(f"prompt-logit rel error (L2) {rel:.2e}, max-abs/max {mx:.2e}; greedy tokens equal for {same} of {len(ta)}")
PY
)
  row "$label CUDA $* vs CPU | $cmp"
}

M7=/tmp/llama-2-7b-bf16.gguf
if [ $SEVEN = 1 ]; then
echo "== random Llama-2-7B bf16 model"
[ $KEEP = 1 ] && [ -s $M7 ] || /usr/bin/time -f "written in %e s" ./serval random-model --like llama-2-7b --dtype bf16 --out $M7 2>&1 | tail -1
if [ $QUICK = 0 ]; then
  compare_cpu $M7 7B
  compare_cpu $M7 7B --dtype float32
  compare_cpu $M7 7B --batch-invariant
  row "$(./batch-vs-solo.sh $M7 "7B bf16 CUDA" --device cuda | tail -1)"
  row "$(./batch-vs-solo.sh $M7 "7B bf16 CUDA --batch-invariant" --device cuda --batch-invariant | tail -1)"
fi
bench "7B batch-1 decode tg128" $M7 --requests 1 --input-len 1 --output-len 129 --repeats 5
bench "7B batch-1 decode tg128, --enforce-eager" $M7 --requests 1 --input-len 1 --output-len 129 --enforce-eager
bench "7B prefill 512" $M7 --requests 1 --input-len 512 --output-len 2
if [ $QUICK = 0 ]; then
  bench "7B 64 x (128 in, 128 out)" $M7 --requests 64 --input-len 128 --output-len 128 --repeats 5
  bench "7B 256 x (128 in, 128 out)" $M7 --requests 256 --input-len 128 --output-len 128 --repeats 5
  # cuBLASLt's wider algorithm search (its products kept in a file, which a --keep rerun reuses).
  for N in 64 256; do
    bench "7B $N x (128 in, 128 out), --gemm-search" $M7 --requests $N --input-len 128 --output-len 128 \
      --gemm-search-cache /tmp/gemm-search-7b.txt
  done
  # What batch invariance costs: the GEMV for every matmul, the prefill kernels for every attention row.
  bench "7B batch-1 decode tg128, --batch-invariant" $M7 --requests 1 --input-len 1 --output-len 129 --batch-invariant
  bench "7B prefill 512, --batch-invariant" $M7 --requests 1 --input-len 512 --output-len 2 --batch-invariant
  bench "7B 64 x (128 in, 128 out), --batch-invariant" $M7 --requests 64 --input-len 128 --output-len 128 --batch-invariant
  # 17..48-row decode steps (CUTLASS's decode GEMM).
  for N in 20 32 48; do
    bench "7B $N x (128 in, 128 out)" $M7 --requests $N --input-len 128 --output-len 128
  done
fi
[ $KEEP = 1 ] || rm -f $M7
fi

if [ $EIGHT = 1 ]; then
  M8=/tmp/llama-3.1-8b-bf16.gguf
  echo "== random Llama-3.1-8B bf16 model"
  [ $KEEP = 1 ] && [ -s $M8 ] || /usr/bin/time -f "written in %e s" ./serval random-model --like llama-3.1-8b --dtype bf16 --out $M8 2>&1 | tail -1
  # Start-up to ready: load, upload, plan, first token of a one-token request.
  # (time -o: a 2> on the command would catch time's own line too)
  /usr/bin/time -f "%e" -o "$OUT_DIR/startup.time" ./serval generate --model $M8 --device cuda --prompt "Hi" \
    --max-tokens 1 --max-model-len 8192 >/dev/null 2>"$OUT_DIR/startup.err"
  START=$(tail -1 "$OUT_DIR/startup.time")
  row "8B start-up to first token (generate, 1 token) | ${START} s; $(grep -m1 'memory' "$OUT_DIR/startup.err")"
  bench "8B batch-1 decode tg128" $M8 --requests 1 --input-len 1 --output-len 129
  bench "8B prefill 4096" $M8 --requests 1 --input-len 4096 --output-len 2 --max-batch-tokens 4096
  # Batched decode at long contexts (the stream attention kernel; attn_stream=off: the split kernel).
  bench "8B 64 x (4096 in, 64 out)" $M8 --requests 64 --input-len 4096 --output-len 64
  bench "8B 64 x (4096 in, 64 out), split attention" $M8 --requests 64 --input-len 4096 --output-len 64 \
    --cuda-tuning attn_stream=off
  for B in 1 64; do for C in 4096 16384 32768; do
    bench "8B attention B=$B ctx=$C" $M8 --mode attention --batch-sizes $B --context-lens $C
  done; done
  echo "== 8B sweep (batch x context)"
  timeout 300 ./serval bench --model $M8 --device cuda --mode sweep --max-model-len 32768 \
    --batch-sizes 1,8,32,64,128,256 --context-lens 128,1024,4096 2>"$OUT_DIR/sweep.err" | tee "$OUT_DIR/sweep.txt"
  BENCH_TIMEOUT=580 bench "8B engine 1000 x (1000 in, 1000 out)" $M8 --mode engine --requests 1000 --input-len 1000 --output-len 1000 \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 4096
  [ $KEEP = 1 ] || rm -f $M8
fi

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader))"
for r in "${ROWS[@]}"; do echo "$r"; done
