"""FP8 checkpoints (transformers' quant_method "fp8", compressed-tensors'
"float-quantized") load, and their logits on the CPU match a float32 Llama running
the dequantized weights (q * scale) within 1e-3 relative; where transformers loads
the checkpoint itself on a CPU (quant_method "fp8": it dequantizes at load), its
logits are the oracle too. Unsupported variants are refused naming the field.
The checkpoints are written by tests/python/fp8_checkpoints.py."""
import json
import pathlib
import shutil
import struct

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
transformers = pytest.importorskip("transformers")
np = pytest.importorskip("numpy")

import fp8_checkpoints as fc  # noqa: E402
from conftest import run_serval  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890"
STEPS = 8

CASES = {
    # transformers' FineGrainedFP8 (DeepSeek-V3 style): [128, 128] blocks, dynamic activations.
    "fp8-block": dict(method="fp8", scheme="block", intermediate_size=384, hf_loads=True),
    # The same with a 320-wide FFN: partial blocks (transformers' CPU dequantizer refuses them).
    "fp8-block-partial": dict(method="fp8", scheme="block"),
    # Per-tensor scales with static activation scales (weight_block_size null).
    "fp8-tensor-static": dict(method="fp8", scheme="tensor", static_acts=True, hf_loads=True),
    # AutoFP8's static kind (vLLM reads it): no weight_block_size, `weight_scale` per tensor.
    "autofp8": dict(method="autofp8", scheme="tensor"),
    # llm-compressor's FP8 preset: per-tensor weights, static input_scale; lm_head ignored;
    # two shards, each scale in the other shard than its weight.
    "ct-tensor": dict(method="ct", scheme="tensor", shards=2),
    # FP8_DYNAMIC: per-channel bf16 scales; one more module ignored by a regex.
    "ct-channel": dict(method="ct", scheme="channel", scale_dtype=torch.bfloat16,
                       ignore=("lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$")),
    # FP8_BLOCK with nothing ignored: the LM head is FP8 too (partial blocks of the FFN).
    "ct-block": dict(method="ct", scheme="block", ignore=()),
}


def _has_compressed_tensors():
    try:
        import compressed_tensors  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module", params=sorted(CASES))
def fp8_model(request, tmp_path_factory, models):
    case = dict(CASES[request.param])
    hf_loads = case.pop("hf_loads", False)
    folder = tmp_path_factory.mktemp(request.param)
    ref = fc.build(folder, models, **case)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return request.param, folder, ref, tok, hf_loads


def reference(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        first = out.logits[0, -1].clone()
        logits, past, tokens, gap = first, out.past_key_values, [], float("inf")
        for _ in range(STEPS):
            top2 = torch.topk(logits, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))
            tokens.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            logits, past = out.logits[0, -1], out.past_key_values
    return first.double().numpy(), tokens, gap


def rel_err(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_fp8_checkpoint_matches_dequantized_reference(serval, fp8_model):
    name, folder, ref, tok, hf_loads = fp8_model
    proc = run_serval(serval, "generate", "--model", folder, "--prompt", PROMPT, "--temperature", "0",
                      "--max-tokens", STEPS, "--ignore-eos", "--json", "--dump-logits", "--device", "cpu")
    result = json.loads(proc.stdout)
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert result["prompt_token_ids"] == ids
    want, tokens, gap = reference(ref, ids)
    got = np.asarray(result["prompt_logits"], dtype=np.float64)
    assert rel_err(got, want) < 1e-3, f"{name}: logits differ from the dequantized reference"
    assert gap > 1e-3, "the reference has a near-tie; pick another seed"
    assert result["token_ids"] == tokens
    if hf_loads:
        # transformers loads quant_method "fp8" on a CPU by dequantizing it: the
        # checkpoint's own reading, not ours, as the oracle.
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        hf_want, hf_tokens, _ = reference(hf, ids)
        assert rel_err(got, hf_want) < 1e-3, f"{name}: logits differ from transformers' own loading"
        assert hf_tokens == tokens


@pytest.mark.skipif(not _has_compressed_tensors(), reason="compressed-tensors is not installed")
def test_compressed_tensors_decompresses_to_the_reference(fp8_model):
    """compressed-tensors' own decompression (through transformers) gives the
    reference's weights; with its activation fake-quantization off, its logits."""
    name, folder, ref, tok, _ = fp8_model
    if not name.startswith("ct-") or name == "ct-block":  # its dequantizer refuses partial blocks
        pytest.skip("not a compressed-tensors checkpoint transformers loads")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for m in hf.modules():
        if hasattr(m, "quantization_scheme"):
            m.quantization_enabled = False
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert rel_err(reference(hf, ids)[0], reference(ref, ids)[0]) < 1e-6


# --- refusals -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ct_folder(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("ct-base")
    fc.build(folder, models, "ct", "channel")
    return folder


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg["quantization_config"])
    (folder / "config.json").write_text(json.dumps(cfg))


def _read_st(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(path, header, data):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _load_error(serval, folder):
    proc = run_serval(serval, "generate", "--model", folder, "--prompt", "hi", "--max-tokens", 1,
                      "--device", "cpu", check=False)
    assert proc.returncode != 0, "serval loaded a checkpoint it should refuse"
    assert "Traceback" not in proc.stderr and "Segmentation" not in proc.stderr
    return proc.stderr


CONFIG_REFUSALS = {
    "unknown quant_method": (lambda q: q.update(quant_method="bitsandbytes"),
                             ['quantization_config.quant_method = "bitsandbytes"', "not supported"]),
    "int-quantized with fp8 weights": (lambda q: q.update(format="int-quantized"),
                                       ['weights.type = "float"', 'in quantization_config.format "int-quantized"']),
    "pack-quantized with fp8 weights": (lambda q: q.update(format="pack-quantized"),
                                        ['weights.type = "float"', 'in quantization_config.format "pack-quantized"']),
    "mixed-precision": (lambda q: q.update(format="mixed-precision"),
                        ['quantization_config.format = "mixed-precision"']),
    "int weights": (lambda q: q["config_groups"]["group_0"]["weights"].update(type="int"),
                    ["quantization_config.config_groups.group_0.weights.type", '"int"']),
    "group strategy": (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=128),
                       ["quantization_config.config_groups.group_0.weights.strategy", '"group"']),
    "dynamic kv cache scheme": (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float",
                                                                    "strategy": "tensor", "dynamic": True}),
                                ["quantization_config.kv_cache_scheme.dynamic = true"]),
    "ignore mismatch": (lambda q: q.update(ignore=[]),
                        ['"lm_head.weight" is BF16', 'quantizes "lm_head"']),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_unsupported_config_is_refused(serval, ct_folder, tmp_path, case):
    edit, expected = CONFIG_REFUSALS[case]
    folder = _copy(ct_folder, tmp_path / "m")
    _edit_config(folder, edit)
    err = _load_error(serval, folder)
    for e in expected:
        assert e in err, f"{case}: {e!r} not in {err!r}"


def test_fp8_scale_format_ue8m0_is_refused(serval, ct_folder, tmp_path):
    folder = _copy(ct_folder, tmp_path / "m")
    _edit_config(folder, lambda q: (q.clear(), q.update(fc.fp8_config(True)), q.update(scale_fmt="ue8m0")))
    assert 'quantization_config.scale_fmt = "ue8m0"' in _load_error(serval, folder)


def test_scale_of_the_wrong_shape_is_refused(serval, ct_folder, tmp_path):
    folder = _copy(ct_folder, tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    begin, _ = header[name]["data_offsets"]
    header[name]["shape"] = [128, 2]  # the bytes of f32 [256, 1], another shape
    _write_st(st, header, data)
    err = _load_error(serval, folder)
    assert f'"{name}" has shape [128, 2], expected [256, 1]' in err


def test_missing_scale_is_refused(serval, ct_folder, tmp_path):
    folder = _copy(ct_folder, tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    del header["model.layers.1.mlp.up_proj.weight_scale"]
    _write_st(st, header, data)
    err = _load_error(serval, folder)
    assert '"model.layers.1.mlp.up_proj.weight" has no scale tensor' in err


def test_truncated_fp8_tensor_is_refused(serval, ct_folder, tmp_path):
    # A header whose F8 tensor claims more elements than its bytes...
    folder = _copy(ct_folder, tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    name = "model.layers.0.mlp.down_proj.weight"
    header[name]["shape"] = [256, 321]
    _write_st(st, header, data)
    err = _load_error(serval, folder)
    assert name in err and "F8_E4M3 [256, 321]" in err
    # ...and a file cut short inside the F8 data.
    folder2 = _copy(ct_folder, tmp_path / "m2")
    st2 = folder2 / "model.safetensors"
    header, data = _read_st(st2)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    header = {k: v for k, v in header.items()}
    f8 = next(k for k in header if k != "__metadata__" and header[k]["dtype"] == "F8_E4M3")
    # Move that F8 tensor to the end of the data, then cut the file inside it.
    b, e = header[f8]["data_offsets"]
    end = header[last]["data_offsets"][1]
    blob = data[b:e]
    header[f8]["data_offsets"] = [end, end + len(blob)]
    _write_st(st2, header, data[:end] + blob[: len(blob) // 2])
    err = _load_error(serval, folder2)
    assert "truncated" in err and f8 in err


def test_fp8_without_quantization_config_is_refused(serval, ct_folder, tmp_path):
    folder = _copy(ct_folder, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["quantization_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert "is F8_E4M3 but config.json has no quantization_config" in _load_error(serval, folder)


def test_convert_refuses_fp8_checkpoints(serval, ct_folder, tmp_path):
    proc = run_serval(serval, "convert", ct_folder, "--out", tmp_path / "x.gguf", check=False)
    assert proc.returncode != 0 and "quantized checkpoint" in proc.stderr
