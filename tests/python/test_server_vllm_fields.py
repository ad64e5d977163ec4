"""vLLM's extra request fields that Serval honours, end to end on stories260K with a
chat template that shows what it was given: request_id, truncate_prompt_tokens,
return_token_ids, stream_options.continuous_usage_stats, priority, and on chat
add_special_tokens, reasoning_effort and documents (template variables), echo,
continue_final_message, best_of."""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from serval_server import ServalServer  # noqa: E402

TEMPLATE = (
    "[{{ reasoning_effort }}|{% if documents %}{% for d in documents %}{{ d.title }};{% endfor %}{% endif %}]"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
PROMPT = "Once upon a time there was a little girl"
USER = {"role": "user", "content": "Hi"}


@pytest.fixture(scope="module")
def server(serval, models, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "show.jinja"
    template.write_text(TEMPLATE)
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf", "--chat-template", template)
    yield s
    s.stop()


def post(server, path, **body):
    status, headers, out = server.post(path, {"model": "test-model", **body})
    assert status == 200, out
    return out, headers


def complete(server, **body):
    return post(server, "/v1/completions", **body)[0]


def chat(server, **body):
    return post(server, "/v1/chat/completions", **body)[0]


def detokenize(server, ids):
    return post(server, "/detokenize", tokens=ids)[0]["prompt"]


def sse_chunks(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def stream(server, path, **body):
    status, _, text = server.post(path, {"model": "test-model", "stream": True, **body})
    assert status == 200, text
    return sse_chunks(text)


def test_request_id_names_the_response(server):
    out, headers = post(server, "/v1/completions", prompt="Once", max_tokens=2, request_id="my-id.1")
    assert out["id"] == "cmpl-my-id.1" and headers["X-Request-Id"] == "cmpl-my-id.1"
    out, _ = post(server, "/v1/chat/completions", messages=[USER], max_tokens=2, request_id="my-id.1")
    assert out["id"] == "chatcmpl-my-id.1"
    assert all(c["id"] == "cmpl-s" for c in stream(server, "/v1/completions", prompt="Once", max_tokens=2,
                                                    request_id="s"))
    for bad in ("a b", "", "x" * 129, "\u00e9"):
        status, _, err = server.post("/v1/completions", {"prompt": "Once", "request_id": bad})
        assert status == 400 and err["error"]["param"] == "request_id", (bad, err)


def test_truncate_prompt_tokens_keeps_the_last_tokens(server):
    full = complete(server, prompt=PROMPT, max_tokens=2, temperature=0, return_token_ids=True)
    ids = full["choices"][0]["prompt_token_ids"]
    assert len(ids) > 5
    cut = complete(server, prompt=PROMPT, max_tokens=2, temperature=0, return_token_ids=True,
                   truncate_prompt_tokens=4, echo=True)
    assert cut["choices"][0]["prompt_token_ids"] == ids[-4:]
    assert cut["usage"]["prompt_tokens"] == 4
    assert cut["choices"][0]["text"].startswith(detokenize(server, ids[-4:]))
    same = complete(server, prompt=PROMPT, max_tokens=2, temperature=0, return_token_ids=True,
                    truncate_prompt_tokens=-1)
    assert same["choices"][0]["prompt_token_ids"] == ids
    c = chat(server, messages=[USER], max_tokens=2, return_token_ids=True, truncate_prompt_tokens=3)
    assert len(c["prompt_token_ids"]) == 3 and c["usage"]["prompt_tokens"] == 3
    status, _, err = server.post("/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": 0})
    assert status == 400 and err["error"]["param"] == "truncate_prompt_tokens"


def test_return_token_ids_streamed_and_not(server):
    body = dict(prompt=PROMPT, max_tokens=8, temperature=0, return_token_ids=True)
    out = complete(server, **body)["choices"][0]
    assert len(out["token_ids"]) == 8
    assert detokenize(server, out["prompt_token_ids"] + out["token_ids"]).endswith(PROMPT + out["text"])
    chunks = stream(server, "/v1/completions", **body)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == out["prompt_token_ids"]
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == out["token_ids"]
    c = chat(server, messages=[USER], max_tokens=6, temperature=0, return_token_ids=True)
    assert detokenize(server, c["prompt_token_ids"]) == "[|]<user>Hi</user><assistant>"
    chunks = stream(server, "/v1/chat/completions", messages=[USER], max_tokens=6, temperature=0,
                    return_token_ids=True)
    assert chunks[0]["prompt_token_ids"] == c["prompt_token_ids"]
    assert sum((ch["choices"][0].get("token_ids", []) for ch in chunks), []) == c["choices"][0]["token_ids"]


def test_continuous_usage_stats(server):
    chunks = stream(server, "/v1/completions", prompt=PROMPT, max_tokens=6, temperature=0, ignore_eos=True,
                    stream_options={"include_usage": True, "continuous_usage_stats": True})
    with_choices = [c for c in chunks if c["choices"]]
    counts = [c["usage"]["completion_tokens"] for c in with_choices]
    assert all(c["usage"]["prompt_tokens"] > 0 for c in with_choices)
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    # Without include_usage there is no usage to repeat.
    chunks = stream(server, "/v1/chat/completions", messages=[USER], max_tokens=3,
                    stream_options={"continuous_usage_stats": True})
    assert all("usage" not in c for c in chunks)


def test_priority_is_accepted(server):
    assert complete(server, prompt="Once", max_tokens=2, priority=-5)["choices"]
    status, _, err = server.post("/v1/completions", {"prompt": "Once", "priority": "high"})
    assert status == 400 and err["error"]["param"] == "priority"


def test_template_variables_and_add_special_tokens(server):
    c = chat(server, messages=[USER], max_tokens=2, return_token_ids=True, reasoning_effort="low",
             documents=[{"title": "A", "text": "a"}, {"title": "B", "text": "b"}])
    assert detokenize(server, c["prompt_token_ids"]) == "[low|A;B;]<user>Hi</user><assistant>"
    plain = chat(server, messages=[USER], max_tokens=2, return_token_ids=True)["prompt_token_ids"]
    bos = chat(server, messages=[USER], max_tokens=2, return_token_ids=True, add_special_tokens=True)
    assert bos["prompt_token_ids"] == [1] + plain  # stories260K's BOS
    status, _, err = server.post("/v1/chat/completions", {"messages": [USER], "documents": "x"})
    assert status == 400 and err["error"]["param"] == "documents"


def test_continue_final_message_and_echo(server):
    messages = [USER, {"role": "assistant", "content": "Once upon"}]
    c = chat(server, messages=messages, max_tokens=6, temperature=0, return_token_ids=True,
             continue_final_message=True, echo=True)
    assert detokenize(server, c["prompt_token_ids"]) == "[|]<user>Hi</user><assistant>Once upon"
    text = c["choices"][0]["message"]["content"]
    assert text.startswith("Once upon") and len(text) > len("Once upon")
    chunks = stream(server, "/v1/chat/completions", messages=messages, max_tokens=6, temperature=0,
                    continue_final_message=True, echo=True)
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]) == text
    # Without continue_final_message the final message is closed; echo still repeats it
    # (no generation prompt: the reply has the last message's role).
    closed = chat(server, messages=messages, max_tokens=2, return_token_ids=True, add_generation_prompt=False,
                  echo=True)
    assert detokenize(server, closed["prompt_token_ids"]).endswith("Once upon</assistant>")
    assert closed["choices"][0]["message"]["content"].startswith("Once upon")
    # A generation prompt makes the reply the assistant's: a user message is not echoed.
    no_echo = chat(server, messages=[USER], max_tokens=3, temperature=0, echo=True)
    assert no_echo["choices"][0]["message"]["content"] == chat(server, messages=[USER], max_tokens=3,
                                                               temperature=0)["choices"][0]["message"]["content"]
    status, _, err = server.post("/v1/chat/completions", {"messages": messages, "continue_final_message": True,
                                                          "add_generation_prompt": True})
    assert status == 400 and err["error"]["param"] == "continue_final_message"


def test_chat_best_of(server):
    body = dict(messages=[USER], max_tokens=10, temperature=1.0, seed=99, logprobs=True)
    all3 = chat(server, **body, n=3)["choices"]

    def cumulative(choice):
        return sum(t["logprob"] for t in choice["logprobs"]["content"])

    best = chat(server, **body, n=1, best_of=3)
    assert best["choices"][0]["message"]["content"] == max(all3, key=cumulative)["message"]["content"]
    best_plain = chat(server, **{**body, "logprobs": False}, n=1, best_of=3)["choices"][0]
    assert best_plain["logprobs"] is None
    assert best_plain["message"]["content"] == best["choices"][0]["message"]["content"]
