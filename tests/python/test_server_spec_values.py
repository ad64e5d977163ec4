"""Values OpenAI's spec allows, answered as OpenAI (or vLLM) answers them rather than
refused (docs/SERVER.md, "Edge values"): top_p 0, an empty prompt, an empty stop
string, max_tokens / max_completion_tokens 0; best_of below n stays a 400 naming it."""
import pytest

openai = pytest.importorskip("openai")

from serval_server import ServalServer, parse_sse  # noqa: E402

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


def complete(server, **body):
    body.setdefault("model", "test-model")
    body.setdefault("prompt", PROMPT)
    status, _, resp = server.post("/v1/completions", body)
    assert status == 200, resp
    return resp


def stream(server, path, **body):
    import json
    import urllib.request
    body.setdefault("model", "test-model")
    body["stream"] = True
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return parse_sse(r.read().decode())


def test_top_p_0_is_the_most_likely_token_alone(server):
    greedy = complete(server, max_tokens=24, temperature=0)["choices"][0]["text"]
    for seed in (1, 2):
        r = complete(server, max_tokens=24, temperature=1.5, top_p=0, seed=seed)
        assert r["choices"][0]["text"] == greedy
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.completions.create(model="test-model", prompt=PROMPT, max_tokens=24, top_p=0, n=2)
    assert [c.text for c in r.choices] == [greedy, greedy]


def test_empty_prompt_is_the_bos_token(server):
    r = complete(server, prompt="", max_tokens=4, temperature=0)
    assert r["usage"]["prompt_tokens"] == 1 and r["usage"]["completion_tokens"] == 4
    _, _, tok = server.post("/tokenize", {"prompt": ""})
    assert complete(server, prompt=tok["tokens"], max_tokens=4, temperature=0)["choices"][0]["text"] == \
        r["choices"][0]["text"]
    # Without the BOS nothing is left: a 400 naming the prompt.
    status, _, err = server.post("/v1/completions", {"prompt": "", "max_tokens": 4, "add_special_tokens": False})
    assert status == 400 and err["error"]["param"] == "prompt" and "no tokens" in err["error"]["message"]


@pytest.mark.parametrize("stop", ["", [""], ["", "\n\n\n\n"]])
def test_empty_stop_string_is_ignored(server, stop):
    plain = complete(server, max_tokens=12, temperature=0)["choices"][0]
    r = complete(server, max_tokens=12, temperature=0, stop=stop)["choices"][0]
    assert (r["text"], r["finish_reason"]) == (plain["text"], plain["finish_reason"])


def test_max_tokens_0_is_an_empty_completion(server):
    r = complete(server, max_tokens=0, n=2)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in r["choices"]] == [(0, "", "length"), (1, "", "length")]
    assert r["usage"]["prompt_tokens"] == 5 and r["usage"]["completion_tokens"] == 0
    r = complete(server, prompt=[PROMPT, "Lily"], max_tokens=0, echo=True)
    assert [c["text"] for c in r["choices"]] == [PROMPT, "Lily"]
    chunks = stream(server, "/v1/completions", prompt=PROMPT, max_tokens=0, n=2,
                    stream_options={"include_usage": True})
    *choices, usage = chunks
    assert sorted((c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0]["finish_reason"])
                  for c in choices) == [(0, "", "length"), (1, "", "length")]
    assert usage["usage"]["completion_tokens"] == 0 and usage["usage"]["prompt_tokens"] == 5
    # The engine never saw them: nothing waits or runs.
    m = server.metrics()
    assert m["serval:num_requests_running"] == 0 and m["serval:num_requests_waiting"] == 0


def test_max_completion_tokens_0_in_chat(serval, models, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--chat-template", template)
    try:
        messages = [{"role": "user", "content": PROMPT}]
        for field in ("max_completion_tokens", "max_tokens"):
            status, _, r = s.post("/v1/chat/completions", {"messages": messages, field: 0})
            assert status == 200, r
            assert r["choices"][0]["message"]["content"] == "" and r["choices"][0]["finish_reason"] == "length"
            assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] > 0
        first, finish = stream(s, "/v1/chat/completions", messages=messages, max_completion_tokens=0)
        assert first["choices"][0]["delta"]["role"] == "assistant"
        assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    finally:
        s.stop()


@pytest.mark.parametrize("best_of,n", [(0, 1), (1, 2)])
def test_best_of_below_n_is_400_naming_it(server, best_of, n):
    status, _, err = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "best_of": best_of, "n": n})
    assert status == 400 and err["error"]["param"] == "best_of"
    assert "at least n" in err["error"]["message"], err
    assert complete(server, max_tokens=2, best_of=2, n=2)["choices"][1]["index"] == 1
