"""Serval's forward pass against Hugging Face transformers on tiny random models of
each supported architecture (mistral with a sliding window shorter than the prompts
and the 32 decode steps): last-position logits (f32, 1e-4 relative) and 32-step
greedy continuations, on the saved Hugging Face folders and on GGUF files made from
them by `serval convert`."""
import json
import pathlib

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
transformers = pytest.importorskip("transformers")

import hf_models  # noqa: E402
from conftest import run_serval  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Grüße aus Zürich! 東京は晴れです 🙂",
]
STEPS = 32
# Save each model in a different dtype (and llama3 sharded) to cover the loaders.
SAVE = {"llama3": dict(dtype=torch.float32, max_shard_size="20MB"),
        "qwen2": dict(dtype=torch.float16, max_shard_size="10GB"),
        "qwen3": dict(dtype=torch.bfloat16, max_shard_size="10GB"),
        "mistral": dict(dtype=torch.float32, max_shard_size="10GB")}


@pytest.fixture(scope="module", params=sorted(hf_models.SPECS))
def hf_model(request, tmp_path_factory, models):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    model = hf_models.build(kind, folder, models)
    save = SAVE[kind]
    model.to(save["dtype"]).save_pretrained(folder, safe_serialization=True,
                                            max_shard_size=save["max_shard_size"])
    # The reference computes in f32 on exactly the weights that were saved.
    ref = getattr(transformers, hf_models.SPECS[kind]["cls"]).from_pretrained(
        folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return kind, folder, ref, tok


def hf_reference(ref, ids):
    """Last-position logits of the prompt, then STEPS greedy tokens (EOS ignored),
    and the smallest top-1/top-2 gap seen (to tell a real mismatch from a tie)."""
    with torch.no_grad():
        out = ref(torch.tensor([ids]), use_cache=True)
        first_logits = out.logits[0, -1].clone()
        logits, past, tokens, gap = first_logits, out.past_key_values, [], float("inf")
        for _ in range(STEPS):
            top2 = torch.topk(logits, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))
            tokens.append(nxt)
            out = ref(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            logits, past = out.logits[0, -1], out.past_key_values
    return first_logits.numpy(), tokens, gap


def serval_generate(serval, model_path, prompt):
    proc = run_serval(serval, "generate", "--model", model_path, "--prompt", prompt,
                      "--temperature", "0", "--max-tokens", STEPS, "--ignore-eos",
                      "--json", "--dump-logits")
    return json.loads(proc.stdout)


def check(result, ref, tok, prompt):
    import numpy as np
    ids = tok(prompt, add_special_tokens=True)["input_ids"]
    assert result["prompt_token_ids"] == ids, "tokenization differs from Hugging Face"
    want_logits, want_tokens, gap = hf_reference(ref, ids)
    got_logits = np.asarray(result["prompt_logits"], dtype=np.float64)
    assert got_logits.shape == want_logits.shape
    rel = np.linalg.norm(got_logits - want_logits) / np.linalg.norm(want_logits)
    assert rel < 1e-4, f"last-position logits differ: relative error {rel:.2e}"
    assert gap > 1e-3, f"reference has a near-tie (gap {gap}); pick another seed or prompt"
    assert result["token_ids"] == want_tokens
    assert result["finish_reason"] == "length"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_hf_folder_matches_transformers(serval, hf_model, prompt):
    kind, folder, ref, tok = hf_model
    check(serval_generate(serval, folder, prompt), ref, tok, prompt)


def test_converted_gguf_matches_transformers(serval, hf_model, tmp_path):
    kind, folder, ref, tok = hf_model
    gguf = tmp_path / f"{kind}.gguf"
    run_serval(serval, "convert", folder, "--out", gguf)
    for prompt in PROMPTS[:2]:
        check(serval_generate(serval, gguf, prompt), ref, tok, prompt)
