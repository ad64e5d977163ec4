"""A client that disconnects mid-request (streaming or not) aborts it and its KV blocks
are freed; SIGTERM drains (in-flight requests finish, new connections are refused) and
exits 0; past --shutdown-timeout the rest are aborted with a final event."""
import json
import signal
import socket
import threading
import urllib.request

import pytest

from conftest import run_serval
from serval_server import ServalServer, accepts_connections, parse_sse, wait_until  # noqa: E402

MODEL = ("stories260K", "stories260K.gguf")


@pytest.fixture()
def server(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL), "--max-model-len", "512")
    yield s
    s.stop()


def raw_request(port, path, body):
    conn = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return conn


def blocks_used(server):
    return server.metrics()["serval:kv_cache_blocks_used"]


def running(server):
    return server.metrics()["serval:num_requests_running"]


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_aborts_and_frees_blocks(server, stream):
    # Long generations (ignore_eos, 2000 tokens cut by the 512 context) that only end by abort.
    conns = [raw_request(server.port, "/v1/completions",
                         {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True, "stream": stream})
             for _ in range(4)]
    assert wait_until(lambda: running(server) == 4 and blocks_used(server) > 0, timeout=10)
    if stream:
        assert conns[0].recv(4096).startswith(b"HTTP/1.1 200")
    for c in conns:
        c.close()
    assert wait_until(lambda: blocks_used(server) == 0 and running(server) == 0, timeout=5), server.metrics()
    aborted = server.metrics()  # the requests ended as aborts, not as completions
    assert server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})[0] == 200
    log = server.stop()
    assert server.stderr.count("status=499") >= 4, server.stderr[-2000:]


def test_sigterm_drains_in_flight_requests_and_exits_0(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL), "--shutdown-timeout", "30")
    results = {}

    def stream_one(i):
        body = {"prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True, "stream": True}
        req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            results[i] = parse_sse(r.read().decode())

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    assert wait_until(lambda: s.metrics()["serval:num_requests_running"] == 3, timeout=10)
    s.proc.send_signal(signal.SIGTERM)
    # No longer accepting, however long the signal takes to act on a loaded machine.
    assert wait_until(lambda: not accepts_connections(s.port), timeout=20)
    for t in threads:
        t.join()
    assert s.proc.wait(timeout=30) == 0
    s.stop()
    for chunks in results.values():  # each finished normally, not cut
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"][0]["text"]) > 0
    assert len(results) == 3
    assert "draining" in s.stderr


def test_shutdown_timeout_aborts_the_rest_with_a_final_event(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL), "--shutdown-timeout", "0.5", "--max-num-seqs", "1")
    out = {}

    def stream_one():
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out["chunks"] = parse_sse(r.read().decode())

    t = threading.Thread(target=stream_one)
    t.start()
    assert wait_until(lambda: s.metrics()["serval:num_requests_running"] == 1, timeout=10)
    s.proc.send_signal(signal.SIGINT)
    t.join(timeout=30)
    assert s.proc.wait(timeout=30) == 0
    s.stop()
    assert out["chunks"][-1]["choices"][0]["finish_reason"] == "abort"


@pytest.mark.parametrize("flag,want", [([], "off"), (["--async-scheduling", "on"], "on"),
                                       (["--no-async-scheduling"], "off")])
def test_startup_line_says_whether_steps_are_scheduled_asynchronously(serval, models, monkeypatch, flag, want):
    # Off by default on the CPU, where a step runs inside its start; "on" forces it (for tests).
    monkeypatch.delenv("SERVAL_SERVER_ARGS", raising=False)
    s = ServalServer(serval, models.joinpath(*MODEL), *flag)
    try:
        assert f"async scheduling: {want})" in s.read_log()
    finally:
        s.stop()


def test_warmup_runs_before_serving_and_stays_out_of_the_metrics(serval, models):
    # --warmup on (by default only where decode steps run from CUDA graphs):
    # decode batches of 1..--max-num-seqs before the server listens, through
    # an engine of its own; /metrics then counts only the clients' requests.
    s = ServalServer(serval, models.joinpath(*MODEL), "--warmup", "on", "--max-num-seqs", 4,
                     "--max-num-batched-tokens", 32)
    try:
        log = s.read_log()
        assert "warm-up: decode steps of 1..4 sequences in" in log
        assert log.index("warm-up:") < log.index("serving '")
        m = s.metrics()
        assert m["serval:prompt_tokens_total"] == m["serval:generation_tokens_total"] == 0
        status, _, body = s.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        m = s.metrics()
        assert (m["serval:prompt_tokens_total"], m["serval:generation_tokens_total"]) == (3, 4)
    finally:
        s.stop()
    plain = ServalServer(serval, models.joinpath(*MODEL))
    try:
        assert "warm-up" not in plain.read_log()  # auto: no graphs on the CPU
    finally:
        plain.stop()
    proc = run_serval(serval, "serve", "--model", models.joinpath(*MODEL), "--warmup", "maybe", check=False)
    assert proc.returncode != 0 and "maybe not in" in proc.stderr


def test_a_busy_port_is_an_error_at_start_up(serval, models, server):
    # A second serval serve on the same port exits instead of sharing it.
    proc = run_serval(serval, "serve", "--model", models.joinpath(*MODEL), "--port", server.port,
                      check=False, timeout=120)
    assert proc.returncode != 0
    assert "address already in use" in proc.stderr and str(server.port) in proc.stderr, proc.stderr
    # So does one on a port another program listens on.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = run_serval(serval, "serve", "--model", models.joinpath(*MODEL), "--port", port,
                          check=False, timeout=120)
    assert proc.returncode != 0 and "address already in use" in proc.stderr and str(port) in proc.stderr
    # The first server still answers every request itself.
    for _ in range(6):
        assert server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})[0] == 200
    assert server.stop() == 0
    assert server.stderr.count("POST /v1/completions status=200") == 6, server.stderr[-2000:]
