"""Robustness: over 10,000 malformed or hostile requests (mutated JSON, wrong types, huge
numbers, negative max_tokens, invalid UTF-8, deep nesting, broken HTTP, a 100 MB body,
slowloris partial headers). Each is answered with a 4xx or the connection is closed
(never a 5xx, never a crash), and valid requests interleaved with them still succeed."""
import json
import random
import socket
import threading
import time

import pytest

from serval_server import ServalServer  # noqa: E402

TOTAL = 10_400
WORKERS = 32  # some broken requests are only closed at the 2 s read deadline
VALID = {"model": "test-model", "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "seed", "logprobs",
          "echo", "stream", "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
          "min_tokens", "stream_options", "model", "messages"]
WRONG = [None, True, -1, 0, 3.5, "x", "", [], {}, [1, "a"], {"a": 1}, 10 ** 30, -(10 ** 30), 1e308, -1e-308,
         "\u0000", [[[]]], "9" * 400]


def http(method, path, body: bytes, extra=b""):
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + extra + b"\r\n" + body


def mutated(rng):
    data = bytearray(json.dumps(VALID).encode())
    for _ in range(rng.randint(1, 4)):
        if not data:
            data = bytearray(b"{")
        op, i = rng.randrange(4), rng.randrange(len(data))
        if op == 0:
            del data[i]
        elif op == 1:
            data.insert(i, rng.randrange(256))
        elif op == 2:
            data[i] = rng.randrange(256)
        else:
            del data[i:]
            if not data:
                data = bytearray(b"{")
    return http("POST", "/v1/completions", bytes(data))


def wrong_type(rng):
    body = dict(VALID)
    body[rng.choice(FIELDS)] = rng.choice(WRONG)
    path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize"])
    return http("POST", path, json.dumps(body).encode())


def huge_or_negative(rng):
    body = dict(VALID)
    field = rng.choice(["max_tokens", "n", "logprobs", "top_k", "min_tokens", "seed", "max_tokens"])
    raw = rng.choice(["-1", "-100000", "1e400", "-1e400", "18446744073709551616", "99999999999999999999999999",
                      "NaN", "Infinity", "2147483648", "-2147483649"])
    text = json.dumps(body).replace('"max_tokens": 2', f'"max_tokens": 2, "{field}": {raw}', 1)
    if field == "max_tokens":
        text = json.dumps({k: v for k, v in body.items() if k != "max_tokens"})[:-1] + f', "max_tokens": {raw}}}'
    return http("POST", "/v1/completions", text.encode())


def bad_utf8(rng):
    bad = rng.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"abc\xe2\x82"])
    body = b'{"model": "test-model", "prompt": "Once ' + bad + b'", "max_tokens": 2}'
    if rng.random() < 0.3:
        body = b'{"prompt": "\\ud800 lone surrogate", "max_tokens": 2}'
    return http("POST", rng.choice(["/v1/completions", "/detokenize", "/tokenize"]), body)


def deep(rng):
    d = rng.choice([200, 5000, 100000])
    return http("POST", "/v1/completions", b'{"prompt": ' + b"[" * d + b"]" * d + b"}")


def broken_http(rng):
    return rng.choice([
        b"GARBAGE\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
        b"POST /v1/completions HTTP/9.9\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nNoColonHeader\r\n\r\n",
        b"POST /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nX: " + b"b" * 20000 + b"\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /v1/completions HTTP/1.1\r\n\r\n",
        b"DELETE /v1/models HTTP/1.1\r\n\r\n",
        http("POST", "/v1/nope", b"{}"),
        bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n",
    ])


def chat_junk(rng):
    messages = rng.choice([[{"role": "user"}], [{"content": "x"}], [{"role": "user", "content": [{"type": "image"}]}],
                           [{"role": "assistant", "tool_calls": 5}], "x", [[]], [{"role": "user", "content": None}]])
    return http("POST", "/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": 2}).encode())


KINDS = [mutated, wrong_type, huge_or_negative, bad_utf8, deep, broken_http, chat_junk]


def complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def exchange(port, data, timeout=10.0):
    """Sends one request on a fresh connection; returns (status, body) or (None, b"") if closed."""
    # No half-close after sending: the server takes a closed read side for a client gone.
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        reply = b""
        try:
            while not complete(reply):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except OSError:
            pass
    if not reply:
        return None, b""
    status = int(reply.split(b" ", 2)[1])
    return status, reply.partition(b"\r\n\r\n")[2]


def worker(port, seed, count, failures, all_counts):
    rng = random.Random(seed)
    counts = {"valid": 0}
    all_counts.append(counts)  # one dict per thread: no lost updates
    for i in range(count):
        if i % 50 == 0:  # a valid request between the hostile ones
            status, body = exchange(port, http("POST", "/v1/completions", json.dumps(VALID).encode()))
            if status != 200 or json.loads(body)["usage"]["completion_tokens"] != 2:
                failures.append(("valid", status, body[:200]))
            counts["valid"] += 1
            continue
        kind = rng.choice(KINDS)
        data = kind(rng)
        status, body = exchange(port, data)
        counts[kind.__name__] = counts.get(kind.__name__, 0) + 1
        # A mutation or a 'wrong' value can happen to be valid (temperature 0, seed -1): then 200 is right.
        ok = status is None or 400 <= status < 500 or (status == 200 and kind in (mutated, wrong_type, huge_or_negative))
        if not ok:
            failures.append((kind.__name__, status, data[:200], body[:300]))
        elif status is not None and status >= 400 and b'"error"' not in body and b"HTTP/9" not in data:
            failures.append(("shape", kind.__name__, status, data[:200], body[:300]))


def test_hostile_requests(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--max-body-bytes", "1000000",
                     "--request-read-timeout", "2", "--max-model-len", "256", threads=1)
    try:
        # Slowloris: connections that trickle their headers are cut after the read timeout.
        slow = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(40)]
        for c in slow:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")

        # 100 MB body: refused (413) or cut without reading it all.
        big_result = {}

        def big_body():
            start = time.time()
            with socket.create_connection(("127.0.0.1", s.port), timeout=20) as c:
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 104857600\r\n\r\n")
                sent = 0
                try:
                    block = b"x" * 65536
                    while sent < 104857600:
                        c.sendall(block)
                        sent += len(block)
                except OSError:
                    pass
                try:
                    big_result["reply"] = c.recv(4096)
                except OSError:
                    big_result["reply"] = b""
            big_result["sent"], big_result["s"] = sent, time.time() - start

        big = threading.Thread(target=big_body)
        big.start()

        failures, counts = [], []
        threads = [threading.Thread(target=worker, args=(s.port, seed, TOTAL // WORKERS, failures, counts))
                   for seed in range(WORKERS)]
        for t in threads:
            t.start()
        # Keep trickling: one byte per second, longer than the read timeout allows.
        for _ in range(4):
            time.sleep(1)
            for c in slow:
                try:
                    c.sendall(b"X")
                except OSError:
                    pass
        for t in threads:
            t.join()
        big.join()

        assert not failures, failures[:10]
        total = {k: sum(c.get(k, 0) for c in counts) for k in {k for c in counts for k in c}}
        assert sum(v for k, v in total.items() if k != "valid") >= 10_000, total
        assert total["valid"] >= 200, total
        reply = big_result["reply"]
        assert reply == b"" or reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert big_result["sent"] < 104857600 or reply.startswith(b"HTTP/1.1 413")
        closed = 0
        for c in slow:
            c.settimeout(5)
            try:
                data = c.recv(4096)
                closed += data == b"" or data.startswith(b"HTTP/1.1 4")
            except OSError:
                closed += 1
            c.close()
        assert closed == len(slow)
        # Still serving.
        assert s.post("/v1/completions", VALID)[0] == 200
    finally:
        assert s.stop() == 0
