"""Structured output end to end: `serval grammar-sample` walks randomly through
grammars over Llama 3's vocabulary (no model: any allowed token may come, so
the grammar alone must keep the text valid). Every complete output must parse
and validate: JSON Schema outputs with Python's json and jsonschema (formats
checked), regex outputs with re.fullmatch, choices by membership."""
import json
import pathlib
import re

import jsonschema
import pytest

from conftest import REPO, run_serval

SCHEMAS = sorted((REPO / "tests" / "data" / "json_schemas").glob("*.json"))
WALKS = 6


def tokenizer(models):
    return models / "tokenizers" / "llama3" / "tokenizer.json"


def sample(serval, models, *args, count=WALKS, seed=1, max_tokens=160):
    proc = run_serval(serval, "grammar-sample", "--tokenizer", tokenizer(models), *args,
                      "--count", count, "--seed", seed, "--max-tokens", max_tokens, timeout=120)
    outs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(outs) == count, proc.stdout
    return outs


def test_corpus_is_large_enough():
    assert len(SCHEMAS) >= 50


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_json_schema_outputs_validate(serval, models, path):
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    outs = sample(serval, models, "--json-schema", path, seed=len(path.stem))
    complete = [o["text"] for o in outs if o["complete"]]
    assert len(complete) >= WALKS // 2, f"too few complete outputs: {outs}"
    for text in complete:
        value = json.loads(text)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, f"{text!r}: {errors}"


REGEXES = [
    r"^\d{3}-\d{4}$",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"(ab|cd)*e?",
    r"\w{2,5}\s[^\s]{1,3}",
    r"(?:0|[1-9][0-9]*)(\.[0-9]{1,2})?",
    r"[A-F0-9]{8}(-[A-F0-9]{4}){3}",
    r"(yes|no|maybe)",
    r"[\u00e0-\u00ff]{1,4}x",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_fullmatch(serval, models, pattern):
    outs = sample(serval, models, "--regex", pattern, count=8)
    complete = [o["text"] for o in outs if o["complete"]]
    assert complete
    for text in complete:
        assert re.fullmatch(pattern, text), f"{text!r} does not match {pattern!r}"


def test_choice_outputs_one_of_the_choices(serval, models):
    choices = ["positive", "negative", "neutral", "mixed feelings"]
    outs = sample(serval, models, "--choice", ",".join(choices), count=12)
    assert all(o["complete"] and o["text"] in choices for o in outs), outs
    assert len({o["text"] for o in outs}) > 1


def test_json_object_outputs_are_objects(serval, models):
    for o in sample(serval, models, "--json-object", count=8):
        if o["complete"]:
            assert isinstance(json.loads(o["text"]), dict)


def test_whitespace_is_bounded(serval, models):
    path = REPO / "tests" / "data" / "json_schemas" / "33_recursive_tree.json"
    outs = sample(serval, models, "--json-schema", path, "--max-whitespace", 2, "--newlines", count=8)
    for o in outs:
        assert not re.search(r"[ \t\n]{3}", o["text"]), o
        if o["complete"]:
            json.loads(o["text"])
    compact = sample(serval, models, "--json-schema", path, "--max-whitespace", 0, count=4)
    assert all(not re.search(r"\s", o["text"]) for o in compact), compact


def test_gbnf_grammar(serval, models, tmp_path):
    g = tmp_path / "sum.gbnf"
    g.write_text('root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]{0,3}\n')
    for o in sample(serval, models, "--grammar", g, count=8):
        if o["complete"]:
            assert re.fullmatch(r"\([1-9][0-9]{0,3}( \+ [1-9][0-9]{0,3})*\)", o["text"]), o


def test_unsupported_schema_is_refused_naming_keyword_and_path(serval, models, tmp_path):
    s = tmp_path / "bad.json"
    s.write_text(json.dumps({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}))
    proc = run_serval(serval, "grammar-sample", "--tokenizer", tokenizer(models), "--json-schema", s, check=False)
    assert proc.returncode != 0
    assert "uniqueItems" in proc.stderr and "#/properties/tags" in proc.stderr, proc.stderr
