"""Request fields that steer or report sampling, end to end on stories260K: logit_bias
(forcing and forbidding tokens, refused when malformed), vLLM's stop_reason (the stop
string, the stop token id, null for EOS and length), on completions, streamed or not."""
import pytest

from serval_server import ServalServer, parse_sse

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


def complete(server, **body):
    body.setdefault("prompt", PROMPT)
    body.setdefault("temperature", 0)
    status, _, out = server.post("/v1/completions", body)
    assert status == 200, out
    return out


def generated_ids(server, text):
    """The ids of a greedy continuation of PROMPT (BOS + 4 tokens): its text tokenizes back to them."""
    _, _, t = server.post("/tokenize", {"prompt": PROMPT + text})
    return t["tokens"][5:]


def test_logit_bias_forces_and_forbids_tokens(server):
    base = complete(server, max_tokens=8)
    ids = generated_ids(server, base["choices"][0]["text"])
    first_id, lily = ids[0], ids[3]
    # +100 on one token: greedy output is that token again and again.
    forced = complete(server, max_tokens=4, logprobs=0, logit_bias={str(lily): 100})["choices"][0]
    tokens = forced["logprobs"]["tokens"]
    assert len(tokens) == 4 and len(set(tokens)) == 1 and forced["text"] == tokens[0] * 4
    # -100 on the greedy first token: the output starts otherwise.
    other = complete(server, max_tokens=8, logit_bias={str(first_id): -100})
    assert other["choices"][0]["text"] != base["choices"][0]["text"]
    # An empty map changes nothing; sampled rows take it too.
    assert complete(server, max_tokens=8, logit_bias={})["choices"][0]["text"] == base["choices"][0]["text"]
    sampled = complete(server, max_tokens=4, temperature=1.0, seed=3, logit_bias={str(lily): 100})
    assert sampled["choices"][0]["text"] == forced["text"]


@pytest.mark.parametrize("bias,needle", [({"x": 1}, "token ids"), ({"-1": 1}, "token ids"),
                                         ({"5": 101}, "[-100, 100]"), ({"5": "1"}, "numbers"),
                                         ([1, 2], "map token ids"), ({"99999": 1}, "vocabulary")])
def test_bad_logit_bias_is_refused(server, bias, needle):
    status, _, body = server.post("/v1/completions", {"prompt": PROMPT, "logit_bias": bias})
    assert status == 400, body
    assert needle in body["error"]["message"] and body["error"]["param"] == "logit_bias"


def test_stop_reason(server):
    text = complete(server, max_tokens=16)["choices"][0]["text"]
    word = text.split()[2]
    by_string = complete(server, max_tokens=16, stop=[word, "zzz"])["choices"][0]
    assert by_string["finish_reason"] == "stop" and by_string["stop_reason"] == word
    stop_id = generated_ids(server, text)[2]
    by_token = complete(server, max_tokens=16, stop_token_ids=[stop_id])["choices"][0]
    assert by_token["finish_reason"] == "stop" and by_token["stop_reason"] == stop_id
    by_length = complete(server, max_tokens=2)["choices"][0]
    assert by_length["finish_reason"] == "length" and by_length["stop_reason"] is None
    eos = 2  # stories260K's (Llama 2's) </s>, forced by a bias
    by_eos = complete(server, max_tokens=16, logit_bias={str(eos): 100})["choices"][0]
    assert by_eos["finish_reason"] == "stop" and by_eos["stop_reason"] is None
    # Streamed: null until the last chunk, which names it.
    status, _, raw = server.post("/v1/completions", {"prompt": PROMPT, "temperature": 0, "max_tokens": 16,
                                                     "stop": [word], "stream": True})
    chunks = [c["choices"][0] for c in parse_sse(raw)]
    assert chunks[-1]["stop_reason"] == word and all(c["stop_reason"] is None for c in chunks[:-1])
