"""`serval generate` end to end on stories260K: the published greedy continuation
(llama2.c's run.c output, ids in shared/models/PROVENANCE.md), streaming vs JSON,
seeded sampling, and clear errors for bad input."""
import json
import os
import re
import subprocess

import pytest

from conftest import run_serval

PROMPT = "Once upon a time"


def reference_ids(models):
    """The 256 greedy ids after BOS published in PROVENANCE.md (prompt included)."""
    text = (models / "PROVENANCE.md").read_text()
    block = text.split("The 256 greedy token ids", 1)[1].split("```", 2)[1]
    ids = [int(x) for x in block.split()]
    assert len(ids) == 256
    return ids


def generate_json(serval, *args):
    return json.loads(run_serval(serval, "generate", "--json", *args).stdout)


def test_golden_greedy_200_tokens(serval, models):
    ref = reference_ids(models)
    model = models / "stories260K" / "stories260K.gguf"
    out = generate_json(serval, "--model", model, "--prompt", PROMPT, "--temperature", "0",
                        "--max-tokens", "200")
    assert out["prompt_token_ids"] == [1] + ref[:4]
    assert out["token_ids"] == ref[4:204]
    assert out["finish_reason"] == "length"
    assert out["text"].startswith(", there was a little girl named Lily. She loved to play outside")
    # The streamed text is exactly the JSON text (and not the prompt).
    streamed = run_serval(serval, "generate", "--model", model, "--prompt", PROMPT,
                          "--temperature", "0", "--max-tokens", "200")
    assert streamed.stdout == out["text"] + "\n"
    assert "time to first token" in streamed.stderr and "tokens/s" in streamed.stderr


def test_default_model_is_stories260k(serval, models):
    env = dict(os.environ, SERVAL_MODELS=str(models))
    proc = subprocess.run([str(serval), "generate", "--prompt", PROMPT, "--temperature", "0",
                           "--max-tokens", "8"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(", there was a little girl")


def test_missing_default_model_says_what_to_do(serval, tmp_path):
    env = dict(os.environ, SERVAL_MODELS=str(tmp_path / "nowhere"))
    proc = subprocess.run([str(serval), "generate", "--prompt", PROMPT], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert "SERVAL_MODELS" in proc.stderr and "--model" in proc.stderr


def test_converted_llama2c_checkpoint_gives_the_same_tokens(serval, models, tmp_path):
    ref = reference_ids(models)
    out_gguf = tmp_path / "stories260K-converted.gguf"
    run_serval(serval, "convert", models / "stories260K" / "stories260K.bin",
               "--tokenizer", models / "stories260K" / "tok512.bin", "--out", out_gguf)
    out = generate_json(serval, "--model", out_gguf, "--prompt", PROMPT, "--temperature", "0",
                        "--max-tokens", "200")
    assert out["prompt_token_ids"] == [1] + ref[:4]
    assert out["token_ids"] == ref[4:204]


def test_seeded_sampling_is_reproducible(serval, models):
    model = models / "stories260K" / "stories260K.gguf"
    args = ["--model", model, "--prompt", PROMPT, "--temperature", "1.0", "--top-p", "0.9",
            "--top-k", "40", "--max-tokens", "48"]
    a = generate_json(serval, *args, "--seed", "7")
    b = generate_json(serval, *args, "--seed", "7")
    c = generate_json(serval, *args, "--seed", "8")
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] != c["token_ids"]
    assert a["seed"] == 7


def test_logprobs_in_json(serval, models):
    out = generate_json(serval, "--model", models / "stories260K" / "stories260K.gguf",
                        "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "4",
                        "--logprobs", "3")
    assert len(out["logprobs"]) == 4
    for tok, lp in zip(out["token_ids"], out["logprobs"]):
        assert len(lp["top"]) == 3
        assert lp["top"][0]["token"] == tok          # greedy picks the most likely
        assert lp["logprob"] == pytest.approx(lp["top"][0]["logprob"])
        assert lp["logprob"] <= 0


@pytest.mark.parametrize("damage", ["truncate", "magic", "empty"])
def test_bad_model_files_fail_with_a_message(serval, models, tmp_path, damage):
    data = (models / "stories260K" / "stories260K.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    if damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "magic":
        bad.write_bytes(b"GGUX" + data[4:])
    else:
        bad.write_bytes(b"")
    proc = run_serval(serval, "generate", "--model", bad, "--prompt", PROMPT, check=False)
    assert proc.returncode == 1, proc.stderr  # an error, not a signal
    assert proc.stderr.startswith("error: ") and "bad.gguf" in proc.stderr


def test_bad_sampling_parameter_is_named(serval, models):
    proc = run_serval(serval, "generate", "--model", models / "stories260K" / "stories260K.gguf",
                      "--prompt", PROMPT, "--top-p", "1.5", check=False)
    assert proc.returncode == 1
    assert "top_p" in proc.stderr


def test_bad_cuda_tuning_key_is_named_with_the_valid_ones(serval, models):
    proc = run_serval(serval, "generate", "--model", models / "stories260K" / "stories260K.gguf",
                      "--prompt", PROMPT, "--cuda-tuning", "cutlass_swap=0,no_such_knob=1", check=False)
    assert proc.returncode == 1
    assert 'unknown key "no_such_knob"' in proc.stderr and "cutlass_swap_gated" in proc.stderr


def test_cuda_tuning_is_refused_on_the_cpu(serval, models):
    proc = run_serval(serval, "generate", "--model", models / "stories260K" / "stories260K.gguf",
                      "--prompt", PROMPT, "--device", "cpu", "--cuda-tuning", "pdl=0", check=False)
    assert proc.returncode == 1
    assert "--cuda-tuning" in proc.stderr and "CPU" in proc.stderr
