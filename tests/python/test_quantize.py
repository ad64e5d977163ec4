"""`serval quantize` read back by ggml's reference reader (the gguf package's
GGUFReader and dequantize, what llama.cpp's loader follows): stories260K in
q8_0 / q4_0 / q6_k decodes, tensor by tensor, close to the f32 source, the
172-wide FFN kept f16 with a warning that names it; its perplexity on TinyStories
text stays near the f32 model's (Serval's own perplexity command); bad
requests are refused with the reason."""
import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="gguf is installed by scripts/install-deps.sh")
from gguf.quants import dequantize  # noqa: E402

from conftest import run_serval  # noqa: E402

# Relative RMS error of a matrix decoded from each type (round to nearest on these weights).
RMS_BOUND = {"q8_0": 0.01, "q6_k": 0.03, "q4_0": 0.15}


def decoded(reader):
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = (t.tensor_type.name, dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64))
    return out


@pytest.fixture(scope="module")
def stories(models):
    return models / "stories260K" / "stories260K.gguf"


@pytest.mark.parametrize("to", ["q8_0", "q4_0", "q6_k"])
def test_quantized_file_decodes_close_to_the_source_in_ggml_reader(serval, stories, tmp_path, to):
    out = tmp_path / f"stories-{to}.gguf"
    proc = run_serval(serval, "quantize", stories, "--to", to, "--out", out)
    src, got = decoded(gguf.GGUFReader(stories)), decoded(gguf.GGUFReader(out))
    assert set(src) == set(got)
    for name, (src_type, w) in src.items():
        got_type, q = got[name]
        if w.ndim == 1:
            assert got_type == src_type and np.array_equal(q, w), name
            continue
        if w.shape[1] % 32:  # ffn_down reads the 172-wide FFN
            assert got_type == "F16", name
            assert f"warning: {name} stays f16, not {to}: 172 columns are not whole blocks" in proc.stderr
        elif to == "q6_k":  # 64 columns: not whole super-blocks of 256
            assert got_type == "Q8_0", name
        else:
            assert got_type == to.upper(), name
        rms = np.sqrt(np.mean((q - w) ** 2)) / np.sqrt(np.mean(w ** 2))
        assert rms < RMS_BOUND[to], (name, rms)
    reader = gguf.GGUFReader(out)
    file_type = int(reader.fields["general.file_type"].parts[-1][0])
    assert file_type == {"q8_0": 7, "q4_0": 2, "q6_k": 18}[to]


def perplexity(serval, model, text):
    proc = run_serval(serval, "perplexity", "--model", model, "--file", text, "--ctx", 128, "--chunks", 8, "--json")
    return json.loads(proc.stdout.strip().splitlines()[-1])["perplexity"]


def test_q8_0_keeps_the_perplexity_of_the_f32_model(serval, stories, models, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text((models.parent / "data" / "tinystories-valid-part1.txt").read_text(encoding="utf-8")[:20000])
    q8 = tmp_path / "q8.gguf"
    run_serval(serval, "quantize", stories, "--to", "q8_0", "--out", q8)
    base, quant = perplexity(serval, stories, text), perplexity(serval, q8, text)
    assert abs(quant / base - 1) < 0.005, (base, quant)


def test_bad_requests_are_refused_with_the_reason(serval, stories, tmp_path):
    proc = run_serval(serval, "quantize", stories, "--to", "f16", "--out", tmp_path / "a.gguf", check=False)
    assert proc.returncode != 0 and "--to f16 is not a GGUF block type" in proc.stderr
    proc = run_serval(serval, "quantize", stories, "--to", "q3_x", "--out", tmp_path / "b.gguf", check=False)
    assert proc.returncode != 0 and "q3_x" in proc.stderr
    q4 = tmp_path / "q4.gguf"
    run_serval(serval, "quantize", stories, "--to", "q4_0", "--out", q4)
    proc = run_serval(serval, "quantize", q4, "--to", "q8_0", "--out", tmp_path / "c.gguf", check=False)
    assert proc.returncode != 0 and "is already q4_0" in proc.stderr
