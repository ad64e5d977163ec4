"""The "Request fields" table of docs/SERVER.md is true: every field of OpenAI's
completions and chat-completions request schemas (read from the installed `openai`
package) and of vLLM's extra fields is in it, and a request with each field set behaves
as its row says (honoured, no-op, ignored: 200; refused: 400 naming it; the neutral
value of a refused field: 200). Fields in no row are logged once per name."""
import json
import pathlib
import re
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import hf_models  # noqa: E402
from serval_server import ServalServer  # noqa: E402

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "SERVER.md"
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# vLLM's CompletionRequest and ChatCompletionRequest fields beyond OpenAI's
# (vllm/entrypoints/openai/protocol.py of mid-2025, with guided_* and best_of, and
# the newer completion/ and chat_completion/protocol.py, with structured_outputs).
VLLM_COMMON = [
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs",
    "add_special_tokens", "response_format", "structured_outputs", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "priority",
    "request_id", "logits_processors", "return_tokens_as_token_ids", "return_token_ids", "cache_salt",
    "kv_transfer_params", "vllm_xargs", "max_repetition_pattern_size", "min_repetition_pattern_size",
    "repetition_min_count", "best_of", "user",
]
VLLM_FIELDS = {
    "completions": VLLM_COMMON + ["prompt_embeds", "echo", "suffix"],
    "chat": VLLM_COMMON + ["bad_words", "echo", "add_generation_prompt", "continue_final_message", "documents",
                           "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "structural_tag",
                           "reasoning_effort", "include_reasoning", "parallel_tool_calls", "tools", "tool_choice"],
}

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
USER = {"role": "user", "content": "Hi"}

# A valid value that asks for something, per field (a dict: per endpoint); a tuple
# adds the fields it needs.
SAMPLES = {
    "model": "test-model", "prompt": "Once upon", "messages": [USER], "max_tokens": 3,
    "max_completion_tokens": 3, "n": 2, "best_of": 2, "echo": True, "suffix": " the end.",
    "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.5, "presence_penalty": 0.5,
    "logit_bias": {"1": 5}, "logprobs": {"completions": 1, "chat": True}, "top_logprobs": (2, {"logprobs": True}),
    "seed": 7, "stop": ["\n"], "stream": True,
    "stream_options": ({"include_usage": True, "continuous_usage_stats": True}, {"stream": True}),
    "reasoning_effort": "low", "user": "u1", "metadata": {"k": "v"}, "store": True, "service_tier": "auto",
    "prompt_cache_key": "k", "prompt_cache_options": {"mode": "implicit"}, "prompt_cache_retention": "24h",
    "safety_identifier": "s", "prediction": {"type": "content", "content": "Hi"},
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
    "moderation": {"model": "omni-moderation-latest"}, "verbosity": "low", "web_search_options": {},
    "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "stop_token_ids": [2],
    "include_stop_str_in_output": True, "ignore_eos": True, "min_tokens": 1, "skip_special_tokens": False,
    "prompt_logprobs": 1, "truncate_prompt_tokens": 2, "add_special_tokens": True, "priority": 1,
    "request_id": "fields-test", "return_token_ids": True, "speculative": False, "add_generation_prompt": True,
    "continue_final_message": (True, {"messages": [USER, {"role": "assistant", "content": "Once"}]}),
    "chat_template_kwargs": {"enable_thinking": False}, "documents": [{"title": "t", "text": "x"}],
    "spaces_between_special_tokens": False, "mm_processor_kwargs": {"num_crops": 4},
    "use_beam_search": True, "length_penalty": 0.5, "allowed_token_ids": [1, 2], "bad_words": ["x"],
    "max_repetition_pattern_size": 4, "min_repetition_pattern_size": 2, "repetition_min_count": 3,
    "logits_processors": ["my.Processor"], "return_tokens_as_token_ids": True, "cache_salt": "salt",
    "kv_transfer_params": {"do_remote_decode": True}, "vllm_xargs": {"k": 1}, "prompt_embeds": "AAAA",
    "chat_template": "{{ messages }}", "include_reasoning": False,
    "response_format": {"type": "json_object"}, "structured_outputs": {"json": {"type": "object"}},
    "guided_json": {"type": "object"}, "guided_regex": "[a-z]+", "guided_choice": ["a", "b"],
    "guided_grammar": 'root ::= "a"', "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": " ",
    "structural_tag": "{}", "tools": [TOOL], "tool_choice": ("required", {"tools": [TOOL]}), "parallel_tool_calls": False,
    "functions": [{"name": "f", "parameters": {"type": "object", "properties": {}}}], "function_call": "auto",
}


def table_rows():
    """(field, endpoint, status, note) for every field of the doc's table."""
    text = DOC.read_text()
    section = text[text.index("### Request fields"):]
    section = section[:section.index("\n\n", section.index("| field |"))]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names, endpoint, status, note = cells[0], cells[1], cells[2], "|".join(cells[3:])
        for name in re.findall(r"`([a-z_]+)`", names):
            for ep in (["completions", "chat"] if endpoint == "both" else [endpoint]):
                rows.append((name, ep, status, note))
    return rows


ROWS = table_rows()


def openai_fields(endpoint):
    if endpoint == "completions":
        from openai.types import completion_create_params as m
    else:
        from openai.types.chat import completion_create_params as m
    fields = set()
    for cls in (m.CompletionCreateParamsBase, m.CompletionCreateParamsNonStreaming, m.CompletionCreateParamsStreaming):
        fields |= set(cls.__annotations__)
    return fields


def test_table_lists_every_openai_and_vllm_field():
    statuses = {s for _, _, s, _ in ROWS}
    assert statuses <= {"honoured", "refused", "no-op", "ignored"}, statuses
    pairs = [(f, ep) for f, ep, _, _ in ROWS]
    assert len(pairs) == len(set(pairs)), "a field is listed twice for an endpoint"
    for ep in ENDPOINTS:
        listed = {f for f, e in pairs if e == ep}
        missing = (openai_fields(ep) | set(VLLM_FIELDS[ep])) - listed
        assert not missing, f"{ep}: not in the table: {sorted(missing)}"
    assert {f for f, _ in pairs} <= set(SAMPLES), sorted({f for f, _ in pairs} - set(SAMPLES))


@pytest.fixture(scope="module")
def server(serval, models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-fields")
    hf_models.build("qwen3", folder, models)
    s = ServalServer(serval, folder, "--max-model-len", "512")
    yield s
    s.stop()


def request(endpoint, field, value):
    body = {"model": "test-model", "max_tokens": 3, "temperature": 0}
    body.update({"prompt": "Once upon"} if endpoint == "completions" else {"messages": [USER]})
    if isinstance(value, dict) and set(value) == set(ENDPOINTS):
        value = value[endpoint]
    if isinstance(value, tuple):
        value, extra = value
        body.update(extra)
    body[field] = value
    return body


def neutral_value(note):
    m = re.match(r"\(`(.+?)`\)", note)
    return json.loads(m.group(1)) if m else None


@pytest.mark.parametrize("field,endpoint,status,note", ROWS, ids=[f"{e}-{f}" for f, e, _, _ in ROWS])
def test_field_behaves_as_the_table_says(server, field, endpoint, status, note):
    status_code, _, body = server.post(ENDPOINTS[endpoint], request(endpoint, field, SAMPLES[field]))
    if status == "refused":
        assert status_code == 400, body
        assert body["error"]["param"] == field, body
        assert field in body["error"]["message"]
        # The value that asks for nothing (and null) is accepted.
        for ok in ([None] + ([neutral_value(note)] if neutral_value(note) is not None else [])):
            status_code, _, body = server.post(ENDPOINTS[endpoint], request(endpoint, field, ok))
            assert status_code == 200, (ok, body)
    else:
        assert status_code == 200, body
    log = server.read_log()
    assert f"unknown request field '{field}' in POST {ENDPOINTS[endpoint]}" not in log, \
        f"{field} is in the table but not known to the server"


def test_noop_fields_check_their_type(server):
    for endpoint, field in [("completions", "user"), ("chat", "metadata"), ("chat", "store")]:
        status, _, body = server.post(ENDPOINTS[endpoint], request(endpoint, field, 5))
        assert status == 400 and body["error"]["param"] == field, body


def test_unknown_fields_are_accepted_and_logged_once_per_name(server):
    name = "frobnicate_" + uuid.uuid4().hex[:8]
    for endpoint in ("completions", "completions", "chat"):
        status, _, body = server.post(ENDPOINTS[endpoint], request(endpoint, name, {"x": 1}))
        assert status == 200, body
    body = request("completions", "stream_options", {"include_usage": True, name: 1})
    body["stream"] = True
    assert server.post("/v1/completions", body)[0] == 200
    assert server.post("/v1/completions", body)[0] == 200
    log = server.read_log()
    assert log.count(f"unknown request field '{name}'") == 1, log[-2000:]
    assert log.count(f"unknown request field 'stream_options.{name}'") == 1, log[-2000:]
    assert "serval: warning: unknown request field" in log
    # A chat-only field sent to /v1/completions is unknown there.
    assert server.post("/v1/completions", request("completions", "documents", [{"title": "t"}]))[0] == 200
    assert server.read_log().count("unknown request field 'documents' in POST /v1/completions") == 1
