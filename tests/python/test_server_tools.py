"""Tool calling through `serval serve` with the official openai client (issue 51, part 2),
on tiny random models: Qwen3's chat template (Hermes <tool_call> format, detected) and a
Llama 3.1-style template (JSON calls with "parameters"). tool_choice "required" and a named
function always yield parsed calls whose arguments validate against the function's schema
(the constraint, not the random model, guarantees it), streamed or not, one call or several;
"auto" returns text or calls; bad tool_choice values are a 400."""
import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")

import hf_models  # noqa: E402
from serval_server import ServalServer  # noqa: E402

HERE = __import__("pathlib").Path(__file__).resolve().parent

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -100, "maximum": 100},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


@pytest.fixture(scope="module", params=["qwen3", "llama31"])
def served(request, serval, models, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    if kind == "qwen3":
        hf_models.build("qwen3", folder, models)
        s = ServalServer(serval, folder, "--max-model-len", "2048")
    else:
        hf_models.build("llama3", folder, models)
        s = ServalServer(serval, folder, "--max-model-len", "2048",
                         "--chat-template", HERE / "chat_templates" / "llama31_style.jinja")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    yield kind, s, client
    s.stop()


def check_call(call, names=None):
    assert call.type == "function" and call.id
    assert call.function.name in (names or SCHEMAS)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_always_yields_valid_calls(served, seed):
    _, _, client = served
    r = client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=200, n=2)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls, choice.message
        for call in choice.message.tool_calls:
            check_call(call)


def test_named_function_and_no_parallel(served):
    _, _, client = served
    r = client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "add"}},
                                       parallel_tool_calls=False, temperature=1.0, seed=4, max_tokens=150)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "add"
    check_call(calls[0], ["add"])


def test_streamed_calls_equal_the_unstreamed_shape(served):
    _, _, client = served
    stream = client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS,
                                            tool_choice="required", temperature=0.7, seed=5, max_tokens=200,
                                            stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                entry["id"] = entry["id"] or tc.id
                if tc.function.name:
                    entry["name"] += tc.function.name
                entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and calls
    for entry in calls.values():
        assert entry["id"] and entry["name"] in SCHEMAS
        jsonschema.validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])


def test_auto_returns_text_or_valid_calls(served):
    _, _, client = served
    r = client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                       temperature=0, max_tokens=20)
    msg = r.choices[0].message
    if msg.tool_calls:
        for call in msg.tool_calls:
            assert call.function.name
    else:
        assert msg.content is not None and r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("body,needle", [
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "lacks"),
    ({"tool_choice": "required", "tools": None}, "needs 'tools'"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "both constrain"),
])
def test_bad_tool_choice_is_refused(served, body, needle):
    _, server, _ = served
    req = {"messages": MESSAGES, "tools": TOOLS, **body}
    if req.get("tools") is None:
        req.pop("tools")
    status, _, out = server.post("/v1/chat/completions", req)
    assert status == 400, out
    assert needle in out["error"]["message"] and out["error"]["param"] == "tool_choice"
