"""Speculative decoding end to end (docs/SPECULATIVE.md) with the openai client: a server
run with --speculative ngram gives every request exactly the completion it gets without
draft tokens (the same request with Serval's "speculative": false), greedy and seeded
n > 1 with stop strings, batched together, on stories260K and two tiny Hugging Face
models (Qwen3; Mistral with a sliding window), logprobs included; the spec_decode counters count drafts
only for requests that take them; bad flags are refused naming the flag."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

import hf_models  # noqa: E402
from serval_server import ServalServer  # noqa: E402

STORY = "Once upon a time, there was a little girl named Lily. She liked to play with her ball. One day, Lily"
PROMPTS = [STORY, "Tom and his dog went to the park. Tom and his dog", "The cat sat. The cat sat. The cat"]
REQUESTS = [dict(max_tokens=60, temperature=0),
            dict(max_tokens=40, temperature=0, stop=[" park", "."]),
            dict(max_tokens=40, temperature=0.8, seed=3, n=2, top_p=0.9),
            dict(max_tokens=30, temperature=0, frequency_penalty=0.5, extra_body={"min_tokens": 20}),
            dict(max_tokens=30, temperature=0, logprobs=2)]


@pytest.fixture(scope="module", params=["stories260K", "qwen3", "mistral"])
def server(request, serval, models, tmp_path_factory):
    if request.param == "stories260K":
        path = models / "stories260K" / "stories260K.gguf"
    else:
        path = tmp_path_factory.mktemp(f"spec-{request.param}")
        hf_models.build(request.param, path, models)
    # --batch-invariant: a 1 + k-token row's logits equal single-token steps' bit for bit
    # (by default they may differ in the last bits, as batching and chunking do), so
    # logprobs compare exactly.
    s = ServalServer(serval, path, "--speculative", "ngram", "--num-speculative-tokens", "5",
                     "--max-num-batched-tokens", "32", "--max-model-len", "256", "--batch-invariant")
    s.kind = request.param
    yield s
    s.stop()


def complete(server, prompt, speculative, extra_body=None, **kw):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.completions.create(model="test-model", prompt=prompt,
                                  extra_body={**(extra_body or {}), "speculative": speculative}, **kw)
    return [(c.index, c.text, c.finish_reason, c.logprobs and (c.logprobs.token_logprobs, c.logprobs.top_logprobs))
            for c in sorted(r.choices, key=lambda c: c.index)]


def run_all(server, speculative):
    # The random HF models' 128k-token vocabulary makes each sample slower: fewer prompts.
    prompts = PROMPTS if server.kind == "stories260K" else PROMPTS[:2]
    jobs = [(p, kw) for p in prompts for kw in REQUESTS]
    with ThreadPoolExecutor(4) as pool:  # batched together
        return list(pool.map(lambda j: complete(server, j[0], speculative, **j[1]), jobs))


def test_output_is_the_same_with_and_without_drafts(server):
    before = server.metrics()
    plain = run_all(server, speculative=False)
    after_plain = server.metrics()
    assert after_plain["serval:spec_decode_num_drafts_total"] == before["serval:spec_decode_num_drafts_total"]
    spec = run_all(server, speculative=True)
    assert spec == plain
    after = server.metrics()
    drafts = after["serval:spec_decode_num_drafts_total"] - after_plain["serval:spec_decode_num_drafts_total"]
    draft_tokens = (after["serval:spec_decode_num_draft_tokens_total"]
                    - after_plain["serval:spec_decode_num_draft_tokens_total"])
    accepted = (after["serval:spec_decode_num_accepted_tokens_total"]
                - after_plain["serval:spec_decode_num_accepted_tokens_total"])
    assert drafts > 0 and drafts <= draft_tokens <= 5 * drafts
    assert 0 <= accepted <= draft_tokens
    if server.kind == "stories260K":  # a trained model repeats itself: some drafts are right
        assert accepted > 0


@pytest.mark.parametrize("flags,named", [
    (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens"),
    (["--speculative", "ngram", "--num-speculative-tokens", "100"], "--num-speculative-tokens"),
    (["--speculative", "ngram", "--ngram-min", "4", "--ngram-max", "2"], "--ngram-max"),
    (["--speculative", "eagle"], "--speculative"),
])
def test_bad_flags_are_refused_naming_the_flag(serval, models, flags, named):
    r = subprocess.run([str(serval), "generate", "-m", str(models / "stories260K" / "stories260K.gguf"),
                        "-p", "Once", "-n", "2", *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert named in r.stderr, r.stderr
