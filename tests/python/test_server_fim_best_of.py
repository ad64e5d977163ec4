"""suffix (fill-in-the-middle) and best_of on /v1/completions, end to end.

suffix: on a tiny Qwen3 model (its tokenizer has <|fim_prefix|> ...) the prompt the
model reads is exactly <|fim_prefix|>prompt<|fim_suffix|>suffix<|fim_middle|> as
transformers tokenizes it; stories260K has no FIM tokens and answers 400.
best_of: on stories260K, seeded at temperature 1, best_of 4 with n 2 returns the two
of the four samples that `n: 4` with the same seed returns (sample i draws from seed
+ i in both) with the highest cumulative logprob, best first."""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import hf_models  # noqa: E402
from serval_server import ServalServer  # noqa: E402

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def qwen(serval, models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-fim")
    hf_models.build("qwen3", folder, models)
    s = ServalServer(serval, folder, "--max-model-len", "512")
    s.folder = folder
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stories(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


def complete(server, **body):
    status, _, out = server.post("/v1/completions", {"model": "test-model", **body})
    assert status == 200, out
    return out


def sse_chunks(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_suffix_builds_the_psm_prompt(qwen):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(qwen.folder)
    expected = tok.encode("<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>")
    assert expected[0] == tok.convert_tokens_to_ids("<|fim_prefix|>")
    out = complete(qwen, prompt=PREFIX, suffix=SUFFIX, max_tokens=4, temperature=0, return_token_ids=True)
    assert out["choices"][0]["prompt_token_ids"] == expected
    assert out["usage"]["prompt_tokens"] == len(expected)
    # A prompt of token ids is the prefix as given.
    ids = tok.encode(PREFIX)
    by_ids = complete(qwen, prompt=ids, suffix=SUFFIX, max_tokens=4, temperature=0, return_token_ids=True)
    assert by_ids["choices"][0]["prompt_token_ids"] == expected
    assert by_ids["choices"][0]["text"] == out["choices"][0]["text"]
    # Streamed: the same prompt, with the first chunk.
    status, _, text = qwen.post("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4,
                                                    "temperature": 0, "stream": True, "return_token_ids": True})
    assert status == 200
    chunks = sse_chunks(text)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == expected
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]


def test_empty_suffix_changes_nothing(qwen):
    plain = complete(qwen, prompt=PREFIX, max_tokens=4, temperature=0, return_token_ids=True)
    empty = complete(qwen, prompt=PREFIX, suffix="", max_tokens=4, temperature=0, return_token_ids=True)
    assert empty["choices"][0]["prompt_token_ids"] == plain["choices"][0]["prompt_token_ids"]
    assert empty["choices"][0]["text"] == plain["choices"][0]["text"]


def test_suffix_with_echo_is_400(qwen):
    status, _, err = qwen.post("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "echo": True})
    assert status == 400 and err["error"]["param"] == "suffix", err


def test_suffix_without_fim_tokens_is_400(stories):
    status, _, err = stories.post("/v1/completions", {"prompt": "Once", "suffix": " the end.", "max_tokens": 2})
    assert status == 400, err
    assert err["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in err["error"]["message"]
    assert stories.post("/v1/completions", {"prompt": "Once", "suffix": "", "max_tokens": 2})[0] == 200


BODY = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 1234}


def cumulative(choice):
    return sum(choice["logprobs"]["token_logprobs"])


def test_best_of_returns_the_n_most_likely_samples(stories):
    all4 = complete(stories, **BODY, n=4, logprobs=0)
    sums = [cumulative(c) for c in all4["choices"]]
    assert len(set(sums)) == 4, sums  # distinct, so the ranking is unambiguous
    ranked = sorted(all4["choices"], key=cumulative, reverse=True)
    assert ranked[:2] != all4["choices"][:2]  # the first two samples would not do
    best = complete(stories, **BODY, n=2, best_of=4, logprobs=0)
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert [cumulative(c) for c in best["choices"]] == pytest.approx([cumulative(c) for c in ranked[:2]], abs=1e-6)
    # Usage counts every sample, as OpenAI bills best_of.
    assert best["usage"]["completion_tokens"] == all4["usage"]["completion_tokens"]
    # Without logprobs asked, the same choices come without them.
    plain = complete(stories, **BODY, n=2, best_of=4)
    assert [c["text"] for c in plain["choices"]] == [c["text"] for c in ranked[:2]]
    assert all(c["logprobs"] is None for c in plain["choices"])


def test_best_of_with_several_prompts(stories):
    body = {**BODY, "prompt": ["Once upon a time", "The cat"], "logprobs": 0}
    all3 = complete(stories, **body, n=3)
    best = complete(stories, **body, n=1, best_of=3)
    assert [c["index"] for c in best["choices"]] == [0, 1]
    for p in range(2):
        mine = all3["choices"][3 * p:3 * p + 3]
        assert best["choices"][p]["text"] == max(mine, key=cumulative)["text"]


def test_best_of_above_n_is_not_streamed(stories):
    status, _, err = stories.post("/v1/completions", {**BODY, "n": 1, "best_of": 2, "stream": True})
    assert status == 400 and err["error"]["param"] == "best_of", err
    # best_of equal to n streams as before.
    assert stories.post("/v1/completions", {**BODY, "n": 2, "best_of": 2, "stream": True})[0] == 200
