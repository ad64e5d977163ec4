"""KV cache scales from a checkpoint (issue 52): a compressed-tensors folder
with a kv_cache_scheme and llm-compressor's `self_attn.k_scale` / `v_scale`
tensors runs with --kv-cache-dtype fp8 or int8 on those scales (the start-up
log says so and shows them, converted to int8's codes through the same amax);
malformed scales (wrong shape, negative, NaN, some layers only) and
unsupported schemes are refused at load naming the tensor or field."""
import json
import math
import re
import struct

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
pytest.importorskip("transformers")

from conftest import run_serval  # noqa: E402
from test_fp8_checkpoints import _copy, _edit_config, _load_error, _read_st, _write_st, ct_folder  # noqa: E402,F401

SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
# Layer 0: one scale per KV head (2) for K; every other scale one value.
SCALES = {"model.layers.0.self_attn.k_scale": [0.01, 0.02], "model.layers.0.self_attn.v_scale": [0.005],
          "model.layers.1.self_attn.k_scale": [0.04], "model.layers.1.self_attn.v_scale": [0.0025]}


def _with_scales(src, dst, scales, scheme=SCHEME):
    folder = _copy(src, dst)
    st = folder / "model.safetensors"
    header, data = _read_st(st)
    for name, values in scales.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)] if len(values) > 1 else [],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    _write_st(st, header, data)
    if scheme is not None:
        _edit_config(folder, lambda q: q.update(kv_cache_scheme=scheme))
    return folder


def _start(serval, folder, kv, check=True):
    return run_serval(serval, "generate", "--model", folder, "--prompt", "hi", "--max-tokens", 2, "--device", "cpu",
                      "--kv-cache-dtype", kv, "--kv-cache-tokens", 64, check=check)


def _scale_range(stderr):
    m = re.search(r"scales per \(layer, KV head\) ([0-9.e-]+)-([0-9.e-]+) \(K\), ([0-9.e-]+)-([0-9.e-]+) \(V\) "
                  r"from the checkpoint's k_scale / v_scale", stderr)
    assert m, stderr
    return [float(g) for g in m.groups()]


def test_checkpoint_scales_are_used(serval, ct_folder, tmp_path):
    folder = _with_scales(ct_folder, tmp_path / "m", SCALES)
    assert _scale_range(_start(serval, folder, "fp8").stderr) == pytest.approx([0.01, 0.04, 0.0025, 0.005], rel=5e-3)
    # int8 codes: the same amax (scale x 448) over 127.
    f = 448 / 127
    assert _scale_range(_start(serval, folder, "int8").stderr) == pytest.approx(
        [0.01 * f, 0.04 * f, 0.0025 * f, 0.005 * f], rel=5e-3)
    # Without a kv_cache_scheme the scales are taken as vLLM does, for fp8.
    plain = _with_scales(ct_folder, tmp_path / "p", SCALES, scheme=None)
    assert _scale_range(_start(serval, plain, "fp8").stderr) == pytest.approx([0.01, 0.04, 0.0025, 0.005], rel=5e-3)


def test_int8_scheme_scales_convert_to_fp8(serval, ct_folder, tmp_path):
    folder = _with_scales(ct_folder, tmp_path / "m", SCALES, {**SCHEME, "type": "int"})
    assert _scale_range(_start(serval, folder, "int8").stderr) == pytest.approx([0.01, 0.04, 0.0025, 0.005], rel=5e-3)
    f = 127 / 448
    assert _scale_range(_start(serval, folder, "fp8").stderr) == pytest.approx(
        [0.01 * f, 0.04 * f, 0.0025 * f, 0.005 * f], rel=5e-3)


BROKEN = {
    "shape": ({"model.layers.1.self_attn.k_scale": [0.1, 0.2, 0.3]},
              ['"model.layers.1.self_attn.k_scale" has shape [3]', "1 value or one per KV head (2)"]),
    "negative": ({"model.layers.0.self_attn.v_scale": [-0.5]},
                 ['"model.layers.0.self_attn.v_scale" has value -0.5', "finite and positive"]),
    "nan": ({"model.layers.1.self_attn.v_scale": [math.nan]},
            ['"model.layers.1.self_attn.v_scale" has value nan', "finite and positive"]),
    "zero": ({"model.layers.0.self_attn.k_scale": [0.0, 0.1]}, ['has value 0 at 0', "finite and positive"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_malformed_scales_are_refused_at_load(serval, ct_folder, tmp_path, case):
    change, expected = BROKEN[case]
    folder = _with_scales(ct_folder, tmp_path / "m", {**SCALES, **change})
    err = _load_error(serval, folder)  # refused even with --kv-cache-dtype auto
    for e in expected:
        assert e in err


def test_scales_of_some_layers_only_are_refused(serval, ct_folder, tmp_path):
    folder = _with_scales(ct_folder, tmp_path / "m", {k: v for k, v in SCALES.items() if "layers.0" in k})
    err = _load_error(serval, folder)
    assert '"model.layers.1.self_attn.k_scale" is missing' in err


@pytest.mark.parametrize("change,field", [({"dynamic": True}, "kv_cache_scheme.dynamic"),
                                          ({"num_bits": 4}, "kv_cache_scheme.num_bits"),
                                          ({"symmetric": False}, "kv_cache_scheme.symmetric"),
                                          ({"strategy": "token"}, "kv_cache_scheme.strategy")])
def test_unsupported_kv_cache_scheme_is_refused(serval, ct_folder, tmp_path, change, field):
    folder = _with_scales(ct_folder, tmp_path / "m", SCALES, {**SCHEME, **change})
    assert field in _load_error(serval, folder)
