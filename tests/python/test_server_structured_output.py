"""Structured output through `serval serve` (issue 51, part 3): response_format json_schema
and json_object, vLLM's guided_json / guided_regex / guided_choice / guided_grammar and
structured_outputs, on stories260K, a tiny random Qwen3 (completions) and the real
SmolLM2-135M-Instruct (chat, all 56 requests at once so that the server batches them) over the
corpus of JSON schemas in tests/data/json_schemas: every output ends (finish_reason "stop": near
max_tokens only tokens that leave room to finish are drawn), parses and validates (jsonschema,
formats checked), streamed or not, sampled or greedy, with n > 1.
Malformed or unsupported constraints are a 400 naming the field."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import REPO
from serval_server import ServalServer, parse_sse

SCHEMAS = sorted((REPO / "tests" / "data" / "json_schemas").glob("*.json"))
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(serval, models):
    s = ServalServer(serval, models / "stories260K" / "stories260K.gguf")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hf_server(serval, models, tmp_path_factory):
    """A tiny random Qwen3 (151k-token byte-level BPE vocabulary, multi-byte tokens)."""
    import hf_models
    folder = tmp_path_factory.mktemp("qwen3-structured")
    hf_models.build("qwen3", folder, models)
    s = ServalServer(serval, folder, "--max-model-len", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smollm2_answers(serval, smollm2):
    """SmolLM2's chat answers to the whole corpus, the 56 requests sent at once (one batch)."""
    s = ServalServer(serval, smollm2, "--max-model-len", "1024", "--kv-cache-tokens", "16384", threads=2)

    def ask(path):
        schema = json.loads(path.read_text(encoding="utf-8"))
        what = path.stem.split("_", 1)[1].replace("_", " ")
        status, _, out = s.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": f"Give an example of {what} as JSON."}],
            "max_tokens": 300, "temperature": 0.7, "seed": len(path.stem),
            "response_format": {"type": "json_schema", "json_schema": {"name": path.stem, "schema": schema}}},
            timeout=600)
        return status, out

    try:
        with ThreadPoolExecutor(len(SCHEMAS)) as pool:
            answers = dict(zip(SCHEMAS, pool.map(ask, SCHEMAS)))
    finally:
        s.stop()
    return answers


def complete(server, **body):
    body.setdefault("prompt", PROMPT)
    status, _, out = server.post("/v1/completions", body)
    assert status == 200, out
    return out


def validator_of(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_json_schema_outputs_validate(server, path):
    schema = json.loads(path.read_text(encoding="utf-8"))
    v = validator_of(schema)
    out = complete(server, n=2, temperature=0.9, seed=len(path.stem), max_tokens=400,
                   response_format={"type": "json_schema", "json_schema": {"name": path.stem, "schema": schema}})
    for c in out["choices"]:
        assert c["finish_reason"] == "stop", c
        value = json.loads(c["text"])
        errors = [e.message for e in v.iter_errors(value)]
        assert not errors, f"{c['text']!r}: {errors}"


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_json_schema_outputs_validate_on_a_large_vocabulary(hf_server, path):
    schema = json.loads(path.read_text(encoding="utf-8"))
    out = complete(hf_server, temperature=1.0, seed=len(path.stem), max_tokens=300, guided_json=schema)
    c = out["choices"][0]
    assert c["finish_reason"] == "stop", c
    errors = [e.message for e in validator_of(schema).iter_errors(json.loads(c["text"]))]
    assert not errors, f"{c['text']!r}: {errors}"


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_json_schema_outputs_validate_on_smollm2(smollm2_answers, path):
    status, out = smollm2_answers[path]
    assert status == 200, out
    c = out["choices"][0]
    assert c["finish_reason"] == "stop", c
    schema = json.loads(path.read_text(encoding="utf-8"))
    errors = [e.message for e in validator_of(schema).iter_errors(json.loads(c["message"]["content"]))]
    assert not errors, f"{c['message']['content']!r}: {errors}"


@pytest.mark.parametrize("max_tokens", [16, 40])
def test_short_budgets_still_end_valid(server, max_tokens):
    """Near max_tokens only tokens that leave room to finish are drawn: the text ends valid."""
    for path in SCHEMAS[:20]:
        schema = json.loads(path.read_text(encoding="utf-8"))
        out = complete(server, n=2, temperature=1.0, seed=7, max_tokens=max_tokens, guided_json=schema)
        for c in out["choices"]:
            if c["finish_reason"] == "length":  # the shortest valid text is longer than the budget
                continue
            errors = [e.message for e in validator_of(schema).iter_errors(json.loads(c["text"]))]
            assert not errors, (path.stem, c["text"], errors)


def test_json_object_and_strict(server):
    out = complete(server, temperature=0, max_tokens=200, response_format={"type": "json_object"})
    c = out["choices"][0]
    assert c["finish_reason"] == "stop" and isinstance(json.loads(c["text"]), dict)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"]}
    out = complete(server, temperature=1.0, seed=4, n=3, max_tokens=100,
                   response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema,
                                                                           "strict": True}})
    for c in out["choices"]:
        assert c["finish_reason"] == "stop"
        assert set(json.loads(c["text"])) == {"a", "b"}  # strict: nothing beyond the listed properties


def test_vllm_guided_fields(server):
    out = complete(server, temperature=1.0, seed=2, n=3, max_tokens=30, guided_regex=r"[A-Z][a-z]{2,6} \d{2}")
    for c in out["choices"]:
        assert re.fullmatch(r"[A-Z][a-z]{2,6} \d{2}", c["text"]), c["text"]
    out = complete(server, temperature=1.0, seed=3, n=4, max_tokens=10, guided_choice=["cat", "dog", "little bird"])
    assert all(c["text"] in ("cat", "dog", "little bird") for c in out["choices"])
    out = complete(server, temperature=0, max_tokens=50, guided_json={"type": "array", "items": {"type": "boolean"},
                                                                      "minItems": 2, "maxItems": 3})
    value = json.loads(out["choices"][0]["text"])
    assert isinstance(value, list) and 2 <= len(value) <= 3 and all(isinstance(x, bool) for x in value)
    gbnf = 'root ::= "Lily " verb " the " noun\nverb ::= "saw" | "ate"\nnoun ::= "cat" | "cake"'
    out = complete(server, temperature=1.0, seed=5, n=2, max_tokens=20, guided_grammar=gbnf)
    for c in out["choices"]:
        assert re.fullmatch(r"Lily (saw|ate) the (cat|cake)", c["text"]), c["text"]
    out = complete(server, temperature=0.7, seed=6, max_tokens=20, structured_outputs={"choice": ["up", "down"]})
    assert out["choices"][0]["text"] in ("up", "down")


def test_streamed_output_follows_the_grammar(server):
    status, _, raw = server.post("/v1/completions", {"prompt": PROMPT, "stream": True, "max_tokens": 40,
                                                     "temperature": 1.0, "seed": 9,
                                                     "guided_regex": r"(ha){2,5}!"})
    assert status == 200
    text = "".join(c["choices"][0]["text"] for c in parse_sse(raw))
    assert re.fullmatch(r"(ha){2,5}!", text), text


@pytest.mark.parametrize("body,field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "not": {}}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"guided_regex": r"(a)\1"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= root \"a\""}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "structured_outputs.regex"),
])
def test_bad_constraints_are_refused(server, body, field):
    status, _, out = server.post("/v1/completions", {"prompt": PROMPT, **body})
    assert status == 400, out
    assert out["error"]["param"] == field, out
