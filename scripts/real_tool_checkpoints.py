"""Steps of scripts/real-tool-checkpoints.sh, each run in the Python that has its tool:
  base OUT                     a tiny random Llama (widths 256 and 512) saved by transformers
  quantize TOOL SCHEME BASE OUT CALIB   the real tool quantizes it (llm-compressor, AutoAWQ, GPTQModel)
  reference DIR OUT.npy        Hugging Face transformers runs the quantized checkpoint: last-position logits
  compare DIR REF.npy SERVAL   Serval's CPU logits against the reference (relative L2 and max relative)"""
import json
import subprocess
import sys

import numpy as np

PROMPT = "The quick brown fox jumps over the lazy dog. 1234567890"


def base(out):
    import torch
    import transformers
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0,
                                   tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            elif p.dim() == 2 and "embed" not in name and "lm_head" not in name:
                p.copy_(torch.randn(p.shape) * (1.5 / p.shape[-1] ** 0.5))
            else:
                p.copy_(torch.randn(p.shape))
    model.to(torch.bfloat16).save_pretrained(out)


def calibration(path, tok, n=16, length=128):
    text = open(path, encoding="utf-8").read()[:200000]
    ids = tok(text)["input_ids"]
    return [ids[i * length:(i + 1) * length] for i in range(n)]


def quantize(tool, scheme, base_dir, out, calib_path):
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(base_dir)
    samples = calibration(calib_path, tok)
    if tool == "llmc":
        from datasets import Dataset
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
        model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
        ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
        if scheme.startswith("W4A16"):
            recipe = GPTQModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
        else:
            recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
        oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=128, num_calibration_samples=len(samples))
        model.save_pretrained(out, save_compressed=True)
    elif tool == "awq":
        from awq import AutoAWQForCausalLM
        model = AutoAWQForCausalLM.from_pretrained(base_dir)
        texts = [tok.decode(s) for s in samples]
        model.quantize(tok, quant_config={"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"},
                       calib_data=texts, max_calib_seq_len=128, n_parallel_calib_samples=1)
        model.save_quantized(out)
    elif tool == "gptq":
        from gptqmodel import GPTQModel, QuantizeConfig
        sym, desc_act = scheme in ("sym", "sym-desc"), scheme.endswith("desc")
        model = GPTQModel.load(base_dir, QuantizeConfig(bits=4, group_size=128, sym=sym, desc_act=desc_act))
        model.quantize([{"input_ids": s, "attention_mask": [1] * len(s)} for s in samples], batch_size=1)
        model.save(out)
    else:
        raise SystemExit(f"unknown tool {tool}")
    tok.save_pretrained(out)


def awq_dequantized(folder):
    """transformers runs AWQ only on GPUs (or IPEX): AutoAWQ's own unpacking
    (dequantize_gemm, its scales widened to f32) into a float32 Llama."""
    import glob

    import torch
    import transformers
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    tensors = {}
    for f in glob.glob(f"{folder}/*.safetensors"):
        tensors.update(load_file(f))
    config = transformers.AutoConfig.from_pretrained(folder)
    group = config.quantization_config["group_size"]
    del config.quantization_config
    model = transformers.LlamaForCausalLM(config).float().eval()
    state = {}
    for name, t in tensors.items():
        if name.endswith(".qweight"):
            m = name[: -len(".qweight")]
            w = dequantize_gemm(t, tensors[m + ".qzeros"], tensors[m + ".scales"].float(), 4, group)
            state[m + ".weight"] = w.T.contiguous().float()
        elif not name.endswith((".qzeros", ".scales")):
            state[name] = t.float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model


def reference(folder, out):
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    qc = json.load(open(f"{folder}/config.json"))["quantization_config"]
    if qc["quant_method"] == "awq":
        model = awq_dequantized(folder)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for m in model.modules():  # compressed-tensors: weights only (Serval does not quantize activations)
        if hasattr(m, "quantization_scheme"):
            m.quantization_enabled = False
    ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double().numpy()
    np.save(out, logits)


def compare(folder, ref_path, serval):
    proc = subprocess.run([serval, "generate", "--model", folder, "--prompt", PROMPT, "--temperature", "0",
                           "--max-tokens", "1", "--json", "--dump-logits", "--device", "cpu"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"serval failed on {folder}:\n{proc.stderr}")
    got = np.asarray(json.loads(proc.stdout)["prompt_logits"], dtype=np.float64)
    want = np.load(ref_path)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    max_rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    line = [l for l in proc.stderr.splitlines() if "checkpoint quantization" in l]
    print(f"{folder}: relative L2 {rel:.2e}, max |diff| / max |ref| {max_rel:.2e}; {line[0] if line else ''}")
    if rel > 1e-3:
        raise SystemExit(f"FAIL: {folder} differs from transformers by {rel:.2e} (> 1e-3)")


if __name__ == "__main__":
    step, args = sys.argv[1], sys.argv[2:]
    {"base": base, "quantize": quantize, "reference": reference, "compare": compare}[step](*args)
