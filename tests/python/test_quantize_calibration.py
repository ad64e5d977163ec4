"""`serval quantize --calibration TEXT` (activation-aware scaling, model/awq.h)
on stories260K: the file loads and generates, every layer's four groups log
their alpha, the folded norms differ from the float model's while the
quantized model's perplexity stays near the float one; a missing, empty,
binary or non-UTF-8 calibration file, a text too short, and --calibration with
a GGUF block type are refused naming the problem."""
import json
import math

import pytest

from conftest import run_serval

gguf = pytest.importorskip("gguf", reason="gguf is installed by scripts/install-deps.sh")


@pytest.fixture(scope="module")
def stories(models):
    return models / "stories260K" / "stories260K.gguf"


@pytest.fixture(scope="module")
def texts(models):
    return (models.parent / "data" / "tinystories-valid-part1.txt").read_text(encoding="utf-8")


def perplexity(serval, model, text):
    proc = run_serval(serval, "perplexity", "--model", model, "--file", text, "--ctx", 128, "--chunks", 4, "--json")
    return json.loads(proc.stdout.strip().splitlines()[-1])["perplexity"]


def test_calibrated_int4_loads_generates_and_logs_each_layers_alpha(serval, stories, texts, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text(texts[-6000:].split("\n", 1)[1], encoding="utf-8")  # not the evaluated text below
    held_out = tmp_path / "eval.txt"
    held_out.write_text(texts[:6000], encoding="utf-8")
    out = tmp_path / "cal.gguf"
    proc = run_serval(serval, "quantize", stories, "--to", "int4", "--group-size", "32", "--calibration", calib,
                      "--calibration-tokens", 512, "--ctx", 128, "--out", out)
    for layer in range(5):
        for group in ("q/k/v", "o", "gate/up", "down"):
            assert f"calibration: blk.{layer} {group} " in proc.stderr and " alpha " in proc.stderr, (layer, group)
    src = {t.name: t for t in gguf.GGUFReader(stories).tensors}
    got = {t.name: t for t in gguf.GGUFReader(out).tensors}
    changed = [n for n in src if n.endswith("_norm.weight") and n.startswith("blk.")
               and (got[n].data != src[n].data).any()]
    assert changed, "no norm took a calibrated scale"
    gen = run_serval(serval, "generate", "-m", out, "-p", "Once upon a time", "-n", 24, "-t", 0)
    assert len(gen.stdout.strip()) > len("Once upon a time")
    base = perplexity(serval, stories, held_out)
    ppl = perplexity(serval, out, held_out)
    assert math.isfinite(ppl) and base <= ppl * 1.02 and ppl < 1.15 * base, (ppl, base)


def test_bad_calibration_texts_are_refused(serval, stories, texts, tmp_path):
    def refused(*args):
        proc = run_serval(serval, "quantize", stories, *args, "--out", tmp_path / "x.gguf", check=False)
        assert proc.returncode != 0, args
        return proc.stderr
    missing = tmp_path / "missing.txt"
    assert f'--calibration: cannot open "{missing}"' in refused("--to", "int4", "--calibration", missing)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert f'--calibration: "{empty}" is empty' in refused("--to", "int8", "--calibration", empty)
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    assert f'--calibration: "{binary}" is not text (a NUL byte at offset 5)' in refused(
        "--to", "fp8", "--calibration", binary)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Once upon a time, a caf\u00e9.".encode("latin-1"))
    assert f'--calibration: "{latin1}" is not UTF-8 text (byte 23)' in refused("--to", "int4", "--calibration", latin1)
    short = tmp_path / "short.txt"
    short.write_text("Once upon", encoding="utf-8")
    assert "calibration needs at least 16" in refused("--to", "int4", "--calibration", short)
    ok = tmp_path / "ok.txt"
    ok.write_text(texts[:2000], encoding="utf-8")
    assert "--calibration is for --to int8, int4 and fp8, not --to q4_0" in refused(
        "--to", "q4_0", "--calibration", ok)
