#!/usr/bin/env python3
"""Soak test for an OpenAI-compatible server (`serval serve` first of all): mixed load for a
given time, every response checked, the server's RSS and KV cache sampled over time.

Usage:
  scripts/soak.py --url http://127.0.0.1:8000 [--pid PID] --duration 60 [--concurrency 8]
                  [--seed 1] [--report FILE.json]
  scripts/soak.py --serve build/serval --model MODEL.gguf [--serve-args "--kv-cache-tokens 2048"]
                  --duration 60 ...

With --serve the tool starts `BINARY serve --model MODEL` on a free port itself (access log
in a temporary file, counted by status at the end) and stops it with SIGTERM at the end,
which must exit 0. With --url it drives a running server; --pid (or, for a loopback URL,
the process found listening on the port) gives the process whose RSS is sampled.

--concurrency threads send, for --duration seconds, a seeded random mix of:
  completion, completion_stream   /v1/completions: prompts as text, token ids or lists of
                                  either, n 1..3, max_tokens 0..64, stop strings, logprobs,
                                  seeds, temperature 0 and > 0, stream_options.include_usage
  chat, chat_stream               /v1/chat/completions, only when the model has a chat
                                  template (a probe request answered 400 turns them off)
  prompt_logprobs                 echo + logprobs (max_tokens 0 included) and vLLM's
                                  prompt_logprobs
  odd                             spec-valid edge values: top_p 0, stop "", an empty
                                  prompt, max_tokens 0, seeds -1 and 2^63-1, temperature
                                  100, logprobs 20, non-ASCII prompts, penalties at the ends
  big                             n 8..16, or a prompt that needs (almost) the whole KV
                                  cache (forces preemption of everything else)
  stream_cut                      reads 0..6 SSE events of a long stream, then closes
  request_cut                     closes before the answer of a non-streamed request, in
                                  the middle of the body, or without sending anything
  malformed                       invalid JSON, wrong types, out-of-range values, unknown
                                  model, prompts over the context, unknown routes, a 9 MiB body
  keepalive                       several requests (valid and malformed) on one connection
  misc                            /health, /v1/models, /metrics, /tokenize + /detokenize
(--mix kind=weight,... changes the weights; weight 0 turns a kind off.)

Every response is checked: a 200 has the right shape (choices = prompts x n with every index
once, finish_reason set, usage with total = prompt + completion and completion tokens within
what max_tokens and the finish reasons allow, no stop string in the text, logprobs lists of
one length), a stream is well-formed SSE ending in `data: [DONE]` with every choice finished
once (unless the client cut it), an error is the expected 4xx with an OpenAI-shaped body
{"error": {"message", "type", "param", "code"}} naming the parameter. Any 5xx, any
connection refused, reset or closed that the client did not cause, and any timeout
(--request-timeout) is a failure.

Every --interval seconds it prints a sample: the server's RSS (VmRSS of /proc/PID/status),
the KV cache from /metrics (usage, blocks used / cached / free), running and waiting
requests, preemptions, requests done and failures so far. At the end it lets the load
finish, waits up to --drain-timeout for the server to go idle, takes a last sample, prints a
summary (requests by kind and status, failures with their first examples, RSS first / after
warm-up / max / last, KV after the drain) and writes --report as JSON.

Exit status: 0 when all is well; 1 when a request failed, the server died, the KV cache
did not come back to idle after the drain (blocks still used by requests; blocks holding
cached prefixes are fine), requests still run or wait, the block gauges do not add up to
the pool, or the RSS grew grossly: the last sample above --rss-leak-factor (2) times the
RSS after --warmup (10) seconds and --rss-leak-mib (200) MiB above it; 2 on a usage or
start-up error. Python's standard library only.
"""
import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

STORY_PROMPTS = [
    "Once upon a time", "Lily", "The cat sat on the mat", "One day, a little girl named Sue",
    "Tom and his dog went to the park.", "There was a big red ball", "Mom said",
    "The sun was shining and the birds were singing. Ben wanted to play outside with his friends,",
    "Once upon a time, in a small house near the woods, there lived an old man who liked to",
    "Sara had a toy. She", "\"Can I have some?\" asked Tim.", "It was a rainy day",
]
ODD_PROMPTS = ["", " ", "\n\n", "日本語 🦊 ünïcode — ça marche", "a" * 300, "\t\"quotes\" and \\backslashes\\",
               "Once upon a time " * 20, "<s> </s> [INST] <|im_start|>", "\u00e9\u0301 \U0001f600\U0001f600"]
STOPS = [".", ",", " the", " and", "\n", "!", "Lily", " was", "zq-never-zq",
         "a stop string far longer than anything the model will ever write in one go, surely", " he", "y"]
SYSTEMS = ["You are a helpful assistant.", "Answer in one short sentence.", ""]
USERS = ["Hi", "Tell me a story about a cat.", "What is 2 + 2?", "Write a haiku about rain.",
         "Say something.", "Continue: once upon a time"]
KIND_WEIGHTS = {
    "completion": 22, "completion_stream": 18, "chat": 8, "chat_stream": 8, "prompt_logprobs": 8,
    "odd": 6, "big": 3, "stream_cut": 10, "request_cut": 5, "malformed": 12, "keepalive": 4, "misc": 3,
}
CHAT_KINDS = ("chat", "chat_stream")


class Fail(Exception):
    """A check that failed: reason is short and fixed (it groups failures), detail is free."""

    def __init__(self, reason, detail=""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def check(cond, reason, detail=""):
    if not cond:
        raise Fail(reason, detail)


# ---------------------------------------------------------------------------------------------
# A small HTTP/1.1 client over a socket: the tool must close connections at chosen points and
# tell a connection the server dropped from one the client cut, which http.client hides.

class ServerClosed(Exception):
    pass


class Response:
    def __init__(self, status, headers):
        self.status, self.headers = status, headers


class Conn:
    def __init__(self, host, port, timeout, api_key=None):
        self.host, self.port, self.api_key = host, port, api_key
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.requests = 0
        self.on_send = None  # called with a text excerpt of each request sent

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, method, path, body=None, close=True, content_length=None):
        """Sends a request; body is bytes (or None); content_length overrides the header."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}")
        if body is not None:
            lines += ["Content-Type: application/json",
                      f"Content-Length: {len(body) if content_length is None else content_length}"]
        if close:
            lines.append("Connection: close")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        self.requests += 1
        if self.on_send is not None:
            self.on_send(f"{method} {path} " + (body or b"")[:400].decode("utf-8", "replace"))

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ServerClosed("the server closed the connection")
        self.buf += data

    def _until(self, sep, limit=1 << 20):
        while sep not in self.buf:
            if len(self.buf) > limit:
                raise Fail("protocol: header or chunk line too long")
            self._fill()
        head, _, self.buf = self.buf.partition(sep)
        return head

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_head(self):
        try:
            head = self._until(b"\r\n\r\n")
        except ServerClosed:
            raise ServerClosed("the server closed the connection before answering" +
                               (f" (partial: {self.buf[:80]!r})" if self.buf else ""))
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        check(len(parts) >= 2 and parts[0].startswith("HTTP/1.") and parts[1].isdigit(),
              "protocol: malformed status line", lines[0][:200])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            check(sep, "protocol: malformed header line", line[:200])
            headers[name.strip().lower()] = value.strip()
        return Response(int(parts[1]), headers)

    def chunks(self, resp):
        """The body's pieces as they arrive (chunked transfer, Content-Length or to EOF)."""
        if resp.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = self._until(b"\r\n").split(b";", 1)[0].strip()
                check(re.fullmatch(rb"[0-9a-fA-F]+", line or b"x"), "protocol: bad chunk size", repr(line[:40]))
                size = int(line, 16)
                data = self._exact(size + 2)
                check(data[-2:] == b"\r\n", "protocol: chunk not followed by CRLF")
                if size == 0:
                    return
                yield data[:-2]
        elif "content-length" in resp.headers:
            left = int(resp.headers["content-length"])
            while left > 0:
                if not self.buf:
                    self._fill()
                piece, self.buf = self.buf[:left], self.buf[left:]
                left -= len(piece)
                yield piece
        else:
            if self.buf:
                yield self.buf
                self.buf = b""
            while True:
                try:
                    self._fill()
                except ServerClosed:
                    return
                yield self.buf
                self.buf = b""

    def read_body(self, resp):
        return b"".join(self.chunks(resp))


class SSE:
    """Splits a text/event-stream into its `data:` payloads, checking the framing."""

    def __init__(self):
        self.buf = b""
        self.done = False

    def feed(self, data):
        self.buf += data
        events = []
        while b"\n\n" in self.buf:
            event, _, self.buf = self.buf.partition(b"\n\n")
            text = event.decode("utf-8", errors="strict")
            check(text.startswith("data: ") and "\n" not in text, "stream: malformed SSE event", text[:200])
            check(not self.done, "stream: an event after [DONE]", text[:200])
            payload = text[len("data: "):]
            if payload == "[DONE]":
                self.done = True
                continue
            try:
                events.append(json.loads(payload))
            except ValueError:
                raise Fail("stream: an event that is not JSON", payload[:200])
        return events


# ---------------------------------------------------------------------------------------------
# Checks of the response shapes.

def check_error_body(status, raw, expect_status, expect_param=None):
    check(status in expect_status, f"expected HTTP {'/'.join(map(str, sorted(expect_status)))}",
          f"got {status}: {raw[:300]!r}")
    try:
        body = json.loads(raw)
    except ValueError:
        raise Fail("error body is not JSON", raw[:300])
    err = body.get("error") if isinstance(body, dict) else None
    check(isinstance(err, dict), "error body without an 'error' object", raw[:300])
    check({"message", "type", "param", "code"} <= set(err), "error object lacks message/type/param/code",
          raw[:300])
    check(isinstance(err["message"], str) and err["message"], "error message not a non-empty string", raw[:300])
    check(isinstance(err["type"], str), "error type not a string", raw[:300])
    if expect_param is not None:  # the field, or a part of it ("messages[0].content")
        param = err["param"]
        check(isinstance(param, str) and (param == expect_param or param.startswith((expect_param + "[",
                                                                                    expect_param + "."))),
              f"error param does not name '{expect_param}'", raw[:300])


def check_usage(usage, what="usage"):
    check(isinstance(usage, dict), f"{what} missing", repr(usage)[:200])
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    check(all(isinstance(x, int) and x >= 0 for x in (p, c, t)), f"{what} counts not integers >= 0", repr(usage))
    check(t == p + c, "usage total_tokens != prompt_tokens + completion_tokens", repr(usage))
    check(p > 0, "usage prompt_tokens is 0", repr(usage))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    check(isinstance(cached, int) and 0 <= cached <= p, "usage cached_tokens outside [0, prompt_tokens]",
          repr(usage))
    return p, c


def prompt_count(prompt):
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        return 1
    return len(prompt)


def max_tokens_of(body, default):
    for field in ("max_completion_tokens", "max_tokens"):
        if body.get(field) is not None:
            return body[field]
    return default


def check_token_bounds(body, finishes, completion_tokens, default_max):
    m = max_tokens_of(body, default_max)
    if m is None:
        return
    lengths = sum(1 for f in finishes if f == "length")
    check(completion_tokens <= len(finishes) * m, "usage completion_tokens above n x max_tokens",
          f"{completion_tokens} > {len(finishes)} x {m}")
    check(completion_tokens >= lengths * m, "usage completion_tokens below the choices that ended by length",
          f"{completion_tokens} < {lengths} x {m}")


def stops_of(body):
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    return [s for s in stops if s]


def check_no_stop_string(body, text):
    for s in stops_of(body):
        check(s not in text, "a stop string appears in the output", f"stop {s!r} in {text[:200]!r}")


def check_legacy_logprobs(lp, top_n, echo):
    check(isinstance(lp, dict), "logprobs missing", repr(lp)[:200])
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    check(all(isinstance(lp.get(k), list) for k in keys), "logprobs lacks a list", repr(lp)[:300])
    n = len(lp["tokens"])
    check(all(len(lp[k]) == n for k in keys), "logprobs lists of different lengths", repr(lp)[:300])
    for i, (t, v, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
        check(isinstance(t, str), "logprobs token not a string", repr(t))
        if v is None:
            check(echo and i == 0 and top is None, "a null token_logprob that is not the echoed first token",
                  repr(lp)[:300])
            continue
        check(isinstance(v, (int, float)) and v <= 1e-4, "a token_logprob above 0", repr(v))
        check(isinstance(top, dict) and len(top) <= top_n + 1, "top_logprobs entry not a dict of <= N+1",
              repr(top)[:200])
        check(all(isinstance(x, (int, float)) and x <= 1e-4 for x in top.values()),
              "a top_logprobs value above 0", repr(top)[:200])
    offsets = lp["text_offset"]
    check(all(isinstance(o, int) for o in offsets) and offsets == sorted(offsets), "text_offset not ascending",
          repr(offsets)[:200])
    return n


def check_prompt_logprobs(pl, prompt_len):
    check(isinstance(pl, list) and len(pl) == prompt_len, "prompt_logprobs not one entry per prompt token",
          f"{len(pl) if isinstance(pl, list) else pl!r} for {prompt_len} tokens")
    check(pl[0] is None, "prompt_logprobs does not start with null", repr(pl[:2])[:200])
    for entry in pl[1:]:
        check(isinstance(entry, dict) and entry, "prompt_logprobs entry not a dict", repr(entry)[:200])
        for tok, v in entry.items():
            check(tok.lstrip("-").isdigit() and isinstance(v, dict) and isinstance(v.get("logprob"), (int, float))
                  and v["logprob"] <= 1e-4 and isinstance(v.get("rank"), int) and v["rank"] >= 1,
                  "prompt_logprobs value malformed", repr(entry)[:200])


def check_completion(body, r, default_max):
    check(isinstance(r, dict) and r.get("object") == "text_completion", "not a text_completion", repr(r)[:300])
    check(isinstance(r.get("id"), str) and isinstance(r.get("created"), int), "id/created missing", repr(r)[:200])
    n, prompts = body.get("n", 1), prompt_count(body["prompt"])
    choices = r.get("choices")
    check(isinstance(choices, list) and len(choices) == n * prompts, "choices != prompts x n",
          f"{len(choices) if isinstance(choices, list) else choices!r} for {prompts} x {n}")
    check(sorted(c.get("index") for c in choices) == list(range(n * prompts)), "choice indices not 0..N-1",
          repr([c.get("index") for c in choices]))
    p, c = check_usage(r.get("usage"))
    finishes = []
    logprob_tokens = 0
    echo, lp_n = body.get("echo", False), body.get("logprobs")
    for ch in choices:
        check(isinstance(ch.get("text"), str), "choice text not a string", repr(ch)[:200])
        check(ch.get("finish_reason") in ("stop", "length"), "finish_reason not stop/length", repr(ch)[:300])
        finishes.append(ch["finish_reason"])
        if not echo:
            check_no_stop_string(body, ch["text"])
        elif isinstance(body["prompt"], str):
            check(ch["text"].startswith(body["prompt"]), "echo: text does not start with the prompt",
                  f"{body['prompt'][:80]!r} vs {ch['text'][:80]!r}")
        if lp_n is not None:
            logprob_tokens += check_legacy_logprobs(ch.get("logprobs"), lp_n, echo)
        else:
            check(ch.get("logprobs") is None, "logprobs returned that were not asked for", repr(ch)[:200])
        if body.get("prompt_logprobs") is not None and prompts == 1:
            check_prompt_logprobs(ch.get("prompt_logprobs"), p)
    check_token_bounds(body, finishes, c, default_max)
    if lp_n is not None and not stops_of(body):
        # Every token generated is scored; echo adds each choice's prompt tokens.
        expect = c + (p * n if echo and prompts == 1 else 0)
        if not echo or prompts == 1:
            check(logprob_tokens == expect, "logprobs tokens != completion_tokens (+ echoed prompt tokens)",
                  f"{logprob_tokens} vs {expect} (usage {r['usage']})")


def check_chat(body, r, default_max):
    check(isinstance(r, dict) and r.get("object") == "chat.completion", "not a chat.completion", repr(r)[:300])
    n = body.get("n", 1)
    choices = r.get("choices")
    check(isinstance(choices, list) and len(choices) == n, "choices != n", repr(r)[:300])
    check(sorted(c.get("index") for c in choices) == list(range(n)), "choice indices not 0..n-1", repr(r)[:300])
    p, c = check_usage(r.get("usage"))
    finishes, scored = [], 0
    for ch in choices:
        msg = ch.get("message")
        check(isinstance(msg, dict) and msg.get("role") == "assistant", "message role not assistant", repr(ch)[:300])
        check(isinstance(msg.get("content"), str), "message content not a string", repr(ch)[:300])
        check(ch.get("finish_reason") in ("stop", "length"), "finish_reason not stop/length", repr(ch)[:300])
        finishes.append(ch["finish_reason"])
        check_no_stop_string(body, msg["content"])
        if body.get("logprobs"):
            lp = ch.get("logprobs")
            check(isinstance(lp, dict) and isinstance(lp.get("content"), list), "chat logprobs.content missing",
                  repr(ch)[:300])
            for item in lp["content"]:
                check(isinstance(item.get("token"), str) and isinstance(item.get("logprob"), (int, float))
                      and item["logprob"] <= 1e-4 and isinstance(item.get("top_logprobs"), list)
                      and len(item["top_logprobs"]) <= body.get("top_logprobs", 0) + 1,
                      "chat logprobs item malformed", repr(item)[:300])
            scored += len(lp["content"])
    check_token_bounds(body, finishes, c, default_max)
    if body.get("logprobs") and not stops_of(body):
        check(scored == c, "chat logprobs items != completion_tokens", f"{scored} vs {c}")
    if body.get("prompt_logprobs") is not None:
        check_prompt_logprobs(r.get("prompt_logprobs"), p)


def check_stream(body, events, chat, default_max):
    """A whole stream's events (after [DONE]): every choice finished once, usage if asked."""
    n = body.get("n", 1)
    total = n if chat else n * prompt_count(body["prompt"])
    obj = "chat.completion.chunk" if chat else "text_completion"
    include_usage = (body.get("stream_options") or {}).get("include_usage", False)
    texts, finishes, roles, ids = {}, {}, set(), set()
    usage = None
    for i, ev in enumerate(events):
        check("error" not in ev, "stream: an error event in a 200 stream", repr(ev)[:300])
        check(ev.get("object") == obj, f"stream: chunk object is not {obj}", repr(ev)[:300])
        ids.add(ev.get("id"))
        check(usage is None, "stream: a chunk after the usage chunk", repr(ev)[:300])
        if ev.get("usage") is not None:
            check(include_usage, "stream: usage sent without include_usage", repr(ev)[:300])
            check(ev.get("choices") == [], "stream: the usage chunk has choices", repr(ev)[:300])
            usage = ev["usage"]
            continue
        check(isinstance(ev.get("choices"), list) and ev["choices"], "stream: a chunk without choices",
              repr(ev)[:300])
        for ch in ev["choices"]:
            idx = ch.get("index")
            check(isinstance(idx, int) and 0 <= idx < total, "stream: choice index out of range", repr(ch)[:200])
            check(idx not in finishes, "stream: a chunk after the choice's finish_reason", repr(ch)[:200])
            if chat:
                delta = ch.get("delta")
                check(isinstance(delta, dict), "stream: chat chunk without delta", repr(ch)[:200])
                if idx not in roles:
                    check(delta.get("role") == "assistant", "stream: first chat delta lacks role assistant",
                          repr(ch)[:200])
                    roles.add(idx)
                piece = delta.get("content") or ""
            else:
                piece = ch.get("text")
                check(isinstance(piece, str), "stream: chunk text not a string", repr(ch)[:200])
            texts[idx] = texts.get(idx, "") + piece
            if ch.get("finish_reason") is not None:
                check(ch["finish_reason"] in ("stop", "length"), "stream: finish_reason not stop/length",
                      repr(ch)[:200])
                finishes[idx] = ch["finish_reason"]
    check(len(ids) == 1, "stream: chunks with different ids", repr(ids)[:200])
    check(sorted(finishes) == list(range(total)), "stream: not every choice got a finish_reason",
          f"{sorted(finishes)} of {total}")
    if not body.get("echo"):
        for text in texts.values():
            check_no_stop_string(body, text)
    if include_usage:
        check(usage is not None, "stream: include_usage but no usage chunk")
        _, c = check_usage(usage)
        check_token_bounds(body, list(finishes.values()), c, default_max)
        return c
    return 0


# ---------------------------------------------------------------------------------------------
# The requests.

class Soak:
    def __init__(self, args, host, port, model, max_model_len, kv_tokens, chat, token_prompts):
        self.args, self.host, self.port, self.model = args, host, port, model
        self.max_model_len, self.kv_tokens, self.chat = max_model_len, kv_tokens, chat
        self.token_prompts = token_prompts  # token ids of STORY_PROMPTS (from /tokenize), may be empty
        self.lock = threading.Lock()
        self.counts = {}  # kind -> outcome -> count
        self.failures = {}  # "kind: reason" -> {"count", "examples"}
        self.n_failures = 0
        self.done = 0
        self.completion_tokens = 0
        self.tls = threading.local()
        self.stopped = threading.Event()  # set when the server died: no point in going on
        self.weights = {k: w for k, w in args.mix.items() if w > 0 and (chat or k not in CHAT_KINDS)}

    # -- bookkeeping
    def count(self, kind, outcome):
        with self.lock:
            d = self.counts.setdefault(kind, {})
            d[outcome] = d.get(outcome, 0) + 1
            self.done += 1

    def fail(self, kind, reason, detail, request):
        key = f"{kind}: {reason}"
        with self.lock:
            self.n_failures += 1
            f = self.failures.setdefault(key, {"count": 0, "examples": []})
            f["count"] += 1
            if len(f["examples"]) < 3:
                f["examples"].append({"detail": str(detail)[:600], "request": request[:400]})
        if not self.args.quiet:
            print(f"FAIL {key}: {str(detail)[:300]}", flush=True)

    def conn(self):
        c = Conn(self.host, self.port, self.args.request_timeout, self.args.api_key)
        c.on_send = self.note
        return c

    def note(self, text):
        """Remembers the request a worker sent last, for the failure examples."""
        before = getattr(self.tls, "request", "")
        self.tls.request = (before[-500:] + " || " if before else "") + text[:400]

    # -- helpers building bodies
    def prompt(self, rng, batch=True):
        r = rng.random()
        if r < 0.55 or not self.token_prompts:
            p = rng.choice(STORY_PROMPTS)
        elif r < 0.75:
            p = list(rng.choice(self.token_prompts))
        elif not batch:
            p = rng.choice(STORY_PROMPTS)
        elif r < 0.9:
            p = rng.sample(STORY_PROMPTS, rng.randint(2, 3))
        else:
            p = [list(x) for x in rng.sample(self.token_prompts, rng.randint(2, 3))]
        return p

    def sampling(self, rng, body):
        if rng.random() < 0.4:
            body["temperature"] = 0.0
        else:
            body["temperature"] = round(rng.uniform(0.3, 1.3), 2)
            if rng.random() < 0.5:
                body["seed"] = rng.randint(0, 2 ** 31)
            if rng.random() < 0.3:
                body["top_p"] = round(rng.uniform(0.5, 1.0), 2)
            if rng.random() < 0.3:
                body["top_k"] = rng.choice([1, 5, 40, -1])
        if rng.random() < 0.3:
            body["stop"] = rng.choice([rng.choice(STOPS), rng.sample(STOPS, rng.randint(1, 4))])
        if rng.random() < 0.1:
            body["ignore_eos"] = True
        if rng.random() < 0.1:
            body["presence_penalty"] = round(rng.uniform(-1, 1), 2)
        if rng.random() < 0.05:
            body["repetition_penalty"] = round(rng.uniform(1.0, 1.5), 2)
        return body

    def completion_body(self, rng, stream):
        body = {"model": self.model, "prompt": self.prompt(rng), "max_tokens": rng.randint(1, 64),
                "n": rng.randint(1, 3), "stream": stream}
        self.sampling(rng, body)
        if rng.random() < 0.3:
            body["logprobs"] = rng.randint(0, 5)
        if stream and rng.random() < 0.6:
            body["stream_options"] = {"include_usage": True}
        return body

    def chat_body(self, rng, stream):
        messages = []
        system = rng.choice(SYSTEMS)
        if system and rng.random() < 0.5:
            messages.append({"role": "system", "content": system})
        for _ in range(rng.choice([0, 0, 1])):
            messages += [{"role": "user", "content": rng.choice(USERS)},
                         {"role": "assistant", "content": rng.choice(STORY_PROMPTS)}]
        messages.append({"role": "user", "content": rng.choice(USERS)})
        body = {"model": self.model, "messages": messages, "n": rng.randint(1, 3), "stream": stream}
        body["max_completion_tokens" if rng.random() < 0.5 else "max_tokens"] = rng.randint(1, 64)
        self.sampling(rng, body)
        if rng.random() < 0.3:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 5)
        if stream and rng.random() < 0.6:
            body["stream_options"] = {"include_usage": True}
        if not stream and rng.random() < 0.1:
            body["prompt_logprobs"] = rng.randint(0, 3)
        return body

    # -- one exchange
    def exchange(self, path, body, method="POST"):
        """Sends one request on a fresh connection; returns (status, headers, raw body)."""
        c = self.conn()
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            c.send(method, path, data)
            resp = c.read_head()
            return resp.status, resp.headers, c.read_body(resp)
        finally:
            c.close()

    def expect_ok(self, status, raw):
        if status == 429:  # the server's queue is full: allowed, if said properly
            check_error_body(status, raw, {429})
            raise Throttled()
        check(status == 200, f"HTTP {status} for a valid request" if status < 500 else f"HTTP {status}",
              raw[:300])
        try:
            return json.loads(raw)
        except ValueError:
            raise Fail("a 200 body that is not JSON", raw[:300])

    def unary(self, path, body, checker, default_max):
        status, _, raw = self.exchange(path, body)
        r = self.expect_ok(status, raw)
        checker(body, r, default_max)
        with self.lock:
            self.completion_tokens += r["usage"]["completion_tokens"]
        return "200"

    def stream(self, path, body, chat, default_max, cut_after=None):
        """A streamed request; cut_after: close the connection after that many events."""
        c = self.conn()
        try:
            c.send("POST", path, json.dumps(body).encode())
            resp = c.read_head()
            if resp.status != 200:
                raw = c.read_body(resp)
                self.expect_ok(resp.status, raw)
            check(resp.headers.get("content-type", "").startswith("text/event-stream"),
                  "stream: Content-Type is not text/event-stream", repr(resp.headers))
            if cut_after is not None and cut_after == 0:
                return "cut"
            sse, events = SSE(), []
            for piece in c.chunks(resp):
                new = sse.feed(piece)
                for ev in new:
                    check("error" not in ev, "stream: an error event in a 200 stream", repr(ev)[:300])
                events += new
                if cut_after is not None and len(events) >= cut_after and not sse.done:
                    return "cut"
            check(sse.buf == b"", "stream: bytes after the last event", repr(sse.buf[:200]))
            check(sse.done, "stream: ended without data: [DONE]", repr(events[-1:])[:300])
            tokens = check_stream(body, events, chat, default_max)
            with self.lock:
                self.completion_tokens += tokens
            return "200"
        finally:
            c.close()

    # -- the kinds
    def k_completion(self, rng):
        body = self.completion_body(rng, False)
        return self.unary("/v1/completions", body, check_completion, 16)

    def k_completion_stream(self, rng):
        body = self.completion_body(rng, True)
        return self.stream("/v1/completions", body, False, 16)

    def k_chat(self, rng):
        body = self.chat_body(rng, False)
        return self.unary("/v1/chat/completions", body, check_chat, None)

    def k_chat_stream(self, rng):
        body = self.chat_body(rng, True)
        return self.stream("/v1/chat/completions", body, True, None)

    def k_prompt_logprobs(self, rng):
        prompt = rng.choice(STORY_PROMPTS) if rng.random() < 0.6 or not self.token_prompts \
            else list(rng.choice(self.token_prompts))
        body = {"model": self.model, "prompt": prompt, "temperature": rng.choice([0.0, 0.8])}
        if rng.random() < 0.7:
            body.update(echo=True, logprobs=rng.randint(0, 5), max_tokens=rng.choice([0, 0, 1, 5]))
            if rng.random() < 0.3:
                body["n"] = 2
        else:
            body.update(prompt_logprobs=rng.randint(0, 5), max_tokens=rng.randint(0, 4))
        return self.unary("/v1/completions", body, check_completion, 16)

    def k_odd(self, rng):
        body = {"model": self.model, "prompt": rng.choice(STORY_PROMPTS), "max_tokens": rng.randint(1, 16)}
        case = rng.randrange(12)
        if case == 0:
            body.update(top_p=0, temperature=1.0)
        elif case == 1:
            body["stop"] = rng.choice(["", ["", "zq-never-zq"]])
        elif case == 2:
            body.update(prompt="", max_tokens=rng.randint(1, 8))
        elif case == 3:
            body.update(max_tokens=0, n=rng.randint(1, 3))
        elif case == 4:
            body.update(seed=rng.choice([-1, 0, 2 ** 63 - 1]), temperature=1.0)
        elif case == 5:
            body.update(temperature=100.0, top_k=rng.choice([-1, 0, 1, 1000000]))
        elif case == 6:
            body.update(logprobs=20, n=rng.randint(1, 2))
        elif case == 7:
            body["prompt"] = rng.choice(ODD_PROMPTS)
        elif case == 8:
            body.update(presence_penalty=rng.choice([-2.0, 2.0]), frequency_penalty=rng.choice([-2.0, 2.0]),
                        repetition_penalty=rng.choice([0.5, 2.0]), temperature=0.7)
        elif case == 9:
            body.update(min_tokens=body["max_tokens"], ignore_eos=rng.random() < 0.5)
        elif case == 10:
            body.update(n=2, best_of=2, temperature=0.9)
        else:
            body.update(stop_token_ids=[2], stop=["\n\n"] * 3, min_p=rng.choice([0.0, 0.5, 1.0]))
        if rng.random() < 0.3:
            body["stream"] = True
            return self.stream("/v1/completions", body, False, 16)
        return self.unary("/v1/completions", body, check_completion, 16)

    def room(self):
        return min(self.max_model_len, self.kv_tokens)

    def k_big(self, rng):
        if rng.random() < 0.5 or not self.token_prompts:
            body = {"model": self.model, "prompt": rng.choice(STORY_PROMPTS), "n": rng.randint(8, 16),
                    "max_tokens": rng.randint(16, 64), "temperature": 0.9, "seed": rng.randint(0, 99)}
        else:
            # A prompt that needs (almost) the whole KV cache: everything else is preempted.
            m = rng.randint(1, 16)
            length = min(self.room() - m - rng.randint(0, 32), 4096)
            ids = [t for p in self.token_prompts for t in p[1:]] or [self.token_prompts[0][0]]
            prompt = (ids * (length // len(ids) + 1))[:length]
            body = {"model": self.model, "prompt": prompt, "max_tokens": m, "temperature": 0.0}
            if rng.random() < 0.3:
                body.update(echo=True, logprobs=1, max_tokens=0)
        if rng.random() < 0.3:
            body["stream"] = True
            return self.stream("/v1/completions", body, False, 16)
        return self.unary("/v1/completions", body, check_completion, 16)

    def k_stream_cut(self, rng):
        prompt = rng.choice(STORY_PROMPTS)
        use_chat = self.chat and rng.random() < 0.3
        body = {"model": self.model, "max_tokens": rng.randint(32, max(32, min(256, self.room() // 4))),
                "ignore_eos": rng.random() < 0.7, "n": rng.randint(1, 3), "stream": True,
                "temperature": rng.choice([0.0, 0.8])}
        if use_chat:
            body["messages"] = [{"role": "user", "content": rng.choice(USERS)}]
        else:
            body["prompt"] = prompt
        cut = rng.randint(0, 6)
        path = "/v1/chat/completions" if use_chat else "/v1/completions"
        return self.stream(path, body, use_chat, 16, cut_after=cut)

    def k_request_cut(self, rng):
        body = {"model": self.model, "prompt": rng.choice(STORY_PROMPTS),
                "max_tokens": rng.randint(32, max(32, min(256, self.room() // 4))), "ignore_eos": True,
                "n": rng.randint(1, 2)}
        data = json.dumps(body).encode()
        how = rng.randrange(3)
        c = self.conn()
        try:
            if how == 0:  # the whole request, then gone before the answer
                c.send("POST", "/v1/completions", data)
                time.sleep(rng.uniform(0, 0.3))
            elif how == 1:  # half the body, then gone
                c.send("POST", "/v1/completions", data[:len(data) // 2], content_length=len(data))
                time.sleep(rng.uniform(0, 0.1))
            # how == 2: connect and close without a byte
        finally:
            c.close()
        return ["cut_after_request", "cut_mid_body", "cut_silent"][how]

    def malformed_case(self, rng):
        """(path, raw body bytes, expected statuses, expected param or None)."""
        good = {"model": self.model, "prompt": rng.choice(STORY_PROMPTS), "max_tokens": 4}
        case = rng.randrange(11)
        if case == 10:  # a body over serve's default --max-body-bytes (8 MiB), not JSON either way
            return "/v1/completions", b'{"prompt": "' + b"x" * (9 << 20), {413, 400}, None
        if case == 0:
            text = json.dumps(good)
            return "/v1/completions", text[:rng.randint(0, len(text) - 1)].encode(), {400}, None
        if case == 1:
            return "/v1/completions", rng.choice([b"[1, 2]", b"null", b"\"prompt\"", b"42", b"{}}", b"{'a': 1}",
                                                  b'{"prompt": "\xff\xfe"}']), {400}, None
        if case == 2:
            field, value = rng.choice([("max_tokens", "8"), ("n", "2"), ("temperature", "hot"), ("stop", 5),
                                       ("prompt", 5), ("stream", "yes"), ("logprobs", True), ("echo", "no"),
                                       ("top_p", []), ("seed", "x"), ("stream_options", "x"), ("prompt", {}),
                                       ("prompt", [1, "a"]), ("n", 1.5)])
            return "/v1/completions", json.dumps({**good, field: value}).encode(), {400}, field
        if case == 3:
            field, value = rng.choice([("n", 0), ("n", -1), ("n", 100000), ("max_tokens", -1), ("temperature", -1),
                                       ("top_p", 1.5), ("logprobs", 21), ("presence_penalty", 5),
                                       ("max_tokens", 10 ** 30), ("seed", 2 ** 64), ("prompt", [10 ** 9]),
                                       ("prompt", [-1]), ("prompt", []), ("prompt", [[]])])
            return "/v1/completions", json.dumps({**good, field: value}).encode(), {400}, field
        if case == 4:
            return "/v1/completions", json.dumps({**good, "model": "no-such-model-" + str(rng.randint(0, 9))}
                                                 ).encode(), {404}, "model"
        if case == 5:
            body = {k: v for k, v in good.items() if k != "prompt"}
            return "/v1/completions", json.dumps(body).encode(), {400}, "prompt"
        if case == 6:  # prompt + max_tokens over the context
            if rng.random() < 0.5 or not self.token_prompts or self.max_model_len > 32768:
                return "/v1/completions", json.dumps({**good, "max_tokens": self.max_model_len + 1}).encode(), \
                    {400}, "max_tokens"
            ids = [t for p in self.token_prompts for t in p]
            prompt = (ids * (self.max_model_len // len(ids) + 2))[:self.max_model_len + 1]
            return "/v1/completions", json.dumps({**good, "prompt": prompt}).encode(), {400}, None
        if case == 7:
            messages = rng.choice(["x", [{"role": "user"}], [{"content": "x"}], [[]], 5,
                                   [{"role": "user", "content": 5}]])
            return "/v1/chat/completions", json.dumps({"model": self.model, "messages": messages,
                                                       "max_tokens": 2}).encode(), {400}, "messages"
        if case == 8:
            return rng.choice(["/v1/nope", "/v2/completions", "/v1/completions/x"]), b"{}", {404}, None
        body = {**good, "prompt": rng.choice([True, None, 1.5])}
        return "/v1/completions", json.dumps(body).encode(), {400}, "prompt"

    def k_malformed(self, rng):
        path, data, expect, param = self.malformed_case(rng)
        status, _, raw = self.exchange(path, data)
        check_error_body(status, raw, expect, param)
        return str(status)

    def k_keepalive(self, rng):
        c = self.conn()
        outcomes = []
        try:
            count = rng.randint(2, 4)
            for i in range(count):
                last = i == count - 1
                path = "/v1/completions"
                if rng.random() < 0.6:
                    body = {"model": self.model, "prompt": rng.choice(STORY_PROMPTS), "max_tokens": rng.randint(1, 4),
                            "temperature": 0.0}
                    data, expect = json.dumps(body).encode(), None
                else:
                    path, data, expect, param = self.malformed_case(rng)
                    body = None
                    if (expect == {404} and path != "/v1/completions") or 413 in expect:  # keep it small
                        path, data, expect, param = "/v1/completions", b"{not json", {400}, None
                try:
                    c.send("POST", path, data, close=last)
                    resp = c.read_head()
                except ServerClosed as e:
                    raise Fail("keep-alive: the server closed a reused connection without Connection: close",
                               str(e))
                raw = c.read_body(resp)
                if expect is None:
                    r = self.expect_ok(resp.status, raw)
                    check_completion(body, r, 16)
                else:
                    check_error_body(resp.status, raw, expect, param)
                outcomes.append(resp.status)
                if resp.headers.get("connection", "").lower() == "close":
                    c.close()
                    c = self.conn()
        finally:
            c.close()
        return "200" if all(s == 200 for s in outcomes) else "mixed"

    def k_misc(self, rng):
        case = rng.randrange(4)
        if case == 0:
            status, _, raw = self.exchange("/health", None, "GET")
            check(status == 200, f"/health answered {status}", raw[:200])
        elif case == 1:
            status, _, raw = self.exchange("/v1/models", None, "GET")
            r = self.expect_ok(status, raw)
            check(r.get("object") == "list" and any(m.get("id") == self.model for m in r.get("data", [])),
                  "/v1/models does not list the model", raw[:300])
        elif case == 2:
            status, _, raw = self.exchange("/metrics", None, "GET")
            check(status == 200 and b"num_requests_running" in raw, "/metrics without num_requests_running",
                  raw[:200])
        else:
            text = rng.choice(STORY_PROMPTS)
            status, _, raw = self.exchange("/tokenize", {"model": self.model, "prompt": text})
            if status == 404:
                return "404"
            r = self.expect_ok(status, raw)
            check(isinstance(r.get("tokens"), list) and r.get("count") == len(r["tokens"]),
                  "/tokenize count != len(tokens)", raw[:300])
            status, _, raw = self.exchange("/detokenize", {"model": self.model, "tokens": r["tokens"]})
            d = self.expect_ok(status, raw)
            check(isinstance(d.get("prompt"), str) and text in d["prompt"], "/detokenize does not give the text back",
                  f"{text!r} -> {d.get('prompt')!r}")
        return "200"

    # -- the workers
    def worker(self, index, end):
        rng = random.Random(f"{self.args.seed}-{index}")
        kinds = sorted(self.weights)
        weights = [self.weights[k] for k in kinds]
        while time.monotonic() < end and not self.stopped.is_set():
            kind = rng.choices(kinds, weights)[0]
            self.tls.request = ""
            try:
                outcome = getattr(self, "k_" + kind)(rng)
                self.count(kind, outcome)
            except Throttled:
                self.count(kind, "429")
                time.sleep(rng.uniform(0.05, 0.25))  # the server said it is full: back off a little
            except Fail as e:
                self.count(kind, "fail")
                self.fail(kind, e.reason, e.detail, self.tls.request)
            except ServerClosed as e:
                self.count(kind, "fail")
                self.fail(kind, "connection closed by the server", str(e), self.tls.request)
            except ConnectionRefusedError as e:
                self.count(kind, "fail")
                self.fail(kind, "connection refused", str(e), self.tls.request)
                time.sleep(0.5)
            except ConnectionResetError as e:
                self.count(kind, "fail")
                self.fail(kind, "connection reset by the server", str(e), self.tls.request)
            except socket.timeout as e:
                self.count(kind, "fail")
                self.fail(kind, f"no answer within {self.args.request_timeout} s", str(e), self.tls.request)
            except OSError as e:
                self.count(kind, "fail")
                self.fail(kind, f"socket error {type(e).__name__}", str(e), self.tls.request)
            except Exception as e:  # a response the checks did not foresee (a list for a dict...)
                self.count(kind, "fail")
                self.fail(kind, f"unexpected response ({type(e).__name__} in the checks)",
                          traceback.format_exc(limit=3), self.tls.request)


class Throttled(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Sampling the server.

def parse_metrics(text):
    """Prometheus text -> {name: value summed over label sets}, plus the KV pool size."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
        if name.endswith(":cache_config_info"):
            m = re.search(r'num_gpu_blocks="(\d+)"', name_labels)
            b = re.search(r'block_size="(\d+)"', name_labels)
            if m:
                out["_num_gpu_blocks"] = int(m.group(1))
            if b:
                out["_block_size"] = int(b.group(1))
    return out


def metric(m, name):
    for prefix in ("serval:", "vllm:"):
        if prefix + name in m:
            return m[prefix + name]
    return None


def rss_mib(pid):
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def listening_pid(port):
    """The pid of the local process listening on TCP port (best effort, via /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


class Sampler:
    def __init__(self, soak, pid, start):
        self.soak, self.pid, self.start = soak, pid, start
        self.samples = []

    def scrape(self):
        status, _, raw = self.soak.exchange("/metrics", None, "GET")
        if status != 200:
            raise Fail(f"/metrics answered {status}", raw[:200])
        return parse_metrics(raw.decode("utf-8", "replace"))

    def sample(self, label=""):
        t = time.monotonic() - self.start
        s = {"t": round(t, 1), "rss_mib": rss_mib(self.pid)}
        try:
            m = self.scrape()
        except (Fail, OSError, ServerClosed) as e:
            s["metrics_error"] = str(e)
            m = {}
        for key, name in (("kv_usage", "kv_cache_usage_perc"), ("blocks_used", "kv_cache_blocks_used"),
                          ("blocks_cached", "kv_cache_blocks_cached"), ("blocks_free", "kv_cache_blocks_free"),
                          ("running", "num_requests_running"), ("waiting", "num_requests_waiting"),
                          ("preemptions", "num_preemptions_total")):
            v = metric(m, name)
            s[key] = None if v is None else (round(v, 4) if key == "kv_usage" else int(v))
        if "_num_gpu_blocks" in m:
            s["blocks_total"] = m["_num_gpu_blocks"]
        with self.soak.lock:
            s["requests"], s["failures"] = self.soak.done, self.soak.n_failures
        self.samples.append(s)
        print(format_sample(s, label), flush=True)
        return s


def fmt(v, spec="", none="-"):
    return none if v is None else format(v, spec)


def format_sample(s, label=""):
    rss = f"rss {fmt(s['rss_mib'], '7.1f', '      -')} MiB"
    kv = (f"kv {fmt(None if s['kv_usage'] is None else 100 * s['kv_usage'], '5.1f', '    -')}% "
          f"used {fmt(s['blocks_used'], '4d', '   -')} cached {fmt(s['blocks_cached'], '4d', '   -')} "
          f"free {fmt(s['blocks_free'], '4d', '   -')}")
    reqs = f"running {fmt(s['running'], '3d', '  -')} waiting {fmt(s['waiting'], '3d', '  -')}"
    tail = f"preempted {fmt(s['preemptions'])} | requests {s['requests']} failures {s['failures']}"
    err = f" | metrics: {s['metrics_error'][:80]}" if "metrics_error" in s else ""
    return f"[{s['t']:6.1f}s]{label} {rss} | {kv} | {reqs} | {tail}{err}"


def idle(s):
    """Whether a sample shows no request's KV blocks and nothing running or waiting."""
    if s.get("running") is None or s.get("waiting") is None:
        return False
    used = s["blocks_used"] if s.get("blocks_used") is not None else (
        None if s.get("kv_usage") is None else (0 if s["kv_usage"] == 0 else 1))
    return used == 0 and s["running"] == 0 and s["waiting"] == 0


# ---------------------------------------------------------------------------------------------

def parse_mix(text):
    weights = dict(KIND_WEIGHTS)
    if text:
        for item in text.split(","):
            k, sep, w = item.partition("=")
            if k.strip() not in weights or not sep:
                raise argparse.ArgumentTypeError(f"--mix: '{item}': kinds are {', '.join(KIND_WEIGHTS)}")
            weights[k.strip()] = float(w)
    return weights


def die(message):
    print(message, file=sys.stderr, flush=True)
    sys.exit(2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(host, port, path, api_key, body=None, timeout=10):
    c = Conn(host, port, timeout, api_key)
    try:
        c.send("POST" if body is not None else "GET", path, None if body is None else json.dumps(body).encode())
        resp = c.read_head()
        raw = c.read_body(resp)
    finally:
        c.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw


def start_server(args):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="soak-serve-", suffix=".log", delete=False)
    cmd = [args.serve, "serve", "--model", args.model, "--port", str(port), "--served-model-name", "soak",
           *shlex.split(args.serve_args)]
    print("soak: starting " + " ".join(shlex.quote(c) for c in cmd) + f" (log: {log.name})", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.flush()
            die(f"soak: the server exited ({proc.returncode}) at start-up:\n" + open(log.name).read()[-3000:])
        try:
            if get_json("127.0.0.1", port, "/health", args.api_key, timeout=2)[0] == 200:
                return proc, port, log.name
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    die("soak: the server did not become healthy in time")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--serve", metavar="BINARY", help="start BINARY serve --model MODEL on a free port")
    ap.add_argument("--model", help="with --serve: the model file or folder")
    ap.add_argument("--serve-args", default="", help="with --serve: more flags for serve (one string)")
    ap.add_argument("--pid", type=int, help="the server's pid, for its RSS (default: the process listening "
                                            "on the URL's port, if local)")
    ap.add_argument("--model-name", help="the model name to send (default: the first of /v1/models)")
    ap.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds after which the RSS baseline is taken (default 10; at most half the duration)")
    ap.add_argument("--rss-leak-factor", type=float, default=2.0)
    ap.add_argument("--rss-leak-mib", type=float, default=200.0)
    ap.add_argument("--drain-timeout", type=float, default=30.0,
                    help="seconds the server has to go idle after the load (default 30)")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="socket timeout per request (default 120)")
    ap.add_argument("--start-timeout", type=float, default=120.0, help="with --serve: seconds to become healthy")
    ap.add_argument("--mix", type=parse_mix, default=dict(KIND_WEIGHTS),
                    help="kind=weight,... (kinds: " + ", ".join(KIND_WEIGHTS) + ")")
    ap.add_argument("--report", help="write the report as JSON to this file")
    ap.add_argument("--quiet", action="store_true", help="no line per failure as it happens")
    args = ap.parse_args(argv)
    if args.serve and not args.model:
        ap.error("--serve needs --model")

    proc, log_path = None, None
    if args.serve:
        proc, port, log_path = start_server(args)
        host, pid = "127.0.0.1", proc.pid
    else:
        u = urllib.parse.urlsplit(args.url)
        if u.scheme != "http" or not u.hostname:
            ap.error("--url must be http://HOST:PORT")
        host, port = u.hostname, u.port or 80
        pid = args.pid
        if pid is None and host in ("127.0.0.1", "localhost", "::1"):
            pid = listening_pid(port)
    try:
        return run(args, host, port, pid, proc, log_path)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()


def run(args, host, port, pid, proc, log_path):
    # What the server serves: the model, its context, the KV pool, a chat template or not.
    try:
        status, models = get_json(host, port, "/v1/models", args.api_key)
    except OSError as e:
        die(f"soak: cannot reach {host}:{port}: {e}")
    if status != 200 or not isinstance(models, dict) or not models.get("data"):
        die(f"soak: /v1/models answered {status}: {str(models)[:300]}")
    entry = models["data"][0]
    model = args.model_name or entry["id"]
    max_model_len = entry.get("max_model_len") or 2048
    status, raw = get_json(host, port, "/metrics", args.api_key)
    m = parse_metrics(raw if isinstance(raw, str) else raw.decode("utf-8", "replace")) if status == 200 else {}
    kv_tokens = m.get("_num_gpu_blocks", 0) * m.get("_block_size", 0) or max_model_len
    status, chat = get_json(host, port, "/v1/chat/completions", args.api_key,
                            {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    if status not in (200, 400):
        die(f"soak: the chat probe answered {status}: {str(chat)[:300]}")
    has_chat = status == 200
    token_prompts = []
    status, tok = get_json(host, port, "/tokenize", args.api_key, {"model": model, "prompt": STORY_PROMPTS[0]})
    if status == 200:
        for p in STORY_PROMPTS:
            status, tok = get_json(host, port, "/tokenize", args.api_key, {"model": model, "prompt": p})
            if status == 200 and tok.get("tokens"):
                token_prompts.append(tok["tokens"])

    soak = Soak(args, host, port, model, max_model_len, kv_tokens, has_chat, token_prompts)
    print(f"soak: {host}:{port} model '{model}' (context {max_model_len}, KV pool {kv_tokens} tokens, chat "
          f"{'yes' if has_chat else 'no (no chat template)'}), pid {pid if pid else '- (no RSS)'}; "
          f"{args.duration:g} s, {args.concurrency} clients, seed {args.seed}", flush=True)
    print("soak: mix " + ", ".join(f"{k} {w:g}" for k, w in sorted(soak.weights.items())), flush=True)

    start = time.monotonic()
    end = start + args.duration
    sampler = Sampler(soak, pid, start)
    problems = []
    first = sampler.sample()
    workers = [threading.Thread(target=soak.worker, args=(i, end), daemon=True) for i in range(args.concurrency)]
    for w in workers:
        w.start()
    warmup = min(args.warmup, args.duration / 2)
    baseline = None
    next_sample = start + args.interval
    server_died = False
    while time.monotonic() < end:
        time.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
        if proc is not None and proc.poll() is not None:
            server_died = True
            break
        if pid is not None and not os.path.exists(f"/proc/{pid}"):
            server_died = True
            break
        if time.monotonic() >= next_sample:
            s = sampler.sample()
            if baseline is None and s["t"] >= warmup:
                baseline = s
            next_sample += args.interval
    if server_died:
        soak.stopped.set()
        problems.append("the server process died during the run" +
                        (f" (exit status {proc.returncode})" if proc is not None else ""))
    # Let the clients finish what they sent.
    join_deadline = time.monotonic() + args.request_timeout + 10
    for w in workers:
        w.join(timeout=max(0.1, join_deadline - time.monotonic()))
    stuck = sum(w.is_alive() for w in workers)
    if stuck:
        problems.append(f"{stuck} client(s) still waiting for an answer {args.request_timeout:g} s after the end")
    load_end = time.monotonic()

    # Drain: the server must go idle.
    final = None
    drain_deadline = time.monotonic() + args.drain_timeout
    while not server_died:
        final = sampler.sample(" drain")
        if idle(final) or time.monotonic() >= drain_deadline:
            break
        time.sleep(min(1.0, args.interval))
    if final is not None and not server_died:
        if not idle(final):
            problems.append(f"not idle {args.drain_timeout:g} s after the load: blocks used {final['blocks_used']}, "
                            f"KV usage {final['kv_usage']}, running {final['running']}, waiting {final['waiting']}")
        total = final.get("blocks_total")
        parts = [final.get(k) for k in ("blocks_used", "blocks_cached", "blocks_free")]
        if total is not None and None not in parts and sum(parts) != total:
            problems.append(f"KV block gauges do not add up: used {parts[0]} + cached {parts[1]} + free "
                            f"{parts[2]} != {total}")
        # Still serving?
        try:
            status, r = get_json(host, port, "/v1/completions", args.api_key,
                                 {"model": model, "prompt": STORY_PROMPTS[0], "max_tokens": 2, "temperature": 0})
            if status != 200:
                problems.append(f"a completion after the drain answered {status}")
        except OSError as e:
            problems.append(f"a completion after the drain failed: {e}")

    # RSS.
    rss = [s["rss_mib"] for s in sampler.samples if s.get("rss_mib") is not None]
    rss_report = None
    if rss:
        base = (baseline or first)["rss_mib"] or rss[0]
        rss_report = {"first": round(rss[0], 1), "after_warmup": round(base, 1), "max": round(max(rss), 1),
                      "last": round(rss[-1], 1), "growth_factor": round(rss[-1] / base, 3) if base else None,
                      "growth_mib": round(rss[-1] - base, 1)}
        if rss[-1] > args.rss_leak_factor * base and rss[-1] - base > args.rss_leak_mib:
            problems.append(f"RSS grew from {base:.1f} MiB after warm-up to {rss[-1]:.1f} MiB (more than "
                            f"x{args.rss_leak_factor:g} and +{args.rss_leak_mib:g} MiB)")

    # The server's own exit and access log.
    access = {}
    if proc is not None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems.append("the server did not exit within 60 s of SIGTERM")
        if proc.returncode != 0 and not server_died:
            problems.append(f"the server exited {proc.returncode} after SIGTERM")
        try:
            with open(log_path, errors="replace") as f:
                log_text = f.read()
            for code in re.findall(r" status=(\d{3})", log_text):
                access[code] = access.get(code, 0) + 1
            for line in log_text.splitlines():
                if re.search(r"(?i)\b(fatal|terminate called|sanitizer|assert)", line):
                    problems.append(f"server log: {line[:200]}")
                    break
        except OSError:
            pass

    if soak.n_failures:
        problems.insert(0, f"{soak.n_failures} request(s) failed")
    successes = sum(n for kinds in soak.counts.values() for o, n in kinds.items() if o == "200")
    if successes == 0:
        problems.append("no request succeeded")

    print_summary(args, soak, load_end - start, rss_report, final, first, access, problems)
    if log_path:
        if problems:
            print(f"server log kept: {log_path}")
        else:
            os.unlink(log_path)
    if args.report:
        report = {
            "url": f"http://{host}:{port}", "model": model, "max_model_len": max_model_len, "kv_tokens": kv_tokens,
            "chat": has_chat, "pid": pid, "duration_s": args.duration, "elapsed_s": round(load_end - start, 1),
            "concurrency": args.concurrency, "seed": args.seed, "mix": soak.weights,
            "requests": soak.done, "succeeded": successes, "completion_tokens": soak.completion_tokens,
            "by_kind": soak.counts, "failures": soak.n_failures, "failure_examples": soak.failures,
            "rss_mib": rss_report,
            "kv_final": final, "idle_after_drain": bool(final and idle(final)),
            "preemptions": None if final is None or final.get("preemptions") is None or first.get("preemptions")
            is None else final["preemptions"] - first["preemptions"],
            "server_access_log": access or None,
            "samples": sampler.samples, "problems": problems, "ok": not problems,
        }
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if problems else 0


def print_summary(args, soak, elapsed, rss, final, first, access, problems):
    print(f"\nsoak summary: {elapsed:.1f} s, {args.concurrency} clients, seed {args.seed}: {soak.done} requests, "
          f"{soak.n_failures} failed, {soak.completion_tokens} completion tokens")
    for kind in sorted(soak.counts):
        outcomes = soak.counts[kind]
        print(f"  {kind:18s} " + "  ".join(f"{o} x{n}" for o, n in sorted(outcomes.items())))
    if soak.failures:
        print("failures:")
        for key, f in sorted(soak.failures.items(), key=lambda kv: -kv[1]["count"]):
            print(f"  {f['count']:5d}  {key}")
            for ex in f["examples"][:2]:
                print(f"         detail:  {ex['detail'][:300]}")
                print(f"         request: {ex['request'][:300]}")
    if rss:
        print(f"rss: first {rss['first']} MiB, after warm-up {rss['after_warmup']}, max {rss['max']}, last "
              f"{rss['last']} (x{rss['growth_factor']}, {rss['growth_mib']:+.1f} MiB)")
    else:
        print("rss: not sampled (no pid)")
    if final:
        pre = None if final.get("preemptions") is None or first.get("preemptions") is None \
            else final["preemptions"] - first["preemptions"]
        print(f"kv after the drain: {final.get('blocks_used')} blocks used, {final.get('blocks_cached')} cached, "
              f"{final.get('blocks_free')} free of {final.get('blocks_total')} (usage {final.get('kv_usage')}); "
              f"running {final.get('running')}, waiting {final.get('waiting')}; preemptions during the run: {pre}")
    if access:
        print("server access log: " + "  ".join(f"{k} x{v}" for k, v in sorted(access.items())))
    if problems:
        print("FAILED:")
        for p in problems:
            print("  - " + p)
    else:
        print("OK")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
