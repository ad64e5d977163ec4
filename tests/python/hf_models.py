"""Tiny random Hugging Face models of the four supported architectures, built from a
seed with transformers and saved with save_pretrained. The weights are scaled up from
transformers' default init so logits are far from flat and greedy choices are clear."""
import json
import pathlib
import shutil

import torch
import transformers


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # RMSNorm gains around 1, not exactly 1, so a wrong norm shows.
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / fan_in ** 0.5))


def _common(tok_dir: pathlib.Path):
    tok_cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    return tok_cfg


SPECS = {
    # Llama 3 style: GQA, rope_scaling llama3, the Llama 3 tokenizer.
    "llama3": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", tokenizer="llama3",
        kwargs=dict(vocab_size=128256, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192},
                    tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)),
    # Qwen2: q/k/v biases, tied embeddings.
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", tokenizer="qwen3",
        kwargs=dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                    bos_token_id=151643, eos_token_id=151645)),
    # Qwen3: q/k RMSNorm, head_dim larger than hidden/heads.
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", tokenizer="qwen3",
        kwargs=dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)),
    # Mistral: a sliding window shorter than most prompts, so attention forgets.
    "mistral": dict(
        cls="MistralForCausalLM", cfg="MistralConfig", tokenizer="llama3",
        kwargs=dict(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=8,
                    tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)),
}


def build(kind: str, out_dir: pathlib.Path, models_dir: pathlib.Path, seed: int = 1234):
    """Writes the model folder (config, safetensors, tokenizer files); returns the model."""
    spec = SPECS[kind]
    torch.manual_seed(seed)
    config = getattr(transformers, spec["cfg"])(**spec["kwargs"])
    config.torch_dtype = torch.float32
    model = getattr(transformers, spec["cls"])(config).eval()
    _randomize(model, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok_dir = models_dir / "tokenizers" / spec["tokenizer"]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out_dir / f)
    return model
