"""`serval chat-template` against transformers' apply_chat_template (jinja2).

For every real template in $SERVAL_MODELS/tokenizers/*/tokenizer_config.json,
every template written for these tests (tests/python/chat_templates/*.jinja)
and any extra *.jinja under $SERVAL_MODELS/chat_templates/ or $SERVAL_CHAT_TEMPLATES, and a set of
conversations, Serval's rendering must equal transformers'
apply_chat_template(tokenize=False) byte for byte; where jinja2 raises, Serval
must fail too (with the template's own message for raise_exception).
"""
import json
import os
import pathlib

import pytest

from conftest import models_dir, run_serval

HERE = pathlib.Path(__file__).resolve().parent

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Answers in °C — or °F.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                              "parameters": {"type": "object", "properties": {}}}}

CONVERSATIONS = {
    "system_user": dict(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": "Hello! How are you?"}]),
    "user_only": dict(messages=[{"role": "user", "content": "Hi"}]),
    "multi_turn": dict(messages=[
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4\n"},
        {"role": "user", "content": "And 3+3?"}]),
    "ends_with_assistant": dict(messages=[
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi!"}]),
    "unicode_and_escapes": dict(messages=[
        {"role": "user", "content": "Ünïcödé 中文 🙂 \"quotes\" 'single' back\\slash\ttab\n\nnew lines  "}]),
    "text_parts": dict(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": "this."}]}]),
    "empty": dict(messages=[]),
    "tools": dict(
        messages=[
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call00001", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": {"location": "Paris", "unit": "celsius"}}}]},
            {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "It is 21 °C in Paris."},
            {"role": "user", "content": "Thanks"}],
        tools=[WEATHER_TOOL, TIME_TOOL]),
    "parallel_tool_calls": dict(
        messages=[
            {"role": "user", "content": "Weather and time?"},
            {"role": "assistant", "content": "Let me check.",
             "tool_calls": [
                 {"id": "call00002", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}},
                 {"id": "call00003", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "call00002", "content": "rainy"},
            {"role": "tool", "tool_call_id": "call00003", "content": "12:00"}],
        tools=[WEATHER_TOOL, TIME_TOOL]),
    "thinking": dict(messages=[
        {"role": "user", "content": "Riddle?"},
        {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nThe answer is 7."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "It follows from the rules."},
        {"role": "user", "content": "<tool_response>x</tool_response>"}]),
    "thinking_disabled": dict(messages=[{"role": "user", "content": "Quick answer"}],
                              extra={"enable_thinking": False}),
    "thinking_enabled": dict(messages=[{"role": "user", "content": "Think"}], extra={"enable_thinking": True}),
    "alternation_error": dict(messages=[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]),
    "bad_tool_call_id": dict(
        messages=[{"role": "user", "content": "go"},
                  {"role": "assistant", "tool_calls": [{"id": "short", "type": "function",
                                                        "function": {"name": "get_time", "arguments": {}}}]}],
        tools=[TIME_TOOL]),
    "date_and_builtin_tools": dict(
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "search it"}],
        extra={"date_string": "26 Jul 2024", "builtin_tools": ["brave_search", "code_interpreter"],
               "tools_in_user_message": False}),
}


def real_templates():
    out = []
    for cfg in sorted((models_dir() / "tokenizers").glob("*/tokenizer_config.json")):
        if "chat_template" in json.loads(cfg.read_text()):
            out.append(pytest.param(cfg.parent, None, id=cfg.parent.name))
    return out


def written_templates():
    """Templates written for these tests, plus *.jinja files from $SERVAL_MODELS/chat_templates and from the
    folders in $SERVAL_CHAT_TEMPLATES (os.pathsep-separated): a place for real model templates kept outside the
    repository."""
    folders = [HERE / "chat_templates", models_dir() / "chat_templates"]
    folders += [pathlib.Path(p) for p in os.environ.get("SERVAL_CHAT_TEMPLATES", "").split(os.pathsep) if p]
    files = [f for folder in folders for f in sorted(folder.glob("*.jinja"))]
    return [pytest.param(models_dir() / "tokenizers" / "llama3", f, id=f.stem) for f in files]


_TOKENIZERS = {}


def hf_tokenizer(folder):
    if folder not in _TOKENIZERS:
        transformers = pytest.importorskip("transformers")
        _TOKENIZERS[folder] = transformers.AutoTokenizer.from_pretrained(str(folder))
    return _TOKENIZERS[folder]


def reference(folder, template, conv, add_generation_prompt):
    """(text, None) or (None, exception) from transformers' apply_chat_template."""
    import jinja2
    tok = hf_tokenizer(folder)
    try:
        text = tok.apply_chat_template(
            conv["messages"], tools=conv.get("tools"), add_generation_prompt=add_generation_prompt, tokenize=False,
            chat_template=template.read_text() if template else None, **conv.get("extra", {}))
        return text, None
    except (jinja2.TemplateError, TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
        return None, e


CASES = [(name, gen) for name in CONVERSATIONS for gen in (True, False)]
_RESULTS = {}


def serval_results(serval, folder, template, tmp_path_factory):
    """Serval's result for every case, from one `serval chat-template --input` run per template."""
    key = (folder, template)
    if key not in _RESULTS:
        lines = tmp_path_factory.mktemp("chat") / "cases.jsonl"
        with open(lines, "w", encoding="utf-8") as f:
            for name, gen in CASES:
                conv = CONVERSATIONS[name]
                f.write(json.dumps({"messages": conv["messages"], "tools": conv.get("tools"),
                                    "add_generation_prompt": gen, "vars": conv.get("extra", {})},
                                   ensure_ascii=False) + "\n")
        args = ["chat-template", "--model", folder, "--input", lines]
        if template:
            args += ["--template", template]
        out = run_serval(serval, *args).stdout.splitlines()
        assert len(out) == len(CASES)
        _RESULTS[key] = {case: json.loads(line) for case, line in zip(CASES, out)}
    return _RESULTS[key]


@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
@pytest.mark.parametrize("conv_name", list(CONVERSATIONS))
@pytest.mark.parametrize("folder,template", real_templates() + written_templates())
def test_matches_transformers(serval, models, folder, template, conv_name, add_generation_prompt, tmp_path_factory):
    import jinja2
    conv = CONVERSATIONS[conv_name]
    expected, error = reference(folder, template, conv, add_generation_prompt)
    got = serval_results(serval, folder, template, tmp_path_factory)[(conv_name, add_generation_prompt)]
    if error is None:
        assert "error" not in got, f"serval failed where jinja2 rendered: {got['error']}"
        assert got["text"] == expected
    else:
        assert "error" in got, f"jinja2 raised {error!r} but serval printed:\n{got['text']}"
        if type(error) is jinja2.TemplateError:  # raise_exception(): the message passes through
            assert got["raised"] and got["error"] == str(error)
        else:
            assert not got["raised"]


def test_cli_prints_rendering_exactly(serval, models, tmp_path):
    """The one-conversation form: messages on stdin, --tools, --var; stdout is the text, nothing added."""
    conv = CONVERSATIONS["tools"]
    folder = models / "tokenizers" / "qwen3"
    expected, error = reference(folder, None, dict(conv, extra={"enable_thinking": False}), True)
    assert error is None
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(conv["tools"], ensure_ascii=False), encoding="utf-8")
    proc = run_serval(serval, "chat-template", "--model", folder, "--tools", tools, "--add-generation-prompt",
                      "--var", "enable_thinking=false", input=json.dumps(conv["messages"], ensure_ascii=False))
    assert proc.stdout == expected


def test_cli_raise_exception_message(serval, models, tmp_path):
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(CONVERSATIONS["alternation_error"]["messages"]))
    proc = run_serval(serval, "chat-template", "--model", models / "tokenizers" / "llama3", "--template",
                      HERE / "chat_templates" / "mistral_style.jinja", "--messages", messages, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip() == ("error: After the optional system message, conversation roles must alternate "
                                   "user/assistant/user/assistant/...")


def test_syntax_error_names_line_and_column(serval, models, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n  {{ m.content + }}\n{% endfor %}")
    proc = run_serval(serval, "chat-template", "--template", bad, check=False, input="[]")
    assert proc.returncode != 0
    assert "syntax error at line 2, column" in proc.stderr


def test_unclosed_block_is_an_error(serval, models, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if messages %}never closed")
    proc = run_serval(serval, "chat-template", "--template", bad, check=False, input="[]")
    assert proc.returncode != 0
    assert "endif" in proc.stderr


def test_model_without_template(serval, models):
    proc = run_serval(serval, "chat-template", "--model", models / "stories260K" / "stories260K.gguf", check=False,
                      input="[]")
    assert proc.returncode != 0
    assert "no chat template" in proc.stderr
