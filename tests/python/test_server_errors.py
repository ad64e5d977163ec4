"""Every error of issue 4 in OpenAI's shape with the right status: malformed JSON and
wrong types (400 naming the parameter), unknown model (404), context overflow (400
with the numbers), full queue (429 + Retry-After), API key (401), body limit (413),
shutting down (503)."""
import json
import signal
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")

from serval_server import ServalServer, accepts_connections, read_response, wait_until  # noqa: E402

KEY = "sk-serval-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--api-key", KEY,
                     "--max-body-bytes", "4096", "--max-num-seqs", "1", "--max-queued-requests", "1",
                     "--max-model-len", "256")
    yield s
    s.stop()


def assert_error(status, body, want_status, param=None):
    assert status == want_status, body
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("raw", ['{"prompt": "x", ', "not json", '[1, 2]', '"just a string"', ""])
def test_malformed_json_is_400(server, raw):
    status, _, body = server.post("/v1/completions", raw, AUTH)
    assert_error(status, body, 400)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("max_tokens", "10"), ("max_tokens", 1.5), ("top_p", [1]), ("n", True),
    ("stream", "yes"), ("stop", 5), ("seed", "x"), ("logprobs", {}), ("prompt", 123), ("prompt", [[1], "a", 2.5]),
    ("echo", 1), ("top_k", "3"), ("presence_penalty", None and 0 or "0"), ("stream_options", 3),
])
def test_wrong_types_name_the_parameter(server, field, value):
    body = {"model": "test-model", "prompt": "Once", "max_tokens": 4, field: value}
    status, _, resp = server.post("/v1/completions", body, AUTH)
    assert_error(status, resp, 400, param=field)


@pytest.mark.parametrize("field,value", [
    ("max_tokens", -1), ("top_p", 1.5), ("temperature", -0.5), ("n", 0), ("n", 10 ** 30), ("logprobs", 99),
    ("presence_penalty", 3), ("max_tokens", 10 ** 20), ("min_p", 2), ("repetition_penalty", 0),
    ("temperature", 1e300), ("frequency_penalty", -1e39),
])
def test_out_of_range_names_the_parameter(server, field, value):
    body = {"model": "test-model", "prompt": "Once", "max_tokens": 4, field: value}
    status, _, resp = server.post("/v1/completions", body, AUTH)
    assert_error(status, resp, 400, param=field)


def test_a_number_too_large_for_a_float_is_named_not_inf(server):
    body = {"model": "test-model", "prompt": "Once", "max_tokens": 4, "temperature": 1e300}
    status, _, resp = server.post("/v1/completions", body, AUTH)
    msg = assert_error(status, resp, 400, param="temperature")["message"]
    assert "too large for a 32-bit float" in msg and "1e+300" in msg and "inf" not in msg, msg


def test_chat_field_errors(server):
    for body, param in [({"messages": "hi"}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
                        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
                        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
                         "max_completion_tokens")]:
        status, _, resp = server.post("/v1/chat/completions", body, AUTH)
        assert_error(status, resp, 400, param=param)


def test_unknown_model_is_404(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-17", prompt="Once", max_tokens=2)
    assert e.value.status_code == 404
    assert "gpt-17" in e.value.body["message"] and e.value.body["code"] == "model_not_found"


def test_context_overflow_is_400_with_the_numbers(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=300)
    msg = e.value.body["message"]
    assert "256" in msg and "300" in msg and "5" in msg and e.value.body["param"] == "max_tokens"
    status, _, resp = server.post("/v1/completions", {"prompt": [7] * 300, "max_tokens": 1}, AUTH)
    err = assert_error(status, resp, 400, param="prompt")
    assert "300" in err["message"] and "256" in err["message"]


def test_token_ids_outside_vocabulary_are_400(server):
    status, _, resp = server.post("/v1/completions", {"prompt": [1, 512], "max_tokens": 1}, AUTH)
    assert_error(status, resp, 400, param="prompt")


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, _, resp = server.post("/v1/completions", {"prompt": "Once", "max_tokens": 1}, headers)
        assert_error(status, resp, 401)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    status, _, _ = server.post("/v1/completions", {"prompt": "Once", "max_tokens": 1}, AUTH)
    assert status == 200
    import urllib.request
    with urllib.request.urlopen(server.url + "/health") as r:  # health and metrics stay open
        assert r.status == 200


def test_body_over_limit_is_413(server):
    status, _, resp = server.post("/v1/completions", {"prompt": "x" * 5000, "max_tokens": 1}, AUTH)
    err = assert_error(status, resp, 413)
    assert err["code"] == "request_too_large"


def test_queue_full_is_429_with_retry_after(server):
    results = []

    def one():
        results.append(server.post("/v1/completions", {"prompt": "Once", "max_tokens": 200, "ignore_eos": True},
                                   AUTH))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r[0] for r in results)
    assert 200 in statuses and 429 in statuses, statuses
    for status, headers, body in results:
        if status == 429:
            assert_error(status, body, 429)
            assert headers.get("Retry-After") == "1"


def test_requests_while_draining_get_503(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--shutdown-timeout", "5",
                     "--max-num-seqs", "1")
    # A long request in flight keeps the server draining.
    long = threading.Thread(target=lambda: s.post("/v1/completions", {"prompt": "Once", "max_tokens": 2000,
                                                                     "ignore_eos": True}))
    long.start()
    body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
    conn = socket.create_connection(("127.0.0.1", s.port))
    # A whole request first: the server's thread for this connection then waits
    # on it for the next one and takes its first bytes at once.
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(conn).startswith(b"HTTP/1.1 200")
    # The request half sent (headers unfinished) when the drain begins. A drain
    # closes a connection whose thread has not started reading its request:
    # nothing outside the server tells when it has, so this one wait stays.
    conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: not accepts_connections(s.port), timeout=20)  # draining
    conn.sendall(b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        reply += chunk
    conn.close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), head
    assert b"Retry-After: 1" in head
    assert_error(503, json.loads(payload), 503)
    long.join()
    assert s.stop() == 0
