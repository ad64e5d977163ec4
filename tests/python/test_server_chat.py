"""/v1/chat/completions end to end: tiny random Llama 3 and Qwen models (hf_models.py)
carrying their real chat templates (tokenizer_config.json from shared/models/tokenizers).
The server's rendered prompt tokens (/tokenize with messages, and usage.prompt_tokens)
must equal transformers' apply_chat_template; streams come in OpenAI's order."""
import copy
import json
import urllib.request

import pytest

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

import hf_models  # noqa: E402
from serval_server import ServalServer, parse_sse  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello there!"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": [{"type": "text", "text": "Another"}, {"type": "text", "text": "one?"}]}],
    "tools": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
}


def reference_messages(messages):
    """What transformers is given: text parts joined, tool-call arguments as dicts
    (the form the templates print with tojson)."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("content") is None:  # the server gives the templates "" (Qwen's tests `in content`)
            m["content"] = ""
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def input_ids(encoded):
    """apply_chat_template(tokenize=True) gives a list, or a BatchEncoding in newer transformers."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def chat_server(request, serval, models, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    hf_models.build(kind, folder, models)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    s = ServalServer(serval, folder, "--max-model-len", "1024", "--kv-cache-tokens", "4096")
    yield kind, s, tok
    s.stop()


def test_rendered_prompt_matches_transformers(chat_server):
    kind, server, tok = chat_server
    for name, messages in CONVERSATIONS.items():
        tools = TOOLS if name == "tools" else None
        kwargs_variants = [{}] + ([{"enable_thinking": False}] if kind == "qwen3" else [])
        for kwargs in kwargs_variants:
            want = tok.apply_chat_template(reference_messages(messages), tools=tools, add_generation_prompt=True,
                                           tokenize=True, **kwargs)
            want = input_ids(want)
            body = {"messages": messages, "add_generation_prompt": True, "chat_template_kwargs": kwargs}
            if tools:
                body["tools"] = tools
            status, _, got = server.post("/tokenize", body)
            assert status == 200, got
            assert got["tokens"] == list(want), (kind, name, kwargs, tok.decode(got["tokens"]), tok.decode(want))


def test_chat_completion_usage_counts_the_rendered_prompt(chat_server):
    kind, server, tok = chat_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    messages = CONVERSATIONS["system_multi_turn"]
    want = tok.apply_chat_template(reference_messages(messages), add_generation_prompt=True, tokenize=True)
    want = input_ids(want)
    r = client.chat.completions.create(model="test-model", messages=messages, max_completion_tokens=8,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(want)
    assert r.usage.completion_tokens == 8


def test_chat_with_tools_and_logprobs(chat_server):
    kind, server, tok = chat_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="test-model", messages=CONVERSATIONS["tools"], tools=TOOLS,
                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token or entry.bytes


def test_chat_stream_order(chat_server):
    kind, server, tok = chat_server
    body = {"model": "test-model", "messages": CONVERSATIONS["user"], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        chunks = parse_sse(r.read().decode())
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all(set(c["choices"][0]["delta"]) == {"content"} and c["choices"][0]["finish_reason"] is None
               for c in middle)
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    # The streamed text equals the non-streamed one.
    body.pop("stream"), body.pop("stream_options")
    _, _, whole = server.post("/v1/chat/completions", body)
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == whole["choices"][0]["message"]["content"]


def test_chat_stream_with_openai_client_and_n(chat_server):
    kind, server, tok = chat_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    roles, finishes = {}, {}
    for chunk in client.chat.completions.create(model="test-model", messages=CONVERSATIONS["user"], max_tokens=5,
                                                temperature=1.0, seed=1, n=2, stream=True,
                                                extra_body={"ignore_eos": True}):
        for ch in chunk.choices:
            if ch.delta.role:
                roles[ch.index] = ch.delta.role
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert roles == {0: "assistant", 1: "assistant"} and finishes == {0: "length", 1: "length"}


def test_responses_carry_refusal_null_and_validate_as_openai_types(chat_server):
    """OpenAI's ChatCompletionMessage.refusal is required (nullable), as are the choice
    logprobs' content and refusal; the first streamed delta carries refusal too."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    kind, server, tok = chat_server
    body = {"model": "test-model", "messages": CONVERSATIONS["user"], "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "n": 2}
    status, _, raw = server.post("/v1/chat/completions", body)
    assert status == 200, raw
    parsed = ChatCompletion.model_validate(raw)
    for raw_choice, choice in zip(raw["choices"], parsed.choices):
        assert raw_choice["message"]["refusal"] is None and "refusal" in choice.message.model_fields_set
        assert set(raw_choice["logprobs"]) == {"content", "refusal"} and raw_choice["logprobs"]["refusal"] is None
        assert {"content", "refusal"} <= choice.logprobs.model_fields_set and len(choice.logprobs.content) == 3
    req = urllib.request.Request(server.url + "/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        chunks = parse_sse(r.read().decode())
    firsts = {}
    for raw_chunk in chunks:
        chunk = ChatCompletionChunk.model_validate(raw_chunk)
        (raw_choice,), (choice,) = raw_chunk["choices"], chunk.choices
        firsts.setdefault(choice.index, raw_choice["delta"])
        if raw_choice["logprobs"] is not None:
            assert raw_choice["logprobs"]["refusal"] is None and "refusal" in choice.logprobs.model_fields_set
    assert firsts == {i: {"role": "assistant", "content": "", "refusal": None} for i in (0, 1)}


def test_empty_completion_prompt_is_the_bos_token_or_400(chat_server):
    kind, server, tok = chat_server
    status, _, r = server.post("/v1/completions", {"prompt": "", "max_tokens": 2})
    if tok("")["input_ids"]:  # the tokenizer adds a BOS: that is the prompt
        assert status == 200 and r["usage"]["prompt_tokens"] == len(tok("")["input_ids"]), r
    else:  # these tokenizers add none (stories260K's does: test_server_spec_values.py)
        assert status == 400 and r["error"]["param"] == "prompt", r


def test_model_without_template_gets_400(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    try:
        status, _, body = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 400
        assert "chat template" in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    finally:
        s.stop()
