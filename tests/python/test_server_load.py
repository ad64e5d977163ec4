"""Load: 256 concurrent streaming clients on loopback, a quarter of them disconnecting
at random points. The server stays up, every completed stream is well-formed SSE
ending in [DONE], and afterwards /metrics shows no KV block in use."""
import asyncio
import json
import random

import pytest

from serval_server import ServalServer, parse_sse, wait_until  # noqa: E402

CLIENTS = 256


async def one_client(port, rng, disconnect):
    """One streaming request over a raw socket (HTTP/1.1, chunked); returns the SSE text,
    or "disconnected" after closing the connection at a random chunk."""
    body = json.dumps({
        "model": "test-model", "prompt": rng.choice(["Once upon a time", "Lily", "The cat sat", "One day"]),
        "max_tokens": rng.randint(8, 48), "temperature": rng.choice([0.0, 0.8]), "seed": rng.randint(0, 99),
        "stream": True, "stream_options": {"include_usage": True}}).encode()
    cut_after = rng.randint(0, 12) if disconnect else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"Transfer-Encoding: chunked" in head, head
        raw, n = b"", 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return raw.decode(), json.loads(body)
            raw += data[:-2]
            n += 1
            if cut_after is not None and n > cut_after:
                return "disconnected", None
    finally:
        writer.close()


async def run_load(port, seed=0):
    rng = random.Random(seed)
    disconnect = [i % 4 == 0 for i in range(CLIENTS)]
    rng.shuffle(disconnect)
    return await asyncio.gather(*(one_client(port, random.Random(rng.random()), d) for d in disconnect))


def test_256_streaming_clients_with_disconnects(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--max-num-seqs", "256",
                     "--kv-cache-tokens", "32768", threads=2)
    try:
        results = asyncio.run(asyncio.wait_for(run_load(s.port), 120))
        completed = [(raw, body) for raw, body in results if raw != "disconnected"]
        assert len(completed) >= CLIENTS * 3 // 4
        for raw, body in completed:
            chunks = parse_sse(raw)
            usage = chunks[-1]["usage"]
            assert chunks[-1]["choices"] == [] and usage["completion_tokens"] <= body["max_tokens"]
            finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1]]
            assert finishes[-1] in ("length", "stop") and all(f is None for f in finishes[:-1])
        # The server is still up and every block is back.
        assert wait_until(lambda: s.metrics()["serval:kv_cache_blocks_used"] == 0, timeout=10), s.metrics()
        assert s.metrics()["serval:num_requests_running"] == 0
        assert s.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})[0] == 200
    finally:
        assert s.stop() == 0
    # Disconnects mid-stream were seen (and logged) as such.
    assert s.stderr.count("status=499") >= 10, s.stderr[-3000:]
