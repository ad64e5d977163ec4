"""GGUF block types Q4_1, Q5_0, Q5_1 and the K-quants Q2_K..Q6_K against the gguf
package's reference code (gguf.quants, a numpy port of ggml's reference
(de)quantizers):

- reading: a tiny random model whose matrices are blocks of a type (random bits
  under random f16 scales for the K-quants, which gguf cannot quantize; gguf's
  quantize for the others), or a Q4_K_M-like mix of Q4_K and Q6_K, scores a text
  with the same log-probabilities, bit for bit, as the same model with those
  matrices dequantized to f32 by gguf. The CPU backend computes in f32 from the
  decoded weights, so one element decoded differently shows.
- writing: `serval random-model --dtype q4_1|q5_0|q5_1` stores the very bytes that
  gguf's quantize makes of the same floats (the f32 model of the same seed); the
  K-quants that Serval writes decode, through gguf, close to those floats."""
import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="gguf is installed by scripts/install-deps.sh")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from conftest import run_serval  # noqa: E402

# A Llama whose every matrix has rows of whole 256-element super-blocks.
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 320, "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False}
SEED = 3

# Byte offsets of each K-quant's f16 super-block scales, and the size of the
# largest |sc * q| (times the largest min, where there is one): scales drawn
# around target / that keep the random weights near +-0.1.
K_SCALES = {Q.Q2_K: ([80, 82], 15 * 3), Q.Q3_K: ([108], 32 * 4), Q.Q4_K: ([0, 2], 63 * 15),
            Q.Q5_K: ([0, 2], 63 * 31), Q.Q6_K: ([208], 128 * 32)}


@pytest.fixture(scope="module")
def base(tmp_path_factory, serval):
    folder = tmp_path_factory.mktemp("gguf-quants")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    run_serval(serval, "random-model", "--like", folder / "config.json", "--dtype", "f32", "--seed", SEED,
               "--out", folder / "base.gguf")
    text = folder / "text.txt"
    text.write_text(" ".join(f"word{i % 37} and more{i % 11}." for i in range(120)))
    return folder, gguf.GGUFReader(folder / "base.gguf"), text


def random_blocks(qtype, rows, cols, rng):
    """Random bits, with the f16 scale fields set to finite values of both signs."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    offsets, span = K_SCALES[qtype]
    for off in offsets:
        scale = (rng.standard_normal(len(blocks)) * 0.1 / span).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def mixed_type(name):
    """llama.cpp's Q4_K_M: attn_v, ffn_down and the output in Q6_K, the rest Q4_K."""
    return Q.Q6_K if name == "output.weight" or any(k in name for k in ("attn_v.", "ffn_down.")) else Q.Q4_K


def write_pair(reader, folder, label, type_of, rng):
    """Writes folder/LABEL.gguf with each matrix in type_of(name) and
    folder/LABEL-f32.gguf with those matrices as gguf dequantizes them."""
    paths = folder / f"{label}.gguf", folder / f"{label}-f32.gguf"
    writers = [gguf.GGUFWriter(p, "llama") for p in paths]
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.alignment":
            for w in writers:
                w.add_custom_alignment(field.contents())
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        for w in writers:
            w.add_key_value(field.name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        data = np.array(t.data, dtype=np.float32)
        if data.ndim == 2:
            qtype = type_of(t.name)
            blocks = random_blocks(qtype, *data.shape, rng) if qtype in K_SCALES else quantize(data, qtype)
            writers[0].add_tensor(t.name, blocks, raw_dtype=qtype)
            writers[1].add_tensor(t.name, dequantize(blocks, qtype).reshape(data.shape))
        else:
            for w in writers:
                w.add_tensor(t.name, data)
    for w in writers:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return paths


def log_probs(serval, model, text, out):
    """Every scored token's log-probabilities over the vocabulary (f32), on the CPU."""
    run_serval(serval, "perplexity", "--model", model, "--file", text, "--ctx", 64, "--chunks", 2,
               "--device", "cpu", "--kl-divergence-base", out)
    return out.read_bytes()


CASES = {"q4_1": lambda n: Q.Q4_1, "q5_0": lambda n: Q.Q5_0, "q5_1": lambda n: Q.Q5_1,
         "q2_k": lambda n: Q.Q2_K, "q3_k": lambda n: Q.Q3_K, "q4_k": lambda n: Q.Q4_K,
         "q5_k": lambda n: Q.Q5_K, "q6_k": lambda n: Q.Q6_K, "q4_k_m": mixed_type}


@pytest.mark.parametrize("label", list(CASES))
def test_blocks_decode_as_gguf_reference(serval, base, label):
    folder, reader, text = base
    rng = np.random.default_rng(sorted(CASES).index(label))
    quantized, dequantized = write_pair(reader, folder, label, CASES[label], rng)
    got = log_probs(serval, quantized, text, folder / f"{label}.kld")
    want = log_probs(serval, dequantized, text, folder / f"{label}-f32.kld")
    assert len(got) > 4 * CONFIG["vocab_size"] * 32  # two chunks' scored tokens
    assert got == want, f"{label}: the model's log-probabilities differ from those of gguf's dequantized weights"


def matrices(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors if len(t.shape) == 2}


@pytest.mark.parametrize("dtype", ["q4_1", "q5_0", "q5_1", "q4_0", "q8_0"])
def test_quantize_matches_gguf_reference_bytes(serval, base, dtype):
    folder, reader, _ = base
    out = folder / f"random-{dtype}.gguf"
    run_serval(serval, "random-model", "--like", folder / "config.json", "--dtype", dtype, "--seed", SEED,
               "--out", out)
    ours, floats = matrices(out), matrices(folder / "base.gguf")
    assert ours.keys() == floats.keys() and len(ours) >= 10
    for name, t in ours.items():
        assert t.tensor_type == Q[dtype.upper()], name
        want = quantize(np.array(floats[name].data, dtype=np.float32), Q[dtype.upper()])
        assert np.array_equal(np.array(t.data).reshape(want.shape), want), f"{dtype} {name}: bytes differ from gguf's"


# Relative RMS error bounds (tests/core/k_quants_test.cpp measures the same rounding).
K_BOUNDS = {"q2_k": 0.42, "q3_k": 0.19, "q4_k": 0.095, "q5_k": 0.047, "q6_k": 0.024}


@pytest.mark.parametrize("dtype", list(K_BOUNDS))
def test_k_quants_written_decode_close_through_gguf(serval, base, dtype):
    folder, _, _ = base
    out = folder / f"random-{dtype}.gguf"
    run_serval(serval, "random-model", "--like", folder / "config.json", "--dtype", dtype, "--seed", SEED,
               "--out", out)
    ours, floats = matrices(out), matrices(folder / "base.gguf")
    for name, t in ours.items():
        assert t.tensor_type == Q[dtype.upper()], name
        x = np.array(floats[name].data, dtype=np.float32)
        y = dequantize(np.array(t.data), Q[dtype.upper()]).reshape(x.shape)
        rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)))
        assert rel < K_BOUNDS[dtype], f"{dtype} {name}: relative RMS error {rel:.4f}"
