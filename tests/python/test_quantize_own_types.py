"""`serval quantize --to int8|int4|fp8` (Serval's own GGUF types,
docs/QUANTIZED_CHECKPOINTS.md) against an independent numpy round-to-nearest
quantization of the float weights read with the gguf package (torch encodes
e4m3): the file's codes, scales and zero points equal numpy's; Serval running
the quantized file gives the perplexity of the f32 file whose matrices numpy
dequantized (the load and dequantize_linear equal numpy's dequantization);
re-quantizing the dequantized weights gives back the same codes; the 172-wide
FFN falls back to int8 with a warning; bad requests are refused."""
import json
import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="gguf is installed by scripts/install-deps.sh")
torch = pytest.importorskip("torch")

from conftest import run_serval  # noqa: E402

F = np.float32


def tensors(path, mode="r"):
    reader = gguf.GGUFReader(path, mode)
    return reader, {t.name: t for t in reader.tensors}


def as_matrix(t):
    return np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)])


def rtn(fmt, w, group=128, symmetric=False):
    """(codes as stored, scales, zeros or None, dequantized) of the float32 matrix w."""
    w = w.astype(F)
    if fmt in ("int8", "fp8"):
        amax = np.abs(w).max(axis=1)
        s = np.where(amax > 0, amax / F(127 if fmt == "int8" else 448), F(1)).astype(F)
        if fmt == "int8":
            q = np.clip(np.rint(w / s[:, None]), -127, 127)
            return q.astype(np.int8), s, None, (q * s[:, None]).astype(F)
        e4m3 = torch.from_numpy(w / s[:, None]).to(torch.float8_e4m3fn)
        deq = e4m3.to(torch.float32).numpy() * s[:, None]
        return e4m3.view(torch.uint8).numpy().view(np.int8), s, None, deq.astype(F)
    out, n = w.shape
    g = w.reshape(out, n // group, group)
    if symmetric:
        amax = np.abs(g).max(axis=2)
        s = np.where(amax > 0, amax / F(7), F(1)).astype(F)
        z = np.full_like(s, 8)
        q = np.clip(np.rint(g / s[..., None]), -8, 7) + 8
    else:
        lo, hi = g.min(axis=2), g.max(axis=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            sa = ((hi - lo) / F(15)).astype(F)  # (a) min..max, the zero as it falls
            za = (-lo / sa).astype(F)
            l0, h0 = np.minimum(lo, F(0)), np.maximum(hi, F(0))  # (b) 0 exact, an integer zero
            sb = ((h0 - l0) / F(15)).astype(F)
            zb = np.rint(-l0 / sb).astype(F)
            sb = np.where(zb > 0, np.maximum(sb, -l0 / zb), sb).astype(F)
            sb = np.where(zb < 15, np.maximum(sb, h0 / (F(15) - zb)), sb).astype(F)

            def err(s, z):
                q = np.clip(np.rint(g / s[..., None] + z[..., None]), 0, 15)
                return (((q - z[..., None]).astype(np.float64) * s[..., None] - g) ** 2).sum(axis=2)
            use_a = err(sa, za) < err(sb, zb)
        one = np.where(lo != 0, np.abs(lo) / F(8), F(1)).astype(F)  # a group of one value: code 8
        s = np.where(hi > lo, np.where(use_a, sa, sb), one).astype(F)
        z = np.where(hi > lo, np.where(use_a, za, zb),
                     np.where(lo > 0, F(0), np.where(lo < 0, F(16), F(8)))).astype(F)
        q = np.clip(np.rint(g / s[..., None] + z[..., None]), 0, 15)
    deq = ((q - z[..., None]) * s[..., None]).reshape(out, n).astype(F)
    q = q.reshape(out, n).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed, s, None if symmetric else z, deq


def perplexity(serval, model, text):
    proc = run_serval(serval, "perplexity", "--model", model, "--file", text, "--ctx", 64, "--chunks", 4, "--json")
    return json.loads(proc.stdout.strip().splitlines()[-1])["perplexity"]


@pytest.fixture(scope="module")
def stories(models):
    return models / "stories260K" / "stories260K.gguf"


CASES = [("int8", []), ("fp8", []), ("int4", ["--group-size", "32"]),
         ("int4", ["--group-size", "64", "--symmetric"])]


@pytest.mark.parametrize("to,flags", CASES)
def test_codes_equal_numpy_and_the_model_runs_the_numpy_dequantization(serval, stories, models, tmp_path, to, flags):
    out = tmp_path / "q.gguf"
    proc = run_serval(serval, "quantize", stories, "--to", to, *flags, "--out", out)
    group = int(flags[1]) if flags else 0
    symmetric = "--symmetric" in flags
    _, src = tensors(stories)
    reader, got = tensors(out)
    deq_file = tmp_path / "deq.gguf"  # the f32 source with numpy's dequantized matrices written in
    shutil.copy(stories, deq_file)
    _, deq_tensors = tensors(deq_file, "r+")
    for name, t in src.items():
        if len(t.shape) != 2 or name == "token_embd.weight":
            assert np.array_equal(np.asarray(got[name].data), np.asarray(t.data)), name
            continue
        w = as_matrix(t)
        fmt = to
        if to == "int4" and w.shape[1] % group:
            fmt = "int8"  # the 172-wide ffn_down
            assert (f"warning: {name} is int8 per channel, not int4 g{group} "
                    f"{'sym' if symmetric else 'asym'}: 172 columns are not whole groups of {group}") in proc.stderr
        key = f"serval.quantization.format.{name}"
        assert bytes(reader.fields[key].parts[-1]).decode() == fmt
        codes, s, z, deq = rtn(fmt, w, group, symmetric)
        assert got[name].tensor_type == gguf.GGMLQuantizationType.I8
        assert np.array_equal(as_matrix(got[name]).view(np.int8), codes), name
        assert np.array_equal(np.asarray(got[name + ".scale"].data).reshape(s.shape), s), name
        assert (name + ".zero" in got) == (z is not None), name
        if z is not None:
            assert np.array_equal(np.asarray(got[name + ".zero"].data).reshape(z.shape), z), name
        deq_tensors[name].data[...] = deq.reshape(deq_tensors[name].data.shape)
        if fmt != "int4" or symmetric:  # round trip: the dequantized matrix quantizes to the same codes
            assert np.array_equal(rtn(fmt, deq, group, symmetric)[0], codes), name
    del deq_tensors
    text = tmp_path / "text.txt"
    text.write_text((models.parent / "data" / "tinystories-valid-part1.txt").read_text(encoding="utf-8")[:8000])
    quant, reference = perplexity(serval, out, text), perplexity(serval, deq_file, text)
    assert abs(quant / reference - 1) < 1e-5, (quant, reference)
    info = run_serval(serval, "info", "-m", out).stdout
    assert "matrices       attention " in info and ("int8 per channel" in info or "int4" in info or "fp8" in info)


def test_bad_requests_are_refused_with_the_reason(serval, stories, tmp_path):
    def refused(*args):
        proc = run_serval(serval, "quantize", stories, *args, "--out", tmp_path / "x.gguf", check=False)
        assert proc.returncode != 0, args
        return proc.stderr
    assert "int4 group size 48 divides none of the matrices' widths (64, 172)" in refused(
        "--to", "int4", "--group-size", "48")
    assert "--group-size 7 must be even" in refused("--to", "int4", "--group-size", "7")
    assert "--group-size, --symmetric and --asymmetric are for --to int4, not --to int8" in refused(
        "--to", "int8", "--group-size", "32")
    assert '--to "int3" is not a type quantize writes (int8, int4, fp8' in refused("--to", "int3")
    int8 = tmp_path / "int8.gguf"
    run_serval(serval, "quantize", stories, "--to", "int8", "--out", int8)
    proc = run_serval(serval, "quantize", int8, "--to", "fp8", "--out", tmp_path / "y.gguf", check=False)
    assert proc.returncode != 0 and "is already quantized" in proc.stderr
