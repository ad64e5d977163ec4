#!/usr/bin/env bash
# On the GPU machine: Nsight Compute timing of every kernel of one decode step
# of the random Llama-2-7B model (batch 1 and 64), summed by kernel name.
# Run from the folder scripts/gpu-stage.sh made; results also go to $OUT.
cd "$(dirname "$0")"
mkdir -p lib && [ -f lib.tar.xz ] && tar -xJf lib.tar.xz -C lib
export LD_LIBRARY_PATH=$(pwd)/lib:/usr/local/cuda/lib64
OUT_DIR=${OUT:-/tmp/gpu-profile}; mkdir -p "$OUT_DIR"
MODEL=/tmp/llama-2-7b-bf16.gguf
[ -f $MODEL ] || ./serval random-model --like llama-2-7b --dtype bf16 --out $MODEL >/dev/null 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
# bench runs everything twice; one forward of this model is ~421 launches, so
# skipping `skip` launches lands on a decode step of the measured pass.
prof() {  # label, skip, then serval bench arguments
  local label=$1 skip=$2; shift 2
  timeout 240 "$NCU" --clock-control none --launch-skip $skip --launch-count 421 --csv \
    --metrics gpu__time_duration.sum ./serval bench --model $MODEL --device cuda "$@" \
    > "$OUT_DIR/ncu-$label.csv" 2> "$OUT_DIR/ncu-$label.err"
  python3 - "$OUT_DIR/ncu-$label.csv" "$label" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows for", sys.argv[2]); sys.exit()
h, rows = rows[0], rows[1:]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", ""))
    v = {"nsecond": v / 1000, "ns": v / 1000, "msecond": v * 1000, "ms": v * 1000}.get(r[ui], v)
    tot[r[ki][:80]] += v; cnt[r[ki][:80]] += 1
print(f"== {sys.argv[2]}: {len(rows)} kernels, {sum(tot.values()):.0f} us of kernel time")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:12]: print(f"{v:9.0f} us {cnt[k]:4d}x  {k}")
PY
}
prof b1 2105 --requests 1 --input-len 1 --output-len 4
prof b64 4210 --requests 64 --input-len 128 --output-len 8
