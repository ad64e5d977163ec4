#!/usr/bin/env bash
# On the GPU machine: Nsight Compute timing of every kernel of decode steps of
# the random Llama-2-7B model (batch 1 and 64), summed by kernel name and
# divided by the steps profiled (LAYERS: the model's layer count, default 32).
# Eager (--enforce-eager: the same kernels as the graphs replay, one launch
# each). PROFILES=attn: decode attention alone, Nsight Compute's sections
# (below). Run from the folder scripts/gpu-stage.sh made; results also go to $OUT.
cd "$(dirname "$0")"
mkdir -p lib && [ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$(pwd)/lib:/usr/local/cuda/lib64
OUT_DIR=${OUT:-/tmp/gpu-profile}; mkdir -p "$OUT_DIR"
MODEL=${MODEL:-/tmp/llama-2-7b-bf16.gguf}
case " ${PROFILES:-b1 b64} " in *" b1 "*|*" b64 "*)
  [ -f $MODEL ] || ./serval random-model --like llama-2-7b --dtype bf16 --out $MODEL >/dev/null 2>&1 ;;
esac
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
# bench runs the workload twice; skipping `skip` launches lands in the second
# pass's decode steps; `count` launches cover a few whole steps.
prof() {  # label, skip, count, then serval bench arguments
  local label=$1 skip=$2 count=$3; shift 3
  timeout 240 "$NCU" --clock-control none --launch-skip $skip --launch-count $count --csv \
    --metrics gpu__time_duration.sum ./serval bench --model $MODEL --device cuda --enforce-eager "$@" \
    > "$OUT_DIR/ncu-$label.csv" 2> "$OUT_DIR/ncu-$label.err"
  python3 - "$OUT_DIR/ncu-$label.csv" "$label" "${LAYERS:-32}" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows for", sys.argv[2]); sys.exit()
h, rows = rows[0], rows[1:]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", ""))
    v = {"nsecond": v / 1000, "ns": v / 1000, "msecond": v * 1000, "ms": v * 1000}.get(r[ui], v)
    tot[r[ki][:90]] += v; cnt[r[ki][:90]] += 1
# Steps covered: decode attention runs once per layer and step (the window
# of launches cuts steps at both ends, so this is a fraction).
layers = int(sys.argv[3])
attn = sum(c for k, c in cnt.items() if "attn_decode_kernel" in k)
steps = attn / layers if attn else 1.0
if any("attn_prefill" in k for k in cnt):
    print(f"!! {sys.argv[2]}: the window holds prefill kernels; the per-step figures mix prefill and decode")
print(f"== {sys.argv[2]}: {len(rows)} kernels over {steps:.2f} steps ({attn} decode attention launches / {layers} layers), "
      f"{sum(tot.values()) / steps:.0f} us of kernel time per step")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:14]:
    print(f"{v / steps:9.1f} us/step {cnt[k] / steps:6.1f}x {v / cnt[k]:7.2f} us each  {k}")
PY
}
# Decode attention alone (`serval bench --mode attention`, the 7B's 32 heads
# of 128, one launch shape; no model needed): Nsight Compute's sections for
# two of its launches, to tell where a launch's fixed cost goes (DRAM
# throughput, waves and occupancy, what the warps stall on).
attn_sections() {  # label, batch, context
  local label=$1 batch=$2 ctx=$3
  timeout 240 "$NCU" --clock-control none --kernel-name regex:attn_decode --launch-skip 10 --launch-count 2 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    ./serval bench --mode attention --device cuda --heads 32 --kv-heads 32 --head-dim 128 \
    --batch-sizes $batch --context-lens $ctx > "$OUT_DIR/ncu-$label.txt" 2> "$OUT_DIR/ncu-$label.err"
  echo "== $label: decode attention, $batch seqs x $ctx tokens (Nsight Compute, 2 launches; all of it in \$OUT)"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Waves Per SM|Achieved Occupancy|Block Limit|Warp Cycles Per|stall|Stall" \
    "$OUT_DIR/ncu-$label.txt" | sed 's/^ *//' | cut -c1-220 | head -40
}
# PROFILES: which of them (default b1 b64; attn: decode attention at 64
# sequences of 128 and 256 tokens, the sections above); LABEL_SUFFIX tells runs with other
# settings apart. 40 output tokens: launch 3000 falls in the first pass's
# decode steps (with 12, the 64-sequence window took in prefill steps).
for p in ${PROFILES:-b1 b64}; do
  case $p in
    b1) prof b1${LABEL_SUFFIX:-} 3000 1200 --requests 1 --input-len 1 --output-len 40 ;;
    b64) prof b64${LABEL_SUFFIX:-} 3000 1200 --requests 64 --input-len 128 --output-len 40 ;;
    attn) attn_sections attn64x128${LABEL_SUFFIX:-} 64 128; attn_sections attn64x256${LABEL_SUFFIX:-} 64 256 ;;
  esac
done
