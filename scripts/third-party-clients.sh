#!/usr/bin/env bash
# Runs third-party OpenAI-API benchmark clients against `serval serve` and checks that they
# run clean: vLLM's `vllm bench serve` (random dataset; completions and chat) and GuideLLM's
# `guidellm run` (synthetic data; chat and completions). lm-eval's generate_until is covered
# by tests/python/test_lm_eval.py.
#
#   scripts/third-party-clients.sh [--serval PATH] [--venv DIR] [--full] [--only vllm|guidellm] [--keep]
#
# The clients live in a virtualenv outside the repo (default ~/.cache/serval/venv-clients),
# created on the first run and reused while its pins match. By default it is a light one:
# it sees the system Python's packages (the torch, numpy, aiohttp, pydantic, datasets ...
# that scripts/install-deps.sh installs) and adds the two clients with --no-deps plus the
# pinned modules they import beyond those (1.2 GB, about 30 s). The clients' HTTP and
# tokenizer code runs as released; only torch is not vLLM's pinned one (the bench client
# computes nothing with it). --full installs them with all their dependencies instead
# (~/.cache/serval/venv-clients-full: 9.8 GB, CUDA torch, triton and vLLM's GPU kernels
# included; about 3 minutes on a fast link).
#
# The server runs a tiny random Llama 3 (tests/python/hf_models.py, the model of
# test_lm_eval.py) on a free loopback port; the clients load its Llama 3 tokenizer from the
# model folder with HF_HUB_OFFLINE=1, so nothing reaches the network. Each run passes when
# the client exits 0 with every request completed and none failed, the token counts it
# reports equal the server's (its access log per request, and /metrics' token counters),
# and every completion has the requested length (both clients send ignore_eos).
# Prints a summary table; exits 1 if any run (or install) failed. Work files are kept on
# failure (and with --keep): the clients' output, their JSON results and the server log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

VLLM_VERSION=0.33.0
GUIDELLM_VERSION=0.8.1
PIP_VERSION=26.3
# Light mode: what `vllm bench serve` and `guidellm run` import beyond the packages
# scripts/install-deps.sh puts in the system Python, at the versions pip resolves for
# the full install. transformers is pinned to vLLM's supported range (<5.21); aiohttp
# (vLLM's HTTP client) and tokenizers to the full install's versions.
VLLM_LIGHT_DEPS=(
  transformers==5.20.2 tokenizers==0.23.3 aiohttp==3.14.5
  cbor2==6.3.0 pyzmq==27.3.0 oss-harmony==0.0.11 msgspec==0.23.0 pillow==13.0.0
  pybase64==1.5.1 cachetools==8.0.3 uvloop==0.23.0 py-cpuinfo==9.0.0 fastapi==0.136.3
  starlette==1.10.0 prometheus_client==0.26.0 partial-json-parser==0.2.1.1.post7
  uvicorn==0.55.0 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 llguidance==1.7.6
  watchfiles==1.3.0 einops==0.8.2
)
GUIDELLM_LIGHT_DEPS=(
  transformers==5.20.2 tokenizers==0.23.3 click==8.4.2 loguru==0.8.0 culsans==0.10.0
  aiologic==0.17.1 ftfy==6.3.1 Faker==40.63.0 websockets==17.4 uvloop==0.23.0
  httpx==0.29.0 httpcore==1.0.9 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0
)

SERVAL="${SERVAL_BIN:-$ROOT/build/serval}"
MODELS="${SERVAL_MODELS:-$(cd "$ROOT/.." && pwd)/shared/models}"
MODE=light
VENV=""
ONLY=""
KEEP=0
# Run sizes: short, a few seconds of load each.
VLLM_PROMPTS=20 VLLM_IN=64 VLLM_OUT=16
GUIDELLM_REQUESTS=16 GUIDELLM_IN=64 GUIDELLM_OUT=16
CONCURRENCY=4
NAME=tiny-llama3

while [ $# -gt 0 ]; do
  case "$1" in
    --serval) SERVAL="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --full) MODE=full; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$ONLY" in ""|vllm|guidellm) ;; *) echo "--only takes vllm or guidellm" >&2; exit 2 ;; esac
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/serval"
if [ -z "$VENV" ]; then
  VENV="$CACHE/venv-clients"; [ "$MODE" = full ] && VENV="$CACHE/venv-clients-full"
fi
[ -x "$SERVAL" ] || { echo "no serval binary at $SERVAL (build it, or pass --serval PATH / SERVAL_BIN)" >&2; exit 2; }
[ -f "$MODELS/tokenizers/llama3/tokenizer.json" ] || { echo "no $MODELS/tokenizers/llama3/tokenizer.json (set SERVAL_MODELS)" >&2; exit 2; }

TOOLS=(vllm guidellm); [ -n "$ONLY" ] && TOOLS=("$ONLY")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/serval-clients.XXXXXX")
SUMMARY="$WORK/summary.tsv"
: > "$SUMMARY"
FAILED=0
SERVER_PID=""
declare -A INSTALLED

# shellcheck disable=SC2317  # (a trap handler)
cleanup() {
  local rc=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [ "$rc" -eq 0 ] && [ "$KEEP" -eq 0 ]; then rm -rf "$WORK"; else echo "work files: $WORK"; fi
}
trap cleanup EXIT

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# ---- the virtualenv ---------------------------------------------------------------------
install_clients() {
  local want_site=false stamp spec t0 tool
  [ "$MODE" = light ] && want_site=true
  if [ "$MODE" = light ] && ! python3 -c "import torch, numpy" 2>/dev/null; then
    echo "light mode reuses the system Python's torch and numpy (scripts/install-deps.sh);" \
         "they do not import: run scripts/install-deps.sh, or use --full" >&2
    exit 2
  fi
  if [ -f "$VENV/pyvenv.cfg" ]; then
    if ! grep -q "^include-system-site-packages = $want_site" "$VENV/pyvenv.cfg"; then
      echo "$VENV is not a $MODE-mode virtualenv (include-system-site-packages is not $want_site):" \
           "pass another --venv" >&2
      exit 2
    fi
  else
    mkdir -p "$(dirname "$VENV")"
    if [ "$MODE" = light ]; then python3 -m venv --system-site-packages "$VENV"; else python3 -m venv "$VENV"; fi
  fi
  INSTALL_NOTE=""
  for tool in "${TOOLS[@]}"; do
    if [ "$tool" = vllm ]; then
      spec="vllm==$VLLM_VERSION"; [ "$MODE" = light ] && spec="$spec ${VLLM_LIGHT_DEPS[*]}"
    else
      spec="guidellm==$GUIDELLM_VERSION"; [ "$MODE" = light ] && spec="$spec ${GUIDELLM_LIGHT_DEPS[*]}"
    fi
    stamp="$VENV/.serval-$tool"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$MODE pip==$PIP_VERSION $spec" ]; then
      INSTALLED[$tool]=1; INSTALL_NOTE+="$tool: reused; "; continue
    fi
    rm -f "$stamp"
    echo "installing $tool ($MODE) into $VENV ..."
    t0=$(date +%s)
    local flags=(); [ "$MODE" = light ] && flags=(--no-deps)
    # shellcheck disable=SC2086
    if "$VENV/bin/python" -m pip install -q "pip==$PIP_VERSION" >"$VENV/install-$tool.log" 2>&1 &&
       "$VENV/bin/python" -m pip install -q "${flags[@]}" $spec >>"$VENV/install-$tool.log" 2>&1; then
      echo "$MODE pip==$PIP_VERSION $spec" > "$stamp"
      INSTALLED[$tool]=1; INSTALL_NOTE+="$tool: installed in $(( $(date +%s) - t0 )) s; "
    else
      INSTALLED[$tool]=0; INSTALL_NOTE+="$tool: INSTALL FAILED; "
      echo "pip install of $tool failed ($VENV/install-$tool.log):" >&2
      tail -20 "$VENV/install-$tool.log" >&2
      printf '%s\t-\t-\t-\t-\t-\tFAIL (pip install)\n' "$tool" >> "$SUMMARY"
      FAILED=1
    fi
  done
  INSTALL_NOTE+="venv $VENV: $(du -sh "$VENV" 2>/dev/null | cut -f1)"
}
install_clients

# ---- the checker (stdlib Python): compares a client's results with the server's ---------
cat > "$WORK/check.py" <<'EOF'
"""check.py TOOL LABEL RC RESULT_JSON SERVER_LOG OFFSET METRICS_BEFORE METRICS_AFTER
EXPECTED_REQUESTS OUTPUT_LEN PROMPT_LEN SECONDS SUMMARY: appends a summary row; exit 1 on failure."""
import json, re, sys

(tool, label, rc, result, log, offset, mbefore, mafter, n_req, out_len, prompt_len, secs,
 summary) = sys.argv[1:]
rc, offset, n_req, out_len, prompt_len = int(rc), int(offset), int(n_req), int(out_len), int(prompt_len)
problems = []

def counters(path):
    out = {}
    for line in open(path, errors="replace"):
        m = re.match(r"serval:(prompt_tokens_total|generation_tokens_total)\{[^}]*\} (\S+)", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out

server = []  # (id, status, prompt_tokens, completion_tokens) of this run's generation requests
with open(log, errors="replace") as f:
    for i, line in enumerate(f):
        if i < offset or not line.startswith("access "):
            continue
        if not re.search(r" POST /v1/(chat/)?completions ", line):
            continue
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        server.append((kv.get("id"), int(kv.get("status", 0)), int(kv.get("prompt_tokens", -1)),
                       int(kv.get("completion_tokens", -1))))
bad = [s for s in server if s[1] != 200]
if bad:
    problems.append(f"server answered {len(bad)} of {len(server)} request(s) with status "
                    + ", ".join(sorted(set(str(s[1]) for s in bad))))
if len(server) != n_req:
    problems.append(f"server saw {len(server)} generation requests, expected {n_req}")
server = [s for s in server if s[1] == 200]  # token counts: of the requests that were answered
srv_prompt = sum(s[2] for s in server)
srv_out = sum(s[3] for s in server)
m0, m1 = counters(mbefore), counters(mafter)
d_prompt = m1.get("prompt_tokens_total", 0) - m0.get("prompt_tokens_total", 0)
d_out = m1.get("generation_tokens_total", 0) - m0.get("generation_tokens_total", 0)
if (d_prompt, d_out) != (srv_prompt, srv_out):
    problems.append(f"/metrics token counters moved by {d_prompt:.0f}/{d_out:.0f}, "
                    f"the access log sums to {srv_prompt}/{srv_out}")
if any(s[3] != out_len for s in server):
    problems.append(f"completion_tokens not all {out_len} (ignore_eos): "
                    f"{sorted(set(s[3] for s in server))}")

ok = failed = cl_prompt = cl_out = None
if rc != 0:
    problems.append(f"client exited {rc}")
try:
    data = json.load(open(result))
except (OSError, ValueError) as e:
    data = None
    problems.append(f"no result file {result}: {e}")
if data is not None and tool == "vllm":
    ok, failed = data.get("completed"), data.get("failed")
    cl_prompt, cl_out = data.get("total_input_tokens"), data.get("total_output_tokens")
    errors = data.get("errors", [])
    if any(errors):
        problems.append(f"client errors: {sorted(set(e for e in errors if e))[:3]}")
    # Per request (vLLM's detailed results carry no response id): the same multisets,
    # over the requests that succeeded (a failed one has error text).
    good = [i for i, e in enumerate(errors) if not e]
    ins = sorted(data.get("input_lens", [])[i] for i in good)
    outs = sorted(data.get("output_lens", [])[i] for i in good)
    if ins != sorted(s[2] for s in server):
        problems.append(f"client input_lens {ins} != server prompt_tokens {sorted(s[2] for s in server)}")
    if outs != sorted(s[3] for s in server):
        problems.append(f"client output_lens {outs} != server completion_tokens {sorted(s[3] for s in server)}")
    # vLLM's random dataset makes each completions prompt exactly PROMPT_LEN tokens of the
    # tokenizer (after checking with /tokenize): the server must count as many.
    if prompt_len > 0 and any(s[2] != prompt_len for s in server):
        problems.append(f"prompt_tokens not all {prompt_len}: {sorted(set(s[2] for s in server))}")
elif data is not None and tool == "guidellm":
    bench = data["benchmarks"][0]
    reqs = bench["requests"]
    ok, failed = len(reqs.get("successful", [])), len(reqs.get("errored", []))
    incomplete = len(reqs.get("incomplete", []))
    if incomplete:
        problems.append(f"{incomplete} incomplete request(s)")
    errs = sorted(set(str((r.get("info") or {}).get("error")) for r in reqs.get("errored", [])))
    if errs:
        problems.append(f"client errors: {errs[:3]}")
    metrics = bench["metrics"]
    cl_prompt = metrics["prompt_token_count"]["successful"]["total_sum"]
    cl_out = metrics["output_token_count"]["successful"]["total_sum"]
    by_id = {s[0]: s for s in server}
    for r in reqs.get("successful", []):
        s = by_id.get(r.get("response_id"))
        mine = (r["input_metrics"]["text_tokens"], r["output_metrics"]["text_tokens"])
        if s is None:
            problems.append(f"response id {r.get('response_id')} not in the server's log")
        elif mine != (s[2], s[3]):
            problems.append(f"{s[0]}: client counts {mine[0]}/{mine[1]} tokens, server {s[2]}/{s[3]}")
if ok is not None and (ok != n_req or failed):
    problems.append(f"client: {ok} completed, {failed} failed, expected {n_req} completed")
if cl_prompt is not None and (int(cl_prompt), int(cl_out)) != (srv_prompt, srv_out):
    problems.append(f"client totals {cl_prompt}/{cl_out} != server {srv_prompt}/{srv_out}")

fmt = lambda x: "-" if x is None else str(int(x))
row = [tool, label, f"{fmt(ok)}/{fmt(failed)}", f"{fmt(cl_prompt)}/{srv_prompt}",
       f"{fmt(cl_out)}/{srv_out}", secs, "PASS" if not problems else "FAIL"]
with open(summary, "a") as f:
    f.write("\t".join(row) + "\n")
for p in problems:
    print(f"  {tool} {label}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

if [ "${INSTALLED[vllm]:-0}" != 1 ] && [ "${INSTALLED[guidellm]:-0}" != 1 ]; then
  echo "nothing installed to run" >&2; exit 1
fi

# ---- the model and the server -----------------------------------------------------------
echo "building the tiny random Llama 3 in $WORK/model ..."
"$VENV/bin/python" - "$ROOT/tests/python" "$WORK/model" "$MODELS" >"$WORK/model.log" 2>&1 <<'EOF' || { cat "$WORK/model.log" >&2; exit 1; }
import pathlib, sys
sys.path.insert(0, sys.argv[1])
import hf_models
hf_models.build("llama3", pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
EOF

SERVER_LOG="$WORK/server.log"
"$SERVAL" serve --model "$WORK/model" --served-model-name "$NAME" --host 127.0.0.1 --port 0 \
  --threads 1 --max-model-len 4096 >"$WORK/server.out" 2>"$SERVER_LOG" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 600); do
  URL=$(grep -ohE 'on http://127\.0\.0\.1:[0-9]+' "$WORK/server.out" "$SERVER_LOG" 2>/dev/null | head -1 | cut -c4-) || true
  if [ -n "$URL" ] && curl -sf "$URL/health" >/dev/null 2>&1; then break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "serval serve exited:" >&2; cat "$SERVER_LOG" >&2; exit 1; }
  URL=""; sleep 0.1
done
[ -n "$URL" ] || { echo "serval serve did not become healthy in 60 s" >&2; cat "$SERVER_LOG" >&2; exit 1; }
echo "serval serve ($SERVAL): $URL"

# ---- the runs ---------------------------------------------------------------------------
# run_client TOOL LABEL N_REQUESTS OUTPUT_LEN PROMPT_LEN(0: not checked) -- COMMAND...
run_client() {
  local tool=$1 label=$2 n=$3 out_len=$4 prompt_len=$5; shift 6
  local f="$WORK/$tool${label//\//_}" offset t0 t1 rc=0   # f: the run's files, $f.json its result
  offset=$(wc -l < "$SERVER_LOG")
  curl -sf "$URL/metrics" > "$f.metrics-before" || true
  echo "running $tool ($label) ..."
  t0=$(date +%s%N)
  timeout 600 "$@" > "$f.out" 2>&1 || rc=$?
  t1=$(date +%s%N)
  curl -sf "$URL/metrics" > "$f.metrics-after" || true
  if ! python3 "$WORK/check.py" "$tool" "$label" "$rc" "$f.json" "$SERVER_LOG" "$offset" \
      "$f.metrics-before" "$f.metrics-after" "$n" "$out_len" "$prompt_len" \
      "$(awk "BEGIN {printf \"%.1f\", ($t1 - $t0) / 1e9}")" "$SUMMARY"; then
    FAILED=1
    if [ "$rc" -ne 0 ]; then
      echo "  --- last lines of $f.out:" >&2
      grep -v -E '^ - |nanobind' "$f.out" | tail -25 | sed 's/^/  | /' >&2
    fi
  fi
}

if [ "${INSTALLED[vllm]:-0}" = 1 ]; then
  for backend in openai openai-chat; do
    endpoint=/v1/completions; prompt_len=$VLLM_IN
    [ "$backend" = openai-chat ] && endpoint=/v1/chat/completions && prompt_len=0
    run_client vllm "$endpoint" "$VLLM_PROMPTS" "$VLLM_OUT" "$prompt_len" -- \
      "$VENV/bin/vllm" bench serve --backend "$backend" --endpoint "$endpoint" --base-url "$URL" \
        --model "$NAME" --tokenizer "$WORK/model" --dataset-name random \
        --random-input-len "$VLLM_IN" --random-output-len "$VLLM_OUT" --num-prompts "$VLLM_PROMPTS" \
        --max-concurrency "$CONCURRENCY" --seed 0 --disable-tqdm \
        --save-result --save-detailed --result-dir "$WORK" --result-filename "vllm${endpoint//\//_}.json"
  done
fi
if [ "${INSTALLED[guidellm]:-0}" = 1 ]; then
  for endpoint in /v1/chat/completions /v1/completions; do
    run_client guidellm "$endpoint" "$GUIDELLM_REQUESTS" "$GUIDELLM_OUT" 0 -- \
      "$VENV/bin/guidellm" run \
        --backend "kind=openai_http,target=$URL,model=$NAME,request_format=$endpoint" \
        --tokenizer "kind=huggingface_auto,model=$WORK/model" \
        --profile "kind=concurrent,streams=$CONCURRENCY" \
        --constraint "kind=max_requests,count=$GUIDELLM_REQUESTS" \
        --data "kind=synthetic_text,prompt_tokens=$GUIDELLM_IN,output_tokens=$GUIDELLM_OUT" \
        --output "kind=json,path=$WORK/guidellm${endpoint//\//_}.json" --disable-console-interactive
  done
fi

# ---- summary ----------------------------------------------------------------------------
echo
echo "third-party clients against $SERVAL ($MODE install; $INSTALL_NOTE)"
python3 - "$SUMMARY" "$VLLM_VERSION" "$GUIDELLM_VERSION" <<'EOF'
import sys
names = {"vllm": f"vllm bench serve {sys.argv[2]}", "guidellm": f"guidellm run {sys.argv[3]}"}
rows = [["client", "endpoint", "ok/failed", "prompt tokens client/server",
         "output tokens client/server", "seconds", "result"]]
for line in open(sys.argv[1]):
    r = line.rstrip("\n").split("\t")
    rows.append([names.get(r[0], r[0])] + r[1:])
widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
EOF
exit "$FAILED"
