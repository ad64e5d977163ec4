"""scripts/soak.py: a 60-second soak of `serval serve` on stories260K with a small KV pool
(so that long prompts and n > 1 preempt), every request kind of the tool (streaming and
not, n > 1, stop strings, prompt logprobs, chat, disconnects, malformed bodies): no
failure, the KV cache back to idle after the drain, the server still healthy. And the tool
itself: its checks catch broken responses, and it exits 1 against a server that answers
500 and never frees its KV blocks. Nothing here depends on timing: the load is whatever
the machine manages in the time."""
import importlib.util
import json
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import REPO
from serval_server import ServalServer

SOAK = REPO / "scripts" / "soak.py"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def run_soak(*args, timeout=300):
    return subprocess.run([sys.executable, str(SOAK), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_soak_60_seconds(serval, models, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    # 2048 tokens of KV: one whole context, so a long prompt preempts everything else.
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--kv-cache-tokens", "2048",
                     "--chat-template", template, threads=1)
    try:
        report_path = tmp_path / "soak.json"
        proc = run_soak("--url", s.url, "--pid", s.proc.pid, "--duration", 60, "--concurrency", 6, "--seed", 1,
                        "--report", report_path, "--quiet")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-8000:]
        assert "soak summary" in out and "\nOK\n" in out, out[-3000:]
        r = json.loads(report_path.read_text())
        assert r["ok"] and r["problems"] == [] and r["failures"] == 0, r["problems"]
        assert r["chat"] is True and r["model"] == "test-model"
        assert r["requests"] >= 100, r["by_kind"]
        kinds = r["by_kind"]
        for kind in ("completion", "completion_stream", "chat", "chat_stream", "prompt_logprobs"):
            assert kinds.get(kind, {}).get("200", 0) > 0, kinds
        assert kinds["stream_cut"].get("cut", 0) > 0 and kinds["malformed"].get("400", 0) > 0, kinds
        assert r["completion_tokens"] > 0
        # After the drain: no block held by a request, nothing running or waiting.
        assert r["idle_after_drain"], r["kv_final"]
        final = r["kv_final"]
        assert (final["blocks_used"], final["running"], final["waiting"]) == (0, 0, 0), final
        assert final["blocks_used"] + final["blocks_cached"] + final["blocks_free"] == final["blocks_total"] == 128
        assert r["rss_mib"]["first"] > 0 and r["rss_mib"]["last"] > 0
        assert len(r["samples"]) >= 3
        # Still healthy and serving.
        with urllib.request.urlopen(s.url + "/health", timeout=10) as h:
            assert h.status == 200
        status, _, body = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    finally:
        assert s.stop() == 0
    assert "status=5" not in s.stderr, [line for line in s.stderr.splitlines() if "status=5" in line][:5]
    assert "status=499" in s.stderr  # the disconnects reached the server as such


# ---- the tool's own checks -------------------------------------------------------------------

@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def completion(text=" a time", finish="length", usage=(3, 4, 7), choices=1):
    return {"object": "text_completion", "id": "cmpl-1", "created": 1,
            "choices": [{"index": i, "text": text, "finish_reason": finish, "logprobs": None} for i in range(choices)],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[2]}}


@pytest.mark.parametrize("body,response,reason", [
    ({"prompt": "x", "max_tokens": 4}, completion(usage=(3, 4, 8)), "total_tokens"),
    ({"prompt": "x", "max_tokens": 4, "n": 2}, completion(), "choices != prompts x n"),
    ({"prompt": ["x", "y"], "max_tokens": 2}, completion(usage=(3, 4, 7), choices=2), ""),
    ({"prompt": "x", "max_tokens": 4}, completion(usage=(3, 3, 6)), "below the choices that ended by length"),
    ({"prompt": "x", "max_tokens": 4}, completion(usage=(3, 5, 8)), "above n x max_tokens"),
    ({"prompt": "x", "max_tokens": 4, "stop": " time"}, completion(finish="stop", usage=(3, 2, 5)), "stop string"),
    ({"prompt": "x", "max_tokens": 4}, completion(finish=None), "finish_reason"),
    ({"prompt": "x", "max_tokens": 4, "logprobs": 1}, completion(), "logprobs missing"),
])
def test_completion_checks(soak, body, response, reason):
    if not reason:
        soak.check_completion(body, response, 16)
        return
    with pytest.raises(soak.Fail) as e:
        soak.check_completion(body, response, 16)
    assert reason in e.value.reason


def test_stream_and_error_checks(soak):
    body = {"prompt": "x", "max_tokens": 2, "n": 2, "stream": True}
    chunk = {"object": "text_completion", "id": "c", "choices": [{"index": 0, "text": "a", "finish_reason": "length"}]}
    with pytest.raises(soak.Fail, match="not every choice"):  # index 1 never finished
        soak.check_stream(body, [chunk], False, 16)
    other = {**chunk, "choices": [{"index": 1, "text": "b", "finish_reason": "length"}]}
    soak.check_stream(body, [chunk, other], False, 16)
    with pytest.raises(soak.Fail, match="after the choice's finish_reason"):
        soak.check_stream(body, [chunk, chunk, other], False, 16)
    sse = soak.SSE()
    assert sse.feed(b'data: {"a": 1}\n\ndata: [DO') == [{"a": 1}]
    assert sse.feed(b"NE]\n\n") == [] and sse.done
    with pytest.raises(soak.Fail, match="after \\[DONE\\]"):
        sse.feed(b'data: {"b": 2}\n\n')
    good = json.dumps({"error": {"message": "m", "type": "invalid_request_error", "param": "n", "code": None}})
    soak.check_error_body(400, good.encode(), {400}, "n")
    for status, raw, reason in [(500, good, "expected HTTP 400"), (400, '{"detail": "x"}', "without an 'error'"),
                                (400, '{"error": {"message": "m"}}', "lacks"), (400, "<html>", "not JSON")]:
        with pytest.raises(soak.Fail, match=reason):
            soak.check_error_body(status, raw.encode(), {400}, None)
    with pytest.raises(soak.Fail, match="param"):
        soak.check_error_body(400, good.encode(), {400}, "max_tokens")


class BrokenServer(BaseHTTPRequestHandler):
    """Answers every generation with 500 and says it holds KV blocks forever."""
    protocol_version = "HTTP/1.1"

    def reply(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "stub", "max_model_len": 256}]}))
        elif self.path == "/metrics":
            self.reply(200, 'serval:cache_config_info{block_size="16",num_gpu_blocks="8"} 1.0\n'
                            "serval:kv_cache_blocks_used 3\nserval:kv_cache_blocks_free 5\n"
                            "serval:kv_cache_blocks_cached 0\nserval:kv_cache_usage_perc 0.375\n"
                            "serval:num_requests_running 0\nserval:num_requests_waiting 0\n", "text/plain")
        else:
            self.reply(200, "{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        error = {"error": {"message": "no", "type": "invalid_request_error", "param": None, "code": None}}
        if self.path == "/v1/chat/completions":  # no chat template
            self.reply(400, json.dumps(error))
        else:
            self.reply(500, json.dumps(error))

    def log_message(self, *args):
        pass


def test_the_tool_fails_on_500s_and_kv_blocks_never_freed(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), BrokenServer)
    server.handle_error = lambda request, address: None  # the tool's cut connections
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        report_path = tmp_path / "soak.json"
        proc = run_soak("--url", f"http://127.0.0.1:{server.server_port}", "--duration", 2, "--concurrency", 2,
                        "--interval", 1, "--drain-timeout", 1, "--report", report_path, "--quiet", timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report_path.read_text())
    assert not r["ok"] and r["failures"] > 0
    assert any("HTTP 500" in key for key in r["failure_examples"]), list(r["failure_examples"])
    assert any(p.startswith("not idle") for p in r["problems"]), r["problems"]
    assert "FAILED:" in proc.stdout
