#!/usr/bin/env bash
# How often batching changes greedy output (issue 5: "on random 7B-shape
# models, report how often it differs"): 16 prompts, greedy, through the Engine
# once batched (up to 64 sequences per step) and once one request at a time;
# prints how many of the 16 outputs are equal and, for the others, the first
# token where they part. scripts/gpu-check.sh runs it on the 7B model.
# Usage: scripts/batch-vs-solo.sh MODEL LABEL [serval generate flags, e.g. --device cuda]
set -u
cd "$(dirname "$0")"
MODEL=$1 LABEL=$2
shift 2
SERVAL=${SERVAL:-./serval}
W=$(mktemp -d)
python3 - "$W/prompts.jsonl" <<'PY'
import json, sys
prompts = ["Once upon a time", "The quick brown fox jumps over the lazy dog", "In the beginning",
           "A long time ago in a galaxy far", "The capital of France is", "def main():", "1, 2, 3, 4,",
           "She opened the door and saw"]
with open(sys.argv[1], "w") as f:
    for p in prompts * 2:
        f.write(json.dumps({"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True}) + "\n")
PY
run() {
  timeout 300 "$SERVAL" generate --model "$MODEL" --input "$W/prompts.jsonl" --output "$W/$1.jsonl" --no-progress \
    "${@:2}" 2>"$W/$1.log" || { echo "$LABEL batched vs solo: $1 failed: $(tail -1 "$W/$1.log")"; }
}
run batch --max-num-seqs 64 "$@"
run solo --max-num-seqs 1 "$@"
python3 - "$W" "$LABEL" <<'PY'
import json, sys
w, label = sys.argv[1], sys.argv[2]
try:
    a, b = ([json.loads(l)["choices"][0]["token_ids"] for l in open(f"{w}/{n}.jsonl")] for n in ("batch", "solo"))
except Exception as e:
    print(f"{label} batched vs solo: failed: {e}"); sys.exit()
# A request that failed (fewer than its 32 tokens) is never "equal".
short = sum(len(u) != 32 for u in a + b)
parts = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), None if len(u) == len(v) == 32 else -1)
         for u, v in zip(a, b)]
diff = sorted(p for p in parts if p is not None and p >= 0)
equal = sum(p is None for p in parts)
print(f"{label} batched vs solo (greedy, 32 tokens): {equal}/{len(a)} equal"
      + (f"; the others part at tokens {diff}" if diff else "")
      + (f"; FAILED: {short} outputs without their 32 tokens" if short else ""))
PY
rm -rf "$W"
