"""Response shapes: every /v1/completions and /v1/chat/completions response, and every
streamed chunk, across a matrix of request options (n, logprobs, echo, stop, max_tokens,
stream_options, response_format, tools and tool_choice, best_of, suffix), must

1. validate, in pydantic's strict mode (no coercion of "1" to 1), as the `openai` SDK's own
   types: openai.types.Completion, openai.types.chat.ChatCompletion and ChatCompletionChunk;
2. carry every key OpenAI always sends. The SDK's models cannot check that: they allow extra
   keys and give most fields a default of None, so a missing `refusal` or `logprobs` passes
   them. REQUIRED below lists the keys from OpenAI's API spec, walked recursively; a
   nullable key listed there must be present as null.

Where the SDK's types are stricter than OpenAI's own wire format, the one difference is
allowed explicitly (see sdk_view): a streamed completion chunk's finish_reason is null
until the choice ends, and an echoed prompt's first token has null token_logprobs and
top_logprobs (nothing predicts it).

Models: stories260K (completions), a tiny random Qwen3 with its real chat template (chat,
Hermes tool calls, fill-in-the-middle `suffix`) and a tiny random Llama 3 with the Llama
3.1-style template (JSON tool calls), as test_server_tools.py uses them."""
import copy
import json
import pathlib

import pytest

openai = pytest.importorskip("openai")

from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402
from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

import hf_models  # noqa: E402
from serval_server import ServalServer, parse_sse  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent

# The `required` lists of OpenAI's API spec (github.com/openai/openai-openapi, openapi.yaml,
# components/schemas, read at commit 5780008 of late 2024; the choice, logprobs and function
# objects are inline schemas there, named here by where they sit). Each entry: the schema's
# required keys, and for the keys whose values are objects (or lists of objects) the schema
# those follow. Checked besides, where each check is made: usage on every whole response
# (SERVER.md), `usage: null` on every other chunk with include_usage (the spec's text for
# ChatCompletionStreamOptions.include_usage), and a chat stream's first delta per choice
# naming the role and a tool call's first delta its id, type and name, as OpenAI sends them.
REQUIRED = {
    # CreateCompletionResponse; streamed completions have the same shape (the spec says so).
    "CreateCompletionResponse": ({"id", "object", "created", "model", "choices"},
                                 {"choices": "CreateCompletionResponse.choices", "usage": "CompletionUsage"}),
    "CreateCompletionResponse.choices": ({"finish_reason", "index", "logprobs", "text"}, {}),
    "CreateChatCompletionResponse": ({"id", "object", "created", "model", "choices"},
                                     {"choices": "CreateChatCompletionResponse.choices", "usage": "CompletionUsage"}),
    "CreateChatCompletionResponse.choices": ({"finish_reason", "index", "message", "logprobs"},
                                             {"message": "ChatCompletionResponseMessage",
                                              "logprobs": "ChatChoiceLogprobs"}),
    "ChatCompletionResponseMessage": ({"role", "content", "refusal"},
                                      {"tool_calls": "ChatCompletionMessageToolCall"}),
    "ChatCompletionMessageToolCall": ({"id", "type", "function"},
                                      {"function": "ChatCompletionMessageToolCall.function"}),
    "ChatCompletionMessageToolCall.function": ({"name", "arguments"}, {}),
    # The choices' `logprobs` object, streamed or not.
    "ChatChoiceLogprobs": ({"content", "refusal"},
                           {"content": "ChatCompletionTokenLogprob", "refusal": "ChatCompletionTokenLogprob"}),
    "ChatCompletionTokenLogprob": ({"token", "logprob", "bytes", "top_logprobs"},
                                   {"top_logprobs": "ChatCompletionTokenLogprob.top_logprobs"}),
    "ChatCompletionTokenLogprob.top_logprobs": ({"token", "logprob", "bytes"}, {}),
    "CompletionUsage": ({"prompt_tokens", "completion_tokens", "total_tokens"}, {}),
    "CreateChatCompletionStreamResponse": ({"id", "object", "created", "model", "choices"},
                                           {"choices": "CreateChatCompletionStreamResponse.choices",
                                            "usage": "CompletionUsage"}),
    "CreateChatCompletionStreamResponse.choices": ({"delta", "finish_reason", "index"},
                                                   {"delta": "ChatCompletionStreamResponseDelta",
                                                    "logprobs": "ChatChoiceLogprobs"}),
    "ChatCompletionStreamResponseDelta": (set(), {"tool_calls": "ChatCompletionMessageToolCallChunk"}),
    "ChatCompletionMessageToolCallChunk": ({"index"}, {"function": "ChatCompletionMessageToolCallChunk.function"}),
    "ChatCompletionMessageToolCallChunk.function": (set(), {}),
}


def missing_keys(obj, schema, path="$"):
    """Every required key absent from obj or the objects inside it, as JSON paths."""
    if obj is None:  # a nullable object: its keys are not asked for
        return []
    if isinstance(obj, list):
        return [m for i, item in enumerate(obj) for m in missing_keys(item, schema, f"{path}[{i}]")]
    assert isinstance(obj, dict), f"{path} ({schema}) is {type(obj).__name__}, not an object"
    required, children = REQUIRED[schema]
    out = [f"{path}.{k} ({schema})" for k in sorted(required - obj.keys())]
    for key, child in children.items():
        if key in obj:
            out += missing_keys(obj[key], child, f"{path}.{key}")
    return out


def sdk_view(obj, echo):
    """A copy of a completion object with OpenAI's own departures from the SDK's types
    taken out, each checked where it is taken out:
    - a streamed chunk's finish_reason is null until its choice ends (the spec's streaming
      example shows it; the SDK's CompletionChoice.finish_reason is not Optional);
    - with echo, the prompt's first token has no score: null in token_logprobs and
      top_logprobs (the legacy API's shape, read by lm-eval; the SDK types them as floats
      and dicts)."""
    view = copy.deepcopy(obj)
    for choice in view["choices"]:
        if choice.get("finish_reason") is None:
            choice["finish_reason"] = "stop"
        lp = choice.get("logprobs")
        if lp and any(v is None for v in lp["token_logprobs"]):
            nulls = [i for i, v in enumerate(lp["token_logprobs"]) if v is None]
            assert echo and nulls == [0], f"null token_logprobs at {nulls} (echo: {echo})"
            assert lp["top_logprobs"][0] is None
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                lp[key] = lp[key][1:]
    return view


def check(obj, schema, model, *, sdk_obj=None):
    missing = missing_keys(obj, schema)
    assert not missing, f"missing keys that OpenAI always sends: {missing}\n{json.dumps(obj)[:2000]}"
    return model.model_validate(obj if sdk_obj is None else sdk_obj, strict=True)


def check_usage(usage):
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage


# ---------------------------------------------------------------------------------------
# Servers.

@pytest.fixture(scope="module")
def stories(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen(serval, models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-shapes")
    hf_models.build("qwen3", folder, models)
    s = ServalServer(serval, folder, "--max-model-len", "1024", "--kv-cache-tokens", "8192")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llama31(serval, models, tmp_path_factory):
    """Tool calls in the Llama 3.1 JSON format (test_server_tools.py's second template)."""
    folder = tmp_path_factory.mktemp("llama3-shapes")
    hf_models.build("llama3", folder, models)
    s = ServalServer(serval, folder, "--max-model-len", "2048",
                     "--chat-template", HERE / "chat_templates" / "llama31_style.jinja")
    yield s
    s.stop()


def post(server, path, body):
    status, _, out = server.post(path, {"model": "test-model", **body})
    assert status == 200, out
    return out


def post_stream(server, path, body):
    status, headers, text = server.post(path, {"model": "test-model", **body, "stream": True})
    assert status == 200, text
    assert headers.get("Content-Type", "").startswith("text/event-stream"), headers
    return parse_sse(text)


# ---------------------------------------------------------------------------------------
# Completions.

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                   "warm": {"type": "boolean"}},
                  "required": ["city", "warm"], "additionalProperties": False}

COMPLETION_CASES = {
    "plain": {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
    "n": {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 3},
    "logprobs": {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 3},
    "logprobs_0": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 0},
    "echo": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "echo": True},
    "echo_logprobs": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2},
    "echo_logprobs_prompt_only": {"prompt": "Once upon a time", "max_tokens": 0, "echo": True, "logprobs": 1},
    "max_tokens_0": {"prompt": "Once upon a time", "max_tokens": 0},
    "stop": {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": [".", ","]},
    "length": {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "ignore_eos": True},
    "prompts_and_n": {"prompt": ["Once upon a time", "The cat"], "max_tokens": 4, "temperature": 1.0, "seed": 3,
                      "n": 2, "logprobs": 1},
    "token_ids_prompt": {"prompt": [1, 403, 407], "max_tokens": 4, "temperature": 0},
    "json_object": {"prompt": "Data:", "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}},
    "json_schema": {"prompt": "Data:", "max_tokens": 60, "temperature": 0,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "w", "schema": WEATHER_SCHEMA, "strict": True}}},
    "best_of_equal_n": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 1.0, "seed": 5, "n": 2,
                        "best_of": 2},
    "vllm_extras": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "return_token_ids": True,
                    "prompt_logprobs": 1},
    # streamed only: stream_options
    "include_usage": {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 1.0, "seed": 2, "n": 2,
                      "stream_options": {"include_usage": True}},
    "continuous_usage": {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 1,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    # not streamed: best_of above n is a 400 with stream
    "best_of": {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 9, "n": 2, "best_of": 4,
                "logprobs": 1},
}
STREAM_ONLY = {"include_usage", "continuous_usage"}
NOT_STREAMED = {"best_of"}


def num_choices(body):
    prompts = body["prompt"] if isinstance(body["prompt"], list) and isinstance(body["prompt"][0], str) else [0]
    return len(prompts) * body.get("n", 1)


def check_completion_response(out, body):
    parsed = check(out, "CreateCompletionResponse", Completion, sdk_obj=sdk_view(out, body.get("echo", False)))
    assert out["object"] == "text_completion" and out["usage"] is not None  # SERVER.md: every response has usage
    check_usage(out["usage"])
    assert [c["index"] for c in out["choices"]] == list(range(num_choices(body)))
    for c in out["choices"]:
        assert c["finish_reason"] is not None
        assert (c["logprobs"] is None) == ("logprobs" not in body)
    return parsed


def check_completion_stream(chunks, body):
    include_usage = body.get("stream_options", {}).get("include_usage", False)
    continuous = body.get("stream_options", {}).get("continuous_usage_stats", False)
    finished = {}
    for chunk in chunks:
        check(chunk, "CreateCompletionResponse", Completion, sdk_obj=sdk_view(chunk, body.get("echo", False)))
        assert (chunk["object"], chunk["id"], chunk["created"], chunk["model"]) == \
            ("text_completion", chunks[0]["id"], chunks[0]["created"], chunks[0]["model"])
        # ChatCompletionStreamOptions.include_usage: the other chunks carry usage: null.
        assert ("usage" in chunk) == include_usage, chunk
        for c in chunk["choices"]:
            assert c["index"] not in finished, f"choice {c['index']} went on after finish_reason {chunk}"
            if c["finish_reason"] is not None:
                finished[c["index"]] = c["finish_reason"]
        if include_usage and chunk["choices"]:
            assert (chunk["usage"] is not None) == continuous, chunk
    assert sorted(finished) == list(range(num_choices(body))), finished
    assert set(finished.values()) <= {"stop", "length"}
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] is not None
        check_usage(chunks[-1]["usage"])


def params(cases, stream_only):
    return [pytest.param(name, stream, id=f"{name}-{'stream' if stream else 'whole'}")
            for name in cases for stream in (False, True)
            if not (stream and name in NOT_STREAMED) and not (not stream and name in stream_only)]


@pytest.mark.parametrize("name,stream", params(COMPLETION_CASES, STREAM_ONLY))
def test_completion_shapes(stories, name, stream):
    body = COMPLETION_CASES[name]
    if stream:
        check_completion_stream(post_stream(stories, "/v1/completions", body), body)
    else:
        out = post(stories, "/v1/completions", body)
        check_completion_response(out, body)
        if name == "length":
            assert out["choices"][0]["finish_reason"] == "length"


FIM = {"prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 6, "temperature": 0,
       "logprobs": 1}


def test_completion_suffix_shapes(qwen):
    check_completion_response(post(qwen, "/v1/completions", FIM), FIM)
    check_completion_stream(post_stream(qwen, "/v1/completions", FIM), FIM)


# ---------------------------------------------------------------------------------------
# Chat completions.

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
NOON = {"type": "function", "function": {
    "name": "is_noon", "description": "Whether it is noon",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
TOOLS = [WEATHER, NOON]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]

CHAT_CASES = {
    "plain": {"messages": USER, "max_tokens": 8, "temperature": 0},
    "n": {"messages": USER, "max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 3},
    "logprobs": {"messages": USER, "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 3},
    "logprobs_no_top": {"messages": USER, "max_tokens": 3, "temperature": 0, "logprobs": True},
    "n_logprobs": {"messages": USER, "max_tokens": 3, "temperature": 1.0, "seed": 1, "n": 2, "logprobs": True,
                   "top_logprobs": 1},
    "stop": {"messages": USER, "max_tokens": 40, "temperature": 1.0, "seed": 4, "stop": ["a", "e", "o"]},
    "length": {"messages": USER, "max_completion_tokens": 5, "temperature": 0, "ignore_eos": True},
    "max_tokens_0": {"messages": USER, "max_tokens": 0},
    "system_multi_turn": {"messages": [{"role": "system", "content": "Be terse."}, *USER,
                                       {"role": "assistant", "content": "Sunny."},
                                       {"role": "user", "content": "And Rome?"}],
                          "max_tokens": 4, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}},
    "json_object": {"messages": USER, "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}},
    "json_schema": {"messages": USER, "max_tokens": 60, "temperature": 0,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "w", "schema": WEATHER_SCHEMA, "strict": True}}},
    "tools_required": {"messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200,
                       "temperature": 1.0, "seed": 1, "n": 2},
    "tools_required_parallel": {"messages": USER, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 300,
                                "temperature": 1.0, "seed": 2, "parallel_tool_calls": True, "logprobs": True},
    "tools_named": {"messages": USER, "tools": TOOLS, "max_tokens": 200, "temperature": 1.0, "seed": 3,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                    "parallel_tool_calls": False},
    "tools_auto": {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 12, "temperature": 0},
    "tools_none": {"messages": USER, "tools": TOOLS, "tool_choice": "none", "max_tokens": 6, "temperature": 0},
    "tool_result_turn": {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
                         "tools": TOOLS, "max_tokens": 6, "temperature": 0},
    "best_of_equal_n": {"messages": USER, "max_tokens": 4, "temperature": 1.0, "seed": 5, "n": 2, "best_of": 2},
    "vllm_extras": {"messages": USER, "max_tokens": 4, "temperature": 0, "return_token_ids": True,
                    "prompt_logprobs": 1, "top_k": 5},
    "echo": {"messages": [*USER, {"role": "assistant", "content": "It is"}], "add_generation_prompt": False,
             "continue_final_message": True, "echo": True, "max_tokens": 4, "temperature": 0},
    # streamed only: stream_options
    "include_usage": {"messages": USER, "max_tokens": 5, "temperature": 1.0, "seed": 2, "n": 2,
                      "stream_options": {"include_usage": True}},
    "continuous_usage": {"messages": USER, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    "tools_include_usage": {"messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200,
                            "temperature": 1.0, "seed": 6, "stream_options": {"include_usage": True}},
    # not streamed: best_of above n is a 400 with stream
    "best_of": {"messages": USER, "max_tokens": 5, "temperature": 1.0, "seed": 9, "n": 2, "best_of": 3,
                "logprobs": True},
}


def check_chat_response(out, body):
    parsed = check(out, "CreateChatCompletionResponse", ChatCompletion)
    assert out["object"] == "chat.completion" and out["usage"] is not None
    check_usage(out["usage"])
    assert [c["index"] for c in out["choices"]] == list(range(body.get("n", 1)))
    for c in out["choices"]:
        assert c["message"]["role"] == "assistant"
        assert (c["logprobs"] is None) == (not body.get("logprobs"))
        if c["logprobs"] is not None:
            assert all(len(t["top_logprobs"]) == body.get("top_logprobs", 0) for t in c["logprobs"]["content"])
        if c["message"].get("tool_calls"):
            assert c["finish_reason"] == "tool_calls"
            for call in c["message"]["tool_calls"]:
                assert call["type"] == "function" and call["id"]
                json.loads(call["function"]["arguments"])
    if body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict):
        assert all(c["finish_reason"] == "tool_calls" for c in out["choices"]), out["choices"]
    return parsed


def check_chat_stream(chunks, body):
    include_usage = body.get("stream_options", {}).get("include_usage", False)
    continuous = body.get("stream_options", {}).get("continuous_usage_stats", False)
    state = ChatCompletionStreamState(input_tools=body.get("tools", []))
    seen, finished, calls, content = set(), {}, {}, {}
    for chunk in chunks:
        parsed = check(chunk, "CreateChatCompletionStreamResponse", ChatCompletionChunk)
        state.handle_chunk(parsed)  # the SDK's own accumulator takes every chunk
        assert (chunk["object"], chunk["id"], chunk["created"], chunk["model"]) == \
            ("chat.completion.chunk", chunks[0]["id"], chunks[0]["created"], chunks[0]["model"])
        assert ("usage" in chunk) == include_usage, chunk
        if include_usage and chunk["choices"]:
            assert (chunk["usage"] is not None) == continuous, chunk
        for c in chunk["choices"]:
            i, delta = c["index"], c["delta"]
            assert i not in finished, f"choice {i} went on after finish_reason: {chunk}"
            if i not in seen:  # OpenAI's first delta of a choice names the role
                seen.add(i)
                assert delta.get("role") == "assistant" and "refusal" in delta, chunk
            content[i] = content.get(i, "") + (delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                if (i, tc["index"]) not in calls:  # a call's first delta: its id, type and name (as OpenAI's)
                    assert tc.get("id") and tc.get("type") == "function" and tc["function"].get("name"), tc
                    calls[(i, tc["index"])] = ""
                calls[(i, tc["index"])] += tc["function"].get("arguments") or ""
            if c["finish_reason"] is not None:
                finished[i] = c["finish_reason"]
    assert sorted(finished) == list(range(body.get("n", 1))), finished
    for (i, _), arguments in calls.items():
        json.loads(arguments)
        assert finished[i] == "tool_calls"
    if body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict):
        assert set(finished.values()) == {"tool_calls"}, finished
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] is not None
        check_usage(chunks[-1]["usage"])
    snapshot = state.current_completion_snapshot
    assert {c.index: c.message.content or "" for c in snapshot.choices} == content


@pytest.mark.parametrize("name,stream", params(CHAT_CASES, STREAM_ONLY | {"tools_include_usage"}))
def test_chat_shapes(qwen, name, stream):
    body = CHAT_CASES[name]
    if stream:
        check_chat_stream(post_stream(qwen, "/v1/chat/completions", body), body)
    else:
        out = post(qwen, "/v1/chat/completions", body)
        check_chat_response(out, body)
        if name == "length":
            assert out["choices"][0]["finish_reason"] == "length"


TOOL_CASES = [name for name in CHAT_CASES if name.startswith("tool")]


@pytest.mark.parametrize("name,stream", params(TOOL_CASES, {"tools_include_usage"}))
def test_chat_tool_shapes_llama31_format(llama31, name, stream):
    body = CHAT_CASES[name]
    if stream:
        check_chat_stream(post_stream(llama31, "/v1/chat/completions", body), body)
    else:
        check_chat_response(post(llama31, "/v1/chat/completions", body), body)


# ---------------------------------------------------------------------------------------
# The checker itself: it must fail on what it is meant to catch.

def test_the_checks_catch_missing_and_mistyped_keys():
    good = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": "hi", "refusal": None}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    check(good, "CreateChatCompletionResponse", ChatCompletion)
    no_refusal = copy.deepcopy(good)
    del no_refusal["choices"][0]["message"]["refusal"]
    ChatCompletion.model_validate(no_refusal, strict=True)  # the SDK alone lets it through
    with pytest.raises(AssertionError, match=r"message\.refusal"):
        check(no_refusal, "CreateChatCompletionResponse", ChatCompletion)
    string_created = {**good, "created": "1"}
    with pytest.raises(Exception, match="created"):
        check(string_created, "CreateChatCompletionResponse", ChatCompletion)
    no_top = copy.deepcopy(good)
    no_top["choices"][0]["logprobs"] = {"content": [{"token": "hi", "logprob": -1.0, "bytes": [104, 105]}],
                                        "refusal": None}
    with pytest.raises(AssertionError, match=r"content\[0\]\.top_logprobs"):
        check(no_top, "CreateChatCompletionResponse", ChatCompletion)
    chunk_call = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "finish_reason": None,
                               "delta": {"tool_calls": [{"id": "c", "function": {"name": "f"}}]}}]}
    with pytest.raises(AssertionError, match=r"tool_calls\[0\]\.index"):
        check(chunk_call, "CreateChatCompletionStreamResponse", ChatCompletionChunk)
    # A null score anywhere but an echoed prompt's first token is refused.
    completion = {"id": "x", "object": "text_completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "finish_reason": "length", "text": "ab",
                               "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, None],
                                            "top_logprobs": [{"a": -1.0}, None], "text_offset": [0, 1]}}]}
    with pytest.raises(AssertionError, match="null token_logprobs"):
        sdk_view(completion, echo=True)
