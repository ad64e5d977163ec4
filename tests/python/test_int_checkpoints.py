"""INT8 / INT4 checkpoints (compressed-tensors int-quantized and pack-quantized,
AutoAWQ GEMM, GPTQ v1 and v2 with and without desc_act) load, and their logits on
the CPU match a float32 Llama running the dequantized weights ((q - zero) * scale,
computed by tests/python/int_checkpoints.py from the values before packing) within
1e-3 relative, with the same greedy tokens. Unsupported variants and broken tensors
are refused naming the field or tensor."""
import json
import struct

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
transformers = pytest.importorskip("transformers")
np = pytest.importorskip("numpy")

import int_checkpoints as ic  # noqa: E402
from conftest import run_serval  # noqa: E402
from test_fp8_checkpoints import (PROMPT, _copy, _edit_config, _load_error, _read_st,  # noqa: E402
                                  _write_st, reference, rel_err)

W8A8 = ic._ct_args(8, "channel")
TOKEN_ACTS = ic._ct_args(8, "token", dynamic=True, observer=None)

CASES = {
    # llm-compressor's W8A8 (INT8): per-channel int8 weights, dynamic per-token int8 activations.
    "ct-w8a8-channel": ("ct-int8", ic.ct_config("int-quantized", W8A8, TOKEN_ACTS), {}),
    # Per-tensor int8 scales (f32), static activations; two shards.
    "ct-w8a8-tensor": ("ct-int8", ic.ct_config("int-quantized", ic._ct_args(8, "tensor"),
                                                ic._ct_args(8, "tensor", observer="minmax")),
                       dict(strategy="tensor", scale_dtype=torch.float32, shards=2)),
    # W4A16: symmetric int4, groups of 128.
    "ct-w4a16-g128": ("ct-pack", ic.ct_config("pack-quantized", ic._ct_args(4, "group", group_size=128)),
                      dict(group_size=128)),
    # W4A16_ASYM: zero points packed down the rows, groups of 32; two shards.
    "ct-w4a16-asym-g32": ("ct-pack", ic.ct_config("pack-quantized",
                                                  ic._ct_args(4, "group", symmetric=False, group_size=32)),
                          dict(group_size=32, sym=False, shards=2)),
    # actorder "group": a weight_g_idx reorders the groups (loaded dense).
    "ct-w4a16-actorder-g64": ("ct-pack", ic.ct_config("pack-quantized",
                                                      ic._ct_args(4, "group", group_size=64, actorder="group")),
                              dict(group_size=64, actorder=True)),
    # AutoAWQ GEMM, groups of 64.
    "awq-g64": ("awq", ic.awq_config(64), dict(group_size=64)),
    # AutoGPTQ v1 (zero points minus one), symmetric, groups of 128, desc_act false.
    "gptq-v1-g128": ("gptq", ic.gptq_config(4, 128, True, False, False), dict(group_size=128)),
    # GPTQModel v2, asymmetric, groups of 32.
    "gptq-v2-asym-g32": ("gptq", ic.gptq_config(4, 32, False, False, True), dict(group_size=32, sym=False, v2=True)),
    # desc_act: groups in a random column order (g_idx; loaded dense), asymmetric v1.
    "gptq-v1-desc-act-g64": ("gptq", ic.gptq_config(4, 64, False, True, False),
                             dict(group_size=64, sym=False, desc_act=True)),
    # 8 bits per channel, symmetric: int8 per channel.
    "gptq-8bit-channel": ("gptq", ic.gptq_config(8, -1, True, False, False), dict(bits=8, group_size=-1)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def int_model(request, tmp_path_factory, models):
    kind, qc, opts = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    ref = ic.build(folder, models, kind, qc, **opts)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return request.param, folder, ref, tok


def test_int_checkpoint_matches_dequantized_reference(serval, int_model):
    name, folder, ref, tok = int_model
    proc = run_serval(serval, "generate", "--model", folder, "--prompt", PROMPT, "--temperature", "0",
                      "--max-tokens", 8, "--ignore-eos", "--json", "--dump-logits", "--device", "cpu")
    assert "checkpoint quantization (" in proc.stderr
    result = json.loads(proc.stdout)
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert result["prompt_token_ids"] == ids
    want, tokens, gap = reference(ref, ids)
    got = np.asarray(result["prompt_logits"], dtype=np.float64)
    err = rel_err(got, want)
    assert err < 1e-3, f"{name}: logits {err:.2e} from the dequantized reference"
    assert gap > 1e-3, "the reference has a near-tie; pick another seed"
    assert result["token_ids"] == tokens


# --- refusals -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory, models):
    out = {}
    for name in ("ct-w4a16-asym-g32", "awq-g64", "gptq-v1-g128"):
        kind, qc, opts = CASES[name]
        out[name] = tmp_path_factory.mktemp(name + "-base")
        ic.build(out[name], models, kind, qc, **{**opts, "shards": 1})
    return out


def _weights(q):
    return q["config_groups"]["group_0"]["weights"]


CONFIG_REFUSALS = {
    "unknown quant_method": ("gptq-v1-g128", lambda q: q.update(quant_method="bitsandbytes"),
                             ['quantization_config.quant_method = "bitsandbytes"', "not supported"]),
    "gptq bits 3": ("gptq-v1-g128", lambda q: q.update(bits=3), ["quantization_config.bits = 3"]),
    "gptq 8 bits grouped": ("gptq-v1-g128", lambda q: q.update(bits=8), ["quantization_config.bits = 8",
                                                                         "group_size = -1"]),
    "gptq marlin": ("gptq-v1-g128", lambda q: q.update(checkpoint_format="marlin"),
                    ['quantization_config.checkpoint_format = "marlin"']),
    "gptq group size": ("gptq-v1-g128", lambda q: q.update(group_size=96),
                        ["group_size 96 does not divide its 256 inputs"]),
    "awq gemv": ("awq-g64", lambda q: q.update(version="gemv"), ['quantization_config.version = "gemv"']),
    "awq exllama": ("awq-g64", lambda q: q.update(version="exllama"), ['quantization_config.version = "exllama"']),
    "awq marlin": ("awq-g64", lambda q: q.update(version="marlin"), ['quantization_config.version = "marlin"']),
    "awq bits 3": ("awq-g64", lambda q: q.update(bits=3), ["quantization_config.bits = 3"]),
    "awq no zero point": ("awq-g64", lambda q: q.update(zero_point=False), ["quantization_config.zero_point = false"]),
    "ct bits 3": ("ct-w4a16-asym-g32", lambda q: _weights(q).update(num_bits=3),
                  ["quantization_config.config_groups.group_0.weights.num_bits = 3"]),
    "ct tensor strategy int4": ("ct-w4a16-asym-g32", lambda q: _weights(q).update(strategy="tensor", group_size=None),
                                ['weights.strategy = "tensor" is not supported with 4-bit int']),
    "ct mixed precision": ("ct-w4a16-asym-g32", lambda q: q.update(format="mixed-precision"),
                           ['quantization_config.format = "mixed-precision"']),
    "ct group size": ("ct-w4a16-asym-g32", lambda q: _weights(q).update(group_size=48),
                      ["does not divide its 256 inputs"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_unsupported_config_is_refused(serval, folders, tmp_path, case):
    base, edit, expected = CONFIG_REFUSALS[case]
    folder = _copy(folders[base], tmp_path / "m")
    _edit_config(folder, edit)
    err = _load_error(serval, folder)
    for e in expected:
        assert e in err, f"{case}: {e!r} not in {err!r}"


def _edit_tensor(folder, name, shape=None, drop=False):
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    if drop:
        del header[name]
    else:
        header[name]["shape"] = shape
    _write_st(st, header, data)


TENSOR_REFUSALS = {
    # [256, 32] int32 read as [128, 64]: the same bytes, another shape.
    "gptq qweight shape": ("gptq-v1-g128", "model.layers.0.self_attn.q_proj.qweight", [64, 128],
                           ['"model.layers.0.self_attn.q_proj.qweight" has shape [64, 128], expected [32, 256]']),
    "gptq scales shape": ("gptq-v1-g128", "model.layers.0.mlp.down_proj.scales", [256, 3],
                          ['"model.layers.0.mlp.down_proj.scales" has shape [256, 3], expected [3, 256]']),
    "awq qzeros shape": ("awq-g64", "model.layers.1.mlp.up_proj.qzeros", [48, 4],
                         ['"model.layers.1.mlp.up_proj.qzeros" has shape [48, 4], expected [4, 48]']),
    "awq missing scales": ("awq-g64", "model.layers.1.self_attn.o_proj.scales", None,
                           ['"model.layers.1.self_attn.o_proj.scales" is missing']),
    "ct zero point shape": ("ct-w4a16-asym-g32", "model.layers.0.self_attn.k_proj.weight_zero_point", [8, 16],
                            ['"model.layers.0.self_attn.k_proj.weight_zero_point" has shape [8, 16], '
                             "expected [16, 8]"]),
    "ct missing weight_shape": ("ct-w4a16-asym-g32", "model.layers.0.mlp.gate_proj.weight_shape", None,
                                ['"model.layers.0.mlp.gate_proj.weight_shape" is missing']),
}


@pytest.mark.parametrize("case", sorted(TENSOR_REFUSALS))
def test_broken_tensor_is_refused(serval, folders, tmp_path, case):
    base, name, shape, expected = TENSOR_REFUSALS[case]
    folder = _copy(folders[base], tmp_path / "m")
    _edit_tensor(folder, name, shape, drop=shape is None)
    err = _load_error(serval, folder)
    for e in expected:
        assert e in err, f"{case}: {e!r} not in {err!r}"


def test_truncated_packed_tensor_is_refused(serval, folders, tmp_path):
    folder = _copy(folders["gptq-v1-g128"], tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    name = "model.layers.1.mlp.up_proj.qweight"
    header[name]["shape"] = [32, 385]  # one more column than its bytes hold
    _write_st(st, header, data)
    assert name in _load_error(serval, folder)
    # ... and a file cut short.
    folder2 = _copy(folders["gptq-v1-g128"], tmp_path / "m2")
    raw = (folder2 / "model.safetensors").read_bytes()
    (folder2 / "model.safetensors").write_bytes(raw[: len(raw) * 2 // 3])
    _load_error(serval, folder2)


def test_g_idx_out_of_range_is_refused(serval, folders, tmp_path):
    folder = _copy(folders["gptq-v1-g128"], tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    name = "model.layers.0.self_attn.v_proj.g_idx"
    begin, _ = header[name]["data_offsets"]
    data = bytearray(data)
    data[begin:begin + 4] = struct.pack("<i", 7)
    _write_st(st, header, bytes(data))
    assert f'"{name}" holds group 7, outside 0 .. 1' in _load_error(serval, folder)
