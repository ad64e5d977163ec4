"""Tiny FP8 Llama checkpoints, written as the real tools write them: a random Llama
(hidden 256, so that [128, 128] blocks fit, with a partial block where the FFN is
320 wide) whose linear weights are quantized to torch.float8_e4m3fn with scales
per tensor, per output channel or per [128, 128] block, beside the config.json
quantization_config of transformers' "fp8" (FineGrainedFP8Config.to_dict()) or of
compressed-tensors' "float-quantized" (QuantizationConfig.model_dump() of
llm-compressor's FP8 / FP8_DYNAMIC / FP8_BLOCK presets, as compressed-tensors 0.20
writes them). Tensor names and scale shapes follow transformers'
integrations/finegrained_fp8.py (`weight_scale_inv`: [] per tensor,
[ceil(out/128), ceil(in/128)] per block; `activation_scale` when static) and
compressed-tensors' quantization/lifecycle/initialize.py (`weight_scale`: [1] per
tensor, [out, 1] per channel, [ceil(out/128), ceil(in/128)] per block;
`input_scale` [1] when static).

`dequantized_reference` is the oracle: the same Llama in float32 with every
quantized weight replaced by q * scale (float32)."""
import copy
import json
import math
import pathlib
import shutil

import torch
import transformers
from safetensors.torch import save_file

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

LLAMA = dict(vocab_size=128256, hidden_size=256, intermediate_size=320, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
             bos_token_id=128000, eos_token_id=128001)


def _input_act(strategy, dynamic, group_size=None, observer=None):
    a = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": group_size,
         "strategy": strategy, "dynamic": dynamic}
    if observer:
        a["observer"] = observer
    return a


def ct_config(strategy: str, ignore=("lm_head",)) -> dict:
    """compressed-tensors' quantization_config for llm-compressor's FP8 (tensor),
    FP8_DYNAMIC (channel) and FP8_BLOCK (block) presets, as model_dump() writes it."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
               "strategy": strategy, "dynamic": False}
    if strategy == "block":
        weights = {**weights, "block_structure": [128, 128]}
        weights = {k: weights[k] for k in ("num_bits", "type", "symmetric", "group_size", "strategy",
                                           "block_structure", "dynamic")}
    acts = {"tensor": _input_act("tensor", False, observer="static_minmax"),
            "channel": _input_act("token", True),
            "block": _input_act("group", True, group_size=128)}[strategy]
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts, "output_activations": None,
                                          "format": None}},
            "quant_method": "compressed-tensors", "kv_cache_scheme": None, "format": "float-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None,
            "ignore": list(ignore), "moe_sparsity_config": None}


def fp8_config(block: bool, activation_scheme="dynamic") -> dict:
    """transformers' FineGrainedFP8Config(...).to_dict()."""
    return {"quant_method": "fp8", "modules_to_not_convert": None, "modules_to_convert": None,
            "activation_scheme": activation_scheme, "weight_block_size": [128, 128] if block else None,
            "dequantize": False, "scale_fmt": "float", "expert_dtype": "fp8"}


def quantize(w: torch.Tensor, scheme: str, block=(128, 128)):
    """(q as float8_e4m3fn, scale f32) with w ~ q * scale: scale = amax / 448 per
    tensor ([1]), per row ([out, 1]) or per block ([ceil(out/r), ceil(in/c)])."""
    w = w.float()
    out, inp = w.shape
    if scheme == "tensor":
        scale = (w.abs().max() / FP8_MAX).reshape(1)
        full = scale
    elif scheme == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX)
        full = scale
    else:
        r, c = block
        nr, nc = math.ceil(out / r), math.ceil(inp / c)
        padded = torch.zeros(nr * r, nc * c)
        padded[:out, :inp] = w
        amax = padded.reshape(nr, r, nc, c).abs().amax(dim=(1, 3))
        scale = amax / FP8_MAX
        full = scale.repeat_interleave(r, 0).repeat_interleave(c, 1)[:out, :inp]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.float()


def hash_name(s: str) -> int:
    return sum(s.encode())


def dequantize(q: torch.Tensor, scale: torch.Tensor, scheme: str, block=(128, 128)) -> torch.Tensor:
    out, inp = q.shape
    if scheme == "block":
        r, c = block
        scale = scale.repeat_interleave(r, 0).repeat_interleave(c, 1)[:out, :inp]
    return q.float() * scale.float()


def autofp8_config() -> dict:
    """The older static kind (AutoFP8, read by vLLM): no weight_block_size, one
    `weight_scale` and one `input_scale` per tensor."""
    return {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}


def random_llama(seed, intermediate_size, base=None):
    """A float32 Llama of `base`'s shape (default LLAMA) with seeded weights: norms near 1,
    bf16-exact embeddings and LM head, other matrices scaled by 1.5 / sqrt(width)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**(base or LLAMA), "intermediate_size": intermediate_size})
    model = transformers.LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen).to(torch.bfloat16).float())
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p.shape[-1] ** 0.5))
    return config, model


def build(out_dir: pathlib.Path, models_dir: pathlib.Path, method: str, scheme: str, seed=7,
          ignore=("lm_head",), scale_dtype=torch.float32, static_acts=False, intermediate_size=320,
          shards=1):
    """Writes an FP8 checkpoint folder (method "fp8", "autofp8" or "ct"; with
    shards > 1, safetensors shards and an index, each scale in another shard than
    its weight); returns the float32 Llama that runs its dequantized weights (the
    oracle)."""
    config, model = random_llama(seed, intermediate_size)
    if method in ("fp8", "autofp8"):
        qc = fp8_config(scheme == "block", "static" if static_acts else "dynamic") if method == "fp8" \
            else autofp8_config()
        quantized = lambda name: name != "lm_head"  # transformers leaves the LM head alone
    else:
        qc = ct_config(scheme, ignore)
        import re
        quantized = lambda name: not any(
            re.match(i[3:], name) if i.startswith("re:") else i == name for i in ignore)
    tensors = {}
    ref = copy.deepcopy(model)
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        is_linear = name.endswith(".weight") and (module.split(".")[-1] in LINEARS or module == "lm_head")
        if not (is_linear and quantized(module)):
            tensors[name] = p.detach().to(torch.bfloat16 if p.dim() == 2 else torch.float32).contiguous()
            with torch.no_grad():
                ref_params[name].copy_(tensors[name].float())
            continue
        q, scale = quantize(p.detach(), scheme)
        with torch.no_grad():
            ref_params[name].copy_(dequantize(q, scale.to(scale_dtype), scheme))
        tensors[name] = q.contiguous()
        if method == "autofp8":
            tensors[module + ".weight_scale"] = scale.reshape(()).to(scale_dtype)
            tensors[module + ".input_scale"] = torch.tensor(0.05, dtype=torch.float32)
        elif method == "fp8":
            tensors[module + ".weight_scale_inv"] = (scale.reshape(()) if scheme == "tensor" else scale).to(scale_dtype)
            if static_acts:
                tensors[module + ".activation_scale"] = torch.tensor(0.05, dtype=torch.float32)
        else:
            tensors[module + ".weight_scale"] = scale.to(scale_dtype).contiguous()
            if scheme == "tensor":
                tensors[module + ".input_scale"] = torch.tensor([0.05], dtype=scale_dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(tensors)
        files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        where = {}
        for n in names:
            base = n.rsplit(".", 1)[0]
            scale = n.endswith("_scale") or n.endswith("_scale_inv")
            where[n] = files[(hash_name(base) + (1 if scale else 0)) % shards]
        for f in files:
            save_file({n: tensors[n] for n in names if where[n] == f}, str(out_dir / f), metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": where}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    cfg["quantization_config"] = qc
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    tok_dir = models_dir / "tokenizers" / "llama3"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out_dir / f)
    return ref
