"""/v1/completions end to end with the official openai client against `serval serve`
on stories260K: prompts as text, token ids and batches, the published greedy story,
streaming, n, stop strings, logprobs, seeds, echo, usage, /tokenize, /metrics."""
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from serval_server import ServalServer, parse_sse  # noqa: E402

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def complete(client, **kw):
    kw.setdefault("model", "test-model")
    kw.setdefault("prompt", PROMPT)
    return client.completions.create(**kw)


def test_greedy_story_matches_published_output(client):
    r = complete(client, max_tokens=16, temperature=0)
    assert "there was a little girl named Lily" in r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens == 5  # BOS + 4 tokens
    assert r.usage.total_tokens == 21


def test_token_id_prompt_equals_text_prompt(client, server):
    status, _, tok = server.post("/tokenize", {"prompt": PROMPT})
    assert status == 200 and tok["count"] == len(tok["tokens"]) == 5
    by_ids = complete(client, prompt=tok["tokens"], max_tokens=16, temperature=0)
    by_text = complete(client, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    status, _, detok = server.post("/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and PROMPT in detok["prompt"]


def test_batch_of_prompts_gives_one_choice_each_in_order(client, server):
    _, _, tok = server.post("/tokenize", {"prompt": "Lily and Ben"})
    r = complete(client, prompt=[PROMPT, "Lily and Ben", tok["tokens"]], max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    solo = [complete(client, prompt=p, max_tokens=8, temperature=0).choices[0].text
            for p in (PROMPT, "Lily and Ben")]
    assert [c.text for c in r.choices] == [solo[0], solo[1], solo[1]]
    assert r.usage.completion_tokens == 24


def test_streaming_is_well_formed_sse_ending_in_done(server):
    body = {"model": "test-model", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.url + "/v1/completions", data=__import__("json").dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks = parse_sse(r.read().decode())
    text_chunks, usage = chunks[:-1], chunks[-1]
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in text_chunks)
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["text"] for c in text_chunks)
    assert "there was a little girl named Lily" in text
    assert [c["choices"][0]["finish_reason"] for c in text_chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 16


def test_streaming_with_openai_client(client):
    stream = complete(client, max_tokens=16, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream)
    assert "there was a little girl named Lily" in text


def test_n_samples(client):
    r = complete(client, max_tokens=12, temperature=1.0, seed=7, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(len(c.text) > 0 for c in r.choices)
    assert r.usage.completion_tokens == 24
    assert r.choices[0].text != r.choices[1].text  # different seeds per sample


def test_n_samples_streaming(client):
    texts = {0: "", 1: ""}
    finishes = {}
    for c in complete(client, max_tokens=12, temperature=1.0, seed=7, n=2, stream=True):
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert finishes == {0: "length", 1: "length"}
    again = complete(client, max_tokens=12, temperature=1.0, seed=7, n=2)
    assert [texts[0], texts[1]] == [c.text for c in sorted(again.choices, key=lambda c: c.index)]


def test_stop_string_cuts_the_text(client):
    full = complete(client, max_tokens=16, temperature=0).choices[0].text
    r = complete(client, max_tokens=16, temperature=0, stop=["girl"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index("girl")]
    r2 = complete(client, max_tokens=16, temperature=0, stop="Lily", stream=True)
    assert "".join(c.choices[0].text for c in r2) == full[:full.index("Lily")]


def test_logprobs(client):
    r = complete(client, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens).strip() == r.choices[0].text.strip()
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) >= 3 and top[tok] == chosen
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the most likely


def test_seed_reproducibility(client):
    a = complete(client, max_tokens=20, temperature=1.0, seed=1234).choices[0].text
    b = complete(client, max_tokens=20, temperature=1.0, seed=1234).choices[0].text
    others = {complete(client, max_tokens=20, temperature=1.0, seed=s).choices[0].text for s in (1, 2, 3)}
    assert a == b
    assert len(others | {a}) > 1


def test_echo(client):
    r = complete(client, max_tokens=8, temperature=0, echo=True)
    plain = complete(client, max_tokens=8, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text
    zero = complete(client, max_tokens=0, echo=True)
    assert zero.choices[0].text == PROMPT and zero.usage.completion_tokens == 0


def test_sampling_parameters_are_accepted(client):
    r = complete(client, max_tokens=10, temperature=0.8, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
                 seed=3, extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 10,
                                     "ignore_eos": True})
    assert r.usage.completion_tokens == 10


def test_cached_tokens_reported(client):
    long_prompt = PROMPT + " there was a little girl named Lily. She loved to play outside in the park."
    complete(client, prompt=long_prompt, max_tokens=2, temperature=0)
    r = complete(client, prompt=long_prompt, max_tokens=2, temperature=0)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert isinstance(cached, int) and 0 <= cached < r.usage.prompt_tokens


def test_models_health_metrics(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["test-model"]
    with urllib.request.urlopen(server.url + "/health") as r:
        assert r.status == 200
    m = server.metrics()
    assert m["serval:generation_tokens_total"] > 0
    assert "serval:kv_cache_blocks_used" in m
