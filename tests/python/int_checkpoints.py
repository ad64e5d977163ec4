"""Tiny INT8 / INT4 Llama checkpoints, written as the real tools write them: a random
Llama (hidden 256, FFN 384, so that groups of 32, 64 and 128 divide every width) whose
linear weights are quantized with round-to-nearest and packed the way each tool packs:

- compressed-tensors "int-quantized" (llm-compressor's W8A8 / INT8): `weight` int8
  [out, in], `weight_scale` [out, 1] (channel) or [1] (tensor), w = q * scale;
- compressed-tensors "pack-quantized" (W4A16, W4A16_ASYM): signed int4 values q in
  -8..7 plus 8, packed eight to an int32 along the input (value i of a word in bits
  4i..4i+3: compressed_tensors/compressors/quantized_compressors/pack_quantized.py,
  pack_to_int32), `weight_scale` [out, in / g], the zero points (signed, plus 8)
  packed the same way down the output rows ([ceil(out / 8), in / g]) when asymmetric,
  `weight_shape` [2], and with actorder "group" a `weight_g_idx` [in];
  w = (q - zero) * scale;
- AutoAWQ GEMM: the transposed unsigned values [in, out] packed eight to an int32 along
  the output in AWQ's order (nibble i holds column 8k + [0, 2, 4, 6, 1, 3, 5, 7][i]:
  awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear), `qzeros` [in / g, out / 8]
  likewise, `scales` f16 [in / g, out]; w = (q - zero) * scale;
- GPTQ (AutoGPTQ's v1, GPTQModel's v2): `qweight` [in / 8, out] packed along the input
  (value j of a word: input 8r + j), `qzeros` [in / g, out / 8] packed along the output,
  stored minus one in v1 (checkpoint_format "gptq", masked to 4 bits), `scales` f16
  [in / g, out], `g_idx` [in] (desc_act: groups formed in a random column order);
  8 bits: four values a word, per channel, zero 128.

The configs are the tools' (compressed-tensors' QuantizationConfig.model_dump(),
transformers' AwqConfig / GPTQConfig to_dict() as AutoAWQ and AutoGPTQ save them).
`build` returns the oracle: the same Llama in float32 with every quantized weight
replaced by (q - zero) * scale computed here from the unpacked values (not from the
packed tensors Serval reads)."""
import copy
import functools
import json
import pathlib
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

import fp8_checkpoints

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LLAMA = dict(vocab_size=128256, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
             bos_token_id=128000, eos_token_id=128001)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column 8k + AWQ_ORDER[i]
AWQ_FIELD = tuple(AWQ_ORDER.index(j) for j in range(8))  # ... so column 8k + j lies in nibble AWQ_FIELD[j]


# --- configs, as the tools write them ---------------------------------------------------

def _ct_args(bits, strategy, symmetric=True, group_size=None, actorder=None, dynamic=False, observer="minmax"):
    return {"num_bits": bits, "type": "int", "symmetric": symmetric, "group_size": group_size,
            "strategy": strategy, "block_structure": None, "dynamic": dynamic, "actorder": actorder,
            "observer": observer, "observer_kwargs": {}}


def ct_config(fmt, weights, input_activations=None, ignore=("lm_head",)):
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": input_activations,
                                          "output_activations": None, "format": fmt}},
            "quant_method": "compressed-tensors", "kv_cache_scheme": None, "format": fmt,
            "quantization_status": "compressed", "global_compression_ratio": None,
            "ignore": list(ignore), "sparsity_config": {}, "transform_config": {}}


def awq_config(group_size):
    return {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4,
            "version": "gemm", "modules_to_not_convert": None}


def gptq_config(bits, group_size, sym, desc_act, v2):
    return {"bits": bits, "group_size": group_size, "damp_percent": 0.01, "desc_act": desc_act,
            "static_groups": False, "sym": sym, "true_sequential": True, "model_name_or_path": None,
            "model_file_base_name": "model", "quant_method": "gptq",
            "checkpoint_format": "gptq_v2" if v2 else "gptq"}


# --- round-to-nearest quantization: unsigned values, scales and zero points per group -----

def quantize_groups(w, bits, group_size, sym, g_idx, scale_dtype):
    """w [out, in] -> q [out, in] in 0 .. 2^bits - 1, scale and zero [out, groups] (zero
    2^(bits-1) when symmetric), with column c in group g_idx[c]."""
    out, inp = w.shape
    groups = int(g_idx.max()) + 1
    top = 2 ** bits - 1
    mid = 2 ** (bits - 1)
    scale = torch.empty(out, groups)
    zero = torch.full((out, groups), float(mid))
    for g in range(groups):
        cols = w[:, g_idx == g]
        if sym:
            scale[:, g] = cols.abs().amax(dim=1) / (mid - 0.5)
        else:
            lo, hi = cols.amin(dim=1).clamp(max=0), cols.amax(dim=1).clamp(min=0)
            scale[:, g] = (hi - lo) / top
            zero[:, g] = torch.round(-lo / scale[:, g]).clamp(0, top)
    scale = scale.to(scale_dtype).float()  # the checkpoint's scales, as stored
    q = torch.round(w / scale[:, g_idx] + zero[:, g_idx]).clamp(0, top)
    return q.to(torch.int64), scale, zero


def dequantize(q, scale, zero, g_idx):
    return (q.float() - zero[:, g_idx]) * scale[:, g_idx]


# --- packing, from the tools' documented layouts ----------------------------------------

def pack_rows(values, bits, field=None):
    """[rows, cols] unsigned values -> int32 [rows, ceil(cols / per)]: value c of a row
    in field field[c % per] (default c % per) of word c // per."""
    per = 32 // bits
    rows, cols = values.shape
    padded = np.zeros((rows, -(-cols // per) * per), dtype=np.uint64)
    padded[:, :cols] = values.numpy()
    field = field or tuple(range(per))
    words = np.zeros((rows, padded.shape[1] // per), dtype=np.uint64)
    for j in range(per):
        words |= padded[:, j::per] << np.uint64(field[j] * bits)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


def pack_cols(values, bits):
    """Packed down the rows: [rows, cols] -> int32 [ceil(rows / per), cols]."""
    return pack_rows(values.T.contiguous(), bits).T.contiguous()


# --- the checkpoint --------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def _random_llama(seed, intermediate_size):
    """The float Llama every case quantizes (made once: its 128k-token tables take most of a
    build's time); `build` reads it and never writes to it."""
    return fp8_checkpoints.random_llama(seed, intermediate_size, LLAMA)


def _quantized_tensors(kind, module, w, opts, gen):
    """The module's tensors as `kind` writes them, and its dequantized weight."""
    out, inp = w.shape
    bits, g, sym = opts.get("bits", 4), opts.get("group_size", 128), opts.get("sym", True)
    f16 = torch.float16
    if kind == "ct-int8":
        per_tensor = opts.get("strategy") == "tensor"
        amax = w.abs().amax() if per_tensor else w.abs().amax(dim=1, keepdim=True)
        scale = (amax / 127).to(opts.get("scale_dtype", torch.bfloat16))
        q = torch.round(w / scale.float()).clamp(-128, 127).to(torch.int8)
        t = {"weight": q, "weight_scale": scale.reshape(1) if per_tensor else scale}
        return t, q.float() * scale.float()
    if kind == "ct-pack":
        g_eff = inp if g == -1 else g
        g_idx = torch.arange(inp) // g_eff
        if opts.get("actorder"):
            g_idx = g_idx[torch.randperm(inp, generator=gen)]
        q, scale, zero = quantize_groups(w, bits, g_eff, sym, g_idx, torch.bfloat16)
        mid = 2 ** (bits - 1)
        # compressed-tensors quantizes to signed values (q - mid, zero - mid) and packs them plus mid.
        q_signed, zero_signed = q - mid, zero.to(torch.int64) - mid
        t = {"weight_packed": pack_rows(q_signed + mid, bits), "weight_scale": scale.to(torch.bfloat16),
             "weight_shape": torch.tensor([out, inp], dtype=torch.int64)}
        if not sym:
            t["weight_zero_point"] = pack_cols(zero_signed + mid, bits)
        if opts.get("actorder"):
            t["weight_g_idx"] = g_idx.to(torch.int32)
        return t, (q_signed - zero_signed[:, g_idx]).float() * scale[:, g_idx]
    if kind == "awq":
        g_idx = torch.arange(inp) // g
        q, scale, zero = quantize_groups(w, 4, g, False, g_idx, f16)
        t = {"qweight": pack_rows(q.T.contiguous(), 4, AWQ_FIELD),
             "qzeros": pack_rows(zero.T.to(torch.int64).contiguous(), 4, AWQ_FIELD),
             "scales": scale.T.contiguous().to(f16)}
        return t, dequantize(q, scale, zero, g_idx)
    if kind == "gptq":
        g_eff = inp if g == -1 else g
        g_idx = torch.arange(inp) // g_eff
        if opts.get("desc_act"):
            perm = torch.randperm(inp, generator=gen)
            g_idx = torch.empty(inp, dtype=torch.int64)
            g_idx[perm] = torch.arange(inp) // g_eff
        q, scale, zero = quantize_groups(w, bits, g_eff, sym, g_idx, f16)
        stored_zero = zero.to(torch.int64)
        if not opts.get("v2"):
            # AutoGPTQ's v1: zero - 1 in `bits` bits, read back plus one (a zero of 0 reads 2^bits).
            stored_zero = (stored_zero - 1) & (2 ** bits - 1)
            zero = (stored_zero + 1).float()
        t = {"qweight": pack_cols(q.T.contiguous(), bits), "qzeros": pack_rows(stored_zero.T.contiguous(), bits),
             "scales": scale.T.contiguous().to(f16), "g_idx": g_idx.to(torch.int32)}
        return t, dequantize(q, scale, zero, g_idx)
    raise ValueError(kind)


def build(out_dir: pathlib.Path, models_dir: pathlib.Path, kind: str, qc: dict, seed=11, ignore=("lm_head",),
          intermediate_size=384, shards=1, **opts):
    """Writes a checkpoint folder of `kind` ("ct-int8", "ct-pack", "awq", "gptq") with
    config.json's quantization_config `qc`; the modules in `ignore` stay bf16. With
    shards > 1, safetensors shards and an index, the scales in another shard than their
    packed weights. Returns the float32 Llama running the dequantized weights."""
    config, model = _random_llama(seed, intermediate_size)
    gen = torch.Generator().manual_seed(seed + 1)
    ref = copy.deepcopy(model)
    ref_params = dict(ref.named_parameters())
    tensors = {}
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        is_linear = name.endswith(".weight") and (module.split(".")[-1] in LINEARS or module == "lm_head")
        if not is_linear or module in ignore:
            tensors[name] = p.detach().to(torch.bfloat16 if p.dim() == 2 else torch.float32).contiguous()
            with torch.no_grad():
                ref_params[name].copy_(tensors[name].float())
            continue
        t, deq = _quantized_tensors(kind, module, p.detach().float(), opts, gen)
        with torch.no_grad():
            ref_params[name].copy_(deq)
        for k, v in t.items():
            tensors[f"{module}.{k}"] = v.contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        where = {n: files[(sum(n.rsplit(".", 1)[0].encode()) + ("scale" in n)) % shards] for n in tensors}
        for f in files:
            save_file({n: v for n, v in tensors.items() if where[n] == f}, str(out_dir / f), metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": where}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float16" if kind in ("awq", "gptq") else "bfloat16"
    cfg["quantization_config"] = qc
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    tok_dir = models_dir / "tokenizers" / "llama3"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out_dir / f)
    return ref
