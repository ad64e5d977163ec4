"""`serval bench --mode serve` against a running `serval serve` (stories260K on
the CPU, loopback): what it counts agrees with the server's own /metrics,
arrivals follow --request-rate and --seed, --max-concurrency holds, a shared
--prefix-len shows in the server's prefix-cache hit rate, chat requests go to
/v1/chat/completions, failed requests are reported with the server's message,
and bad arguments name the problem."""
import json
from pathlib import Path

import pytest

from conftest import run_serval
from serval_server import ServalServer


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", name="stories")
    yield s
    s.stop()


def bench_serve(serval, server, *args, check=True):
    proc = run_serval(serval, "bench", "--mode", "serve", "--url", server.url, "--json", *args, check=check)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc, lines[0] if lines else None


def test_counts_agree_with_the_servers_metrics(serval, server):
    before = server.metrics()
    _, p = bench_serve(serval, server, "--requests", 12, "--input-len", 10, "--output-len", 9,
                       "--request-rate", 300, "--max-concurrency", 4)
    after = server.metrics()
    assert (p["mode"], p["model"], p["requests"], p["completed"], p["failed"]) == ("serve", "stories", 12, 12, 0)
    assert (p["prompt_tokens"], p["output_tokens"]) == (120, 108)
    assert after["serval:generation_tokens_total"] - before["serval:generation_tokens_total"] == 108
    assert after["serval:prompt_tokens_total"] - before["serval:prompt_tokens_total"] == 120
    assert 1 <= p["most_in_flight"] <= 4 and p["max_concurrency"] == 4
    for name in ["ttft", "tpot", "e2e"]:
        assert 0 < p[f"{name}_ms_p50"] <= p[f"{name}_ms_p90"] <= p[f"{name}_ms_p99"], name
        assert p[f"{name}_ms_mean"] > 0, name
    assert p["ttft_ms_p99"] <= p["e2e_ms_p99"]
    assert p["duration_s"] >= p["last_arrival_s"] > 0
    assert p["output_tokens_per_s"] == pytest.approx(108 / p["duration_s"])
    assert p["requests_per_s"] == pytest.approx(12 / p["duration_s"])
    assert "goodput_requests_per_s" not in p


def test_arrivals_follow_the_rate_and_the_seed(serval, server):
    args = ["--requests", 8, "--input-len", 4, "--output-len", 2, "--request-rate", 50]
    _, a = bench_serve(serval, server, *args, "--seed", 5)
    _, b = bench_serve(serval, server, *args, "--seed", 5)
    _, c = bench_serve(serval, server, *args, "--seed", 6)
    assert a["last_arrival_s"] == b["last_arrival_s"] != c["last_arrival_s"]
    # 7 exponential gaps of mean 20 ms: far from 0, far from seconds.
    assert 0.01 < a["last_arrival_s"] < 2 and a["duration_s"] >= a["last_arrival_s"]
    _, burst = bench_serve(serval, server, "--requests", 6, "--input-len", 4, "--output-len", 2)
    assert burst["request_rate"] == "inf" and burst["last_arrival_s"] == 0


def test_a_shared_prefix_hits_the_servers_prefix_cache(serval, server):
    args = ["--requests", 8, "--input-len", 8, "--output-len", 4, "--request-rate", 100]
    _, plain = bench_serve(serval, server, *args)
    _, shared = bench_serve(serval, server, *args, "--prefix-len", 32)
    assert plain["server_prefix_cache_hit_rate"] == 0 and plain["server_preemptions"] == 0
    assert (shared["prefix_len"], shared["prompt_tokens"]) == (32, 8 * 40)
    # Two blocks of 16 of each 40-token prompt, for most requests after the first.
    assert 0.3 <= shared["server_prefix_cache_hit_rate"] <= 7 * 32 / 320


def test_goodput_counts_requests_within_the_limits(serval, server):
    args = ["--requests", 6, "--input-len", 8, "--output-len", 6]
    _, loose = bench_serve(serval, server, *args, "--slo-ttft-ms", 60000, "--slo-tpot-ms", 60000)
    assert loose["goodput_requests_per_s"] == pytest.approx(loose["requests_per_s"])
    _, tight = bench_serve(serval, server, *args, "--slo-tpot-ms", 1e-6)
    assert tight["goodput_requests_per_s"] == 0 and tight["slo_ttft_ms"] is None


def test_requests_from_a_jsonl_and_a_failure_named(serval, server, tmp_path):
    lines = [{"prompt": "Once upon a time", "max_tokens": 5},
             {"prompt": [1, 2, 3], "max_tokens": -1},
             {"prompt": [5, 6, 7]}]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc, p = bench_serve(serval, server, "--input", path, "--output-len", 3, check=False)
    assert proc.returncode != 0
    assert "1 of 3 requests failed" in proc.stderr and "'max_tokens' must be in" in proc.stderr, proc.stderr
    assert (p["completed"], p["failed"], p["output_tokens"]) == (2, 1, 5 + 3)  # the last line: --output-len
    assert server.post("/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200  # still serving


def test_chat_requests_from_a_jsonl(serval, models, tmp_path):
    template = Path(__file__).parent / "chat_templates" / "llama31_style.jinja"
    chat = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--chat-template", template)
    try:
        lines = [{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
                 {"messages": [{"role": "user", "content": "Tell me a story"}]}]
        path = tmp_path / "chat.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        before = chat.metrics()
        _, p = bench_serve(serval, chat, "--endpoint", "chat", "--input", path, "--output-len", 7,
                           "--request-rate", 20)
        after = chat.metrics()
        assert (p["endpoint"], p["completed"], p["output_tokens"]) == ("chat", 2, 5 + 7)
        assert 0 < p["ttft_ms_p50"] <= p["e2e_ms_p50"]
        # The server computed what it was not given from its prefix cache.
        computed = after["serval:prompt_tokens_total"] - before["serval:prompt_tokens_total"]
        assert computed == pytest.approx(p["prompt_tokens"] * (1 - p["server_prefix_cache_hit_rate"]))
        proc = run_serval(serval, "bench", "--mode", "serve", "--url", chat.url, "--endpoint", "chat", check=False)
        assert proc.returncode != 0 and "--endpoint chat takes its requests from --input" in proc.stderr
    finally:
        chat.stop()


@pytest.mark.parametrize("args,message", [
    (["--url", "http://127.0.0.1:1"], "cannot reach an OpenAI-compatible server at http://127.0.0.1:1"),
    (["--url", "https://example.com"], "https is not supported"),
    (["--url", "http://127.0.0.1:99999"], "bad port"),
    (["--kv-cache-tokens", "64"], "--kv-cache-tokens does not apply to --mode serve"),
    (["--device", "cpu"], "--device does not apply to --mode serve"),
    (["--request-rate", "0"], "--request-rate must be positive"),
    (["--max-concurrency", "-1"], "--max-concurrency must be positive"),
    (["--input-len", "2040", "--output-len", "20"], "exceeds the server's max_model_len of 2048"),
    (["--prefix-len", "-1"], "--prefix-len must not be negative"),
])
def test_bad_arguments_name_the_problem(serval, server, args, message):
    url = [] if "--url" in args else ["--url", server.url]
    proc = run_serval(serval, "bench", "--mode", "serve", *url, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_serve_flags_refused_by_other_modes(serval, models):
    proc = run_serval(serval, "bench", "--mode", "engine", "--model", models / "stories260K" / "stories260K.gguf",
                      "--request-rate", 3, check=False)
    assert proc.returncode != 0 and "--request-rate does not apply to --mode engine" in proc.stderr
