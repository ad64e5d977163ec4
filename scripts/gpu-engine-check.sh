#!/usr/bin/env bash
# The Engine on CUDA (scripts/gpu-check.sh calls it): 16 stories260K requests
# (greedy, 64 tokens, n=2 on some) through `serval generate --input`, batched
# (64 sequences) and one at a time on CUDA, and batched on the CPU, in bf16,
# float32 and bf16 with --batch-invariant; prints how many requests agree.
# Runs in the folder gpu-stage.sh builds.
set -u
cd "$(dirname "$0")"
M=${SERVAL_MODELS:-models}/stories260K/stories260K.gguf
W=$(mktemp -d)
python3 - "$W/prompts.jsonl" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bear",
           "Tom had a red ball", "The sun was hot and", "Mom said", "There was a girl named Sue who"]
with open(sys.argv[1], "w") as f:
    for i, p in enumerate(prompts * 2):
        f.write(json.dumps({"prompt": p, "max_tokens": 64, "temperature": 0, "n": 2 if i % 3 == 0 else 1}) + "\n")
PY
run() {
  ./serval generate --model "$M" --input "$W/prompts.jsonl" --output "$W/$1.jsonl" --no-progress "${@:2}" \
    2>"$W/$1.log" || { echo "$1 failed"; tail -5 "$W/$1.log"; }
}
run cuda-batch --device cuda --max-num-seqs 64
run cuda-solo --device cuda --max-num-seqs 1
run cpu-batch --device cpu --max-num-seqs 64
run f32-batch --device cuda --dtype float32 --max-num-seqs 64
run f32-solo --device cuda --dtype float32 --max-num-seqs 1
run inv-batch --device cuda --batch-invariant --max-num-seqs 64
run inv-solo --device cuda --batch-invariant --max-num-seqs 1
python3 - "$W" <<'PY'
import json, sys
def load(n): return [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl")]
try:
    a, b, c = load("cuda-batch"), load("cuda-solo"), load("cpu-batch")
    fa, fb = load("f32-batch"), load("f32-solo")
    ia, ib = load("inv-batch"), load("inv-solo")
except Exception as e:
    print("engine on CUDA: failed:", e); sys.exit()
ids = lambda r: [ch.get("token_ids") or [] for ch in r.get("choices") or []]
ran = lambda r: bool(ids(r)) and all(ids(r))
# A failed request has no tokens in either run: it counts as different.
same = lambda u, v: sum(ran(x) and ids(x) == ids(y) for x, y in zip(u, v))
failed = [f"{n} {sum(not ran(r) for r in x)}" for n, x in (("bf16", a + b), ("float32", fa + fb),
          ("batch-invariant", ia + ib), ("CPU", c)) if not all(ran(r) for r in x)]
n2 = [x["choices"][0]["token_ids"] == x["choices"][1]["token_ids"] for x in a if len(x["choices"]) == 2]
print(f"engine on CUDA: {len(a)} requests; bf16: batched == solo {same(a, b)}/{len(a)}, CUDA == CPU "
      f"{same(a, c)}/{len(a)}; float32: batched == solo {same(fa, fb)}/{len(a)}, CUDA == CPU {same(fa, c)}/{len(a)}; "
      f"n=2 greedy samples equal {sum(n2)}/{len(n2)}; --batch-invariant: batched == solo {same(ia, ib)}/{len(a)}, "
      f"== default bf16 solo {same(ia, b)}/{len(a)}, == CPU {same(ia, c)}/{len(a)}"
      + (f"; FAILED requests: {', '.join(failed)}" if failed else ""))
PY
rm -rf "$W"
