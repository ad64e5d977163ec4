"""Prompt logprobs through `serval serve`, against Hugging Face transformers on a tiny
random Llama 3 (f32 weights): /v1/completions with echo + logprobs (the legacy shape
lm-eval's likelihood tasks read: token_logprobs with a null first, top_logprobs, tokens,
text_offset), max_tokens 0 included, prompts as text, token ids and batches, streamed
or not; vLLM's prompt_logprobs field on completions and chat."""
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

import hf_models  # noqa: E402
from serval_server import ServalServer, parse_sse  # noqa: E402

TOL = 1e-4
TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Once upon a time, there was a little robot who loved to paint.",
         "1 + 1 = 2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("llama3-logprobs")
    hf_models.build("llama3", folder, models)
    ref = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return folder, ref, tok


@pytest.fixture(scope="module")
def server(serval, model):
    # Few scored rows a step: long prompts are scored over several steps.
    s = ServalServer(serval, model[0], "--max-num-batched-tokens", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def reference(ref, ids):
    """log_softmax of every position (row p scores token p + 1)."""
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def check_echo_logprobs(lp, ids, ref_lsm, tok, top_n):
    """The prompt part of a completions logprobs object against the reference."""
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) >= len(ids)
    for p in range(1, len(ids)):
        want = float(ref_lsm[p - 1, ids[p]])
        got = lp["token_logprobs"][p]
        assert abs(got - want) <= TOL * max(1.0, abs(want)), (p, got, want)
        top = lp["top_logprobs"][p]
        ref_top = torch.topk(ref_lsm[p - 1], top_n)
        # The top n, and the prompt token itself, as vLLM lists them.
        for v, i in zip(ref_top.values.tolist(), ref_top.indices.tolist()):
            text = tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)])
            if text in top:  # distinct ids may share a text; their logprobs then collide
                continue
            pytest.fail(f"position {p}: top token {i} ({text!r}, {v}) missing from {top}")
        assert len(top) <= top_n + 1
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and all(b >= a for a, b in zip(offsets, offsets[1:]))


def test_echo_logprobs_with_max_tokens_0_equal_transformers(server, model):
    _, ref, tok = model
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        status, _, body = server.post("/v1/completions", {"prompt": text, "echo": True, "logprobs": 3,
                                                          "max_tokens": 0, "temperature": 0})
        assert status == 200, body
        c = body["choices"][0]
        assert c["text"] == text and c["finish_reason"] == "length"
        assert len(c["logprobs"]["tokens"]) == len(ids)
        assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)
        check_echo_logprobs(c["logprobs"], ids, reference(ref, ids), tok, 3)


def test_echo_logprobs_of_a_batch_of_token_id_prompts(client, model):
    _, ref, tok = model
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    r = client.completions.create(model="test-model", prompt=prompts, echo=True, logprobs=2, max_tokens=1,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c, ids in zip(r.choices, prompts):
        lp = c.logprobs.model_dump()
        assert len(lp["tokens"]) == len(ids) + 1  # the prompt, then the generated token
        ref_lsm = reference(ref, ids)
        check_echo_logprobs(lp, ids, ref_lsm, tok, 2)
        # The generated token's logprob is the model's at the prompt's end.
        gen = tok.encode(lp["tokens"][-1], add_special_tokens=False)
        assert abs(lp["token_logprobs"][-1] - float(ref_lsm[-1].max())) <= TOL or len(gen) != 1


def test_streamed_echo_logprobs_equal_the_unstreamed(server):
    req = {"prompt": TEXTS[1], "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}
    _, _, whole = server.post("/v1/completions", req)
    status, _, raw = server.post("/v1/completions", {**req, "stream": True})
    assert status == 200
    chunks = parse_sse(raw)
    text, tokens, lps = "", [], []
    for ch in chunks:
        for c in ch["choices"]:
            text += c["text"]
            if c["logprobs"]:
                tokens += c["logprobs"]["tokens"]
                lps += c["logprobs"]["token_logprobs"]
    w = whole["choices"][0]
    assert text == w["text"]
    assert tokens == w["logprobs"]["tokens"]
    assert lps == w["logprobs"]["token_logprobs"]


def test_vllm_prompt_logprobs_field(server, model):
    _, ref, tok = model
    ids = tok(TEXTS[0])["input_ids"]
    status, _, body = server.post("/v1/completions", {"prompt": ids, "prompt_logprobs": 2, "max_tokens": 2,
                                                      "temperature": 0})
    assert status == 200, body
    pl = body["choices"][0]["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    ref_lsm = reference(ref, ids)
    for p in range(1, len(ids)):
        entry = pl[p]
        mine = entry[str(ids[p])]
        assert abs(mine["logprob"] - float(ref_lsm[p - 1, ids[p]])) <= TOL
        # Rank: 1 + the tokens above it (near-ties may order either way in f32).
        row, v = ref_lsm[p - 1], ref_lsm[p - 1, ids[p]]
        assert 1 + int((row > v + 1e-5).sum()) <= mine["rank"] <= 1 + int((row > v - 1e-5).sum())
        best = int(ref_lsm[p - 1].argmax())
        assert entry[str(best)]["rank"] == 1
        assert len(entry) in (2, 3)
    # Without the field, no such key.
    _, _, plain = server.post("/v1/completions", {"prompt": ids, "max_tokens": 1})
    assert "prompt_logprobs" not in plain["choices"][0]


def test_chat_prompt_logprobs(server, model):
    _, ref, tok = model
    messages = [{"role": "user", "content": "Hi there"}]
    status, _, body = server.post("/v1/chat/completions", {"messages": messages, "prompt_logprobs": 0,
                                                           "max_tokens": 1})
    assert status == 200, body
    _, _, t = server.post("/tokenize", {"messages": messages})
    ids = t["tokens"]
    pl = body["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    ref_lsm = reference(ref, ids)
    for p in range(1, len(ids)):
        assert abs(pl[p][str(ids[p])]["logprob"] - float(ref_lsm[p - 1, ids[p]])) <= TOL


@pytest.mark.parametrize("field,value", [("prompt_logprobs", 21), ("prompt_logprobs", -1),
                                         ("prompt_logprobs", "2")])
def test_bad_prompt_logprobs_are_refused(server, field, value):
    status, _, body = server.post("/v1/completions", {"prompt": "Hi", field: value})
    assert status == 400 and field in json.dumps(body)
