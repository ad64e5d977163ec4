"""A real trained model, SmolLM2-135M-Instruct (Q4_1 matrices, Q8_0 embeddings; fetched by
scripts/fetch-smollm2.py, docs/MODELS.md), against Hugging Face transformers loading the same
GGUF (dequantized to f32, so both compute in f32 from the same weights): tokenization (with
SmolLM2's pre-tokenizer, digits split off first), prompt logprobs at every position of a long
prompt, last-position logits, greedy continuations, chat through its chat template, and
llama.cpp-style perplexity on WikiText-2."""
import copy
import json
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
transformers = pytest.importorskip("transformers")

from conftest import run_serval  # noqa: E402
from serval_server import ServalServer  # noqa: E402

# Measured (docs/MODELS.md): Serval's prompt logprobs differ from transformers' by at most 3.5e-5,
# the size of f32 rounding here (transformers in f32 against itself in f64: 2.0e-5). 5e-4 is well
# below what a real fault does: weights rounded to bf16 move them by 0.08, one block of 32
# weights scaled by 1.1 in one layer by 0.07, RoPE base 10000 instead of 100000 by 5.
LOGPROB_TOL = 5e-4
LOGITS_REL_TOL = 1e-4
PPL_CTX, PPL_CHUNKS = 256, 2
STEPS = 24

TOKENIZER_TEXTS = [
    "In 2024, 12345 people paid $3.50 each.",
    "Shopping list:\n\n1. eggs\n2. milk\n\n  3 apples",  # whitespace runs before digits
    "x   2024\t\t7 ends",
    "Grüße aus Zürich! 東京は晴れです 🙂 ½ ٣",
    "def f(x):\n    return x ** 2  # squared\n",
    "<|im_start|>user\nHi there<|im_end|>\n",
]


def wikitext(models, chars):
    return (models.parent / "data" / "wikitext-2-test.raw").read_text(encoding="utf-8")[:chars]


@pytest.fixture(scope="module")
def hf(smollm2):
    """transformers' model and tokenizer from the same GGUF. The GGUF names its pre-tokenizer
    "smollm" (llama.cpp's), which transformers' converter turns into plain GPT-2 ByteLevel;
    SmolLM2's own tokenizer.json has Sequence[Digits(individual_digits), ByteLevel], put back here."""
    from tokenizers import pre_tokenizers
    kw = dict(gguf_file=smollm2.name)
    tok = transformers.AutoTokenizer.from_pretrained(smollm2.parent, **kw)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2.parent, dtype=torch.float32, **kw).eval()
    return model, tok


@pytest.fixture(scope="module")
def server(serval, smollm2):
    s = ServalServer(serval, smollm2, "--max-model-len", "2048", threads=2)
    yield s
    s.stop()


def log_softmax(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


def greedy(model, ids, steps):
    """`steps` greedy tokens, EOS not stopping them (Serval's --ignore-eos), and the smallest
    top-1/top-2 logit gap met (a near-tie may go either way)."""
    cfg = copy.deepcopy(model.generation_config)
    cfg.update(eos_token_id=None, pad_token_id=0, do_sample=False, max_new_tokens=steps, min_new_tokens=0,
               output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=cfg)
    gap = min(float(l[0].topk(2).values[0] - l[0].topk(2).values[1]) for l in out.logits)
    return out.sequences[0, len(ids):].tolist(), gap


def test_tokenization_matches_smollm2s_tokenizer(serval, smollm2, hf, models, tmp_path):
    _, tok = hf
    texts = TOKENIZER_TEXTS + [wikitext(models, 8000)]
    inp = tmp_path / "texts.jsonl"
    inp.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    proc = run_serval(serval, "tokenize", "--model", smollm2, "--input", inp)
    got = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(got) == len(texts)
    for text, ids in zip(texts, got):
        assert ids == tok(text, add_special_tokens=False)["input_ids"], text[:60]
        assert tok.decode(ids) == text


def test_prompt_logprobs_equal_transformers(server, hf, models):
    """Every position of a 300-token WikiText prompt and of a chat-formatted one (prompts as
    token ids): the prompt token's logprob and the top 5 (vLLM's prompt_logprobs)."""
    model, tok = hf
    chat = tok.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."},
                                    {"role": "assistant", "content": "Red, orange and yellow."}], tokenize=False)
    worst = 0.0
    for text in (wikitext(models, 1300), chat):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        status, _, body = server.post("/v1/completions", {"prompt": ids, "prompt_logprobs": 5, "max_tokens": 1,
                                                          "temperature": 0}, timeout=300)
        assert status == 200, body
        pl = body["choices"][0]["prompt_logprobs"]
        assert len(pl) == len(ids) and pl[0] is None
        ref = log_softmax(model, ids)
        for p in range(1, len(ids)):
            row = ref[p - 1]
            for tid, entry in pl[p].items():  # the prompt token and the top 5, by id
                err = abs(entry["logprob"] - float(row[int(tid)]))
                worst = max(worst, err)
                assert err <= LOGPROB_TOL, (p, tid, entry, float(row[int(tid)]))
            top = {int(t) for t, e in pl[p].items() if e["rank"] <= 5}
            fifth = float(torch.topk(row, 5).values[-1])
            # The reference's top 5, but for near-ties at the 5th place.
            assert {int(i) for i in torch.nonzero(row > fifth + 1e-4).flatten()} <= top, p
    print(f"largest |logprob difference|: {worst:.2e}")


def test_last_logits_and_greedy_continuation_equal_transformers(serval, smollm2, hf):
    import numpy as np
    model, tok = hf
    prompt = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"
    proc = run_serval(serval, "generate", "--model", smollm2, "--prompt", prompt, "--temperature", "0",
                      "--max-tokens", STEPS, "--ignore-eos", "--json", "--dump-logits", "--threads", 2)
    got = json.loads(proc.stdout)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert got["prompt_token_ids"] == ids
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].double().numpy()
    logits = np.asarray(got["prompt_logits"], dtype=np.float64)
    rel = np.linalg.norm(logits - want) / np.linalg.norm(want)
    assert rel < LOGITS_REL_TOL, f"last-position logits differ: relative error {rel:.2e}"
    tokens, gap = greedy(model, ids, STEPS)
    assert gap > 1e-2, f"the reference has a near-tie (gap {gap}); pick another prompt"
    assert got["token_ids"] == tokens, (tok.decode(got["token_ids"]), tok.decode(tokens))


def test_chat_uses_the_chat_template_and_answers_like_transformers(server, hf):
    model, tok = hf
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    _, _, t = server.post("/tokenize", {"messages": messages})
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert t["tokens"] == list(ids)
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    status, _, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": STEPS,
                                                           "temperature": 0}, timeout=300)
    assert status == 200, body
    c = body["choices"][0]
    want, _ = greedy(model, list(ids), STEPS)
    if tok.eos_token_id in want:  # <|im_end|> ends the turn
        want = want[:want.index(tok.eos_token_id)]
        assert c["finish_reason"] == "stop"
    assert c["message"]["content"] == tok.decode(want)
    assert "Paris" in c["message"]["content"]


def test_perplexity_matches_transformers(serval, smollm2, hf, models, tmp_path):
    """llama.cpp's method (chunks of PPL_CTX tokens, the second half of each scored; SmolLM2's
    tokenizer adds no BOS, so none is put first) on the start of WikiText-2's test split."""
    model, tok = hf
    text = tmp_path / "wiki.txt"
    text.write_text(wikitext(models, 3000), encoding="utf-8")
    proc = run_serval(serval, "perplexity", "--model", smollm2, "--file", text, "--ctx", PPL_CTX,
                      "--chunks", PPL_CHUNKS, "--device", "cpu", "--threads", 2, "--json")
    got = json.loads(proc.stdout)
    ids = tok(text.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    assert got["tokens"] == len(ids) and got["chunks"] == PPL_CHUNKS
    nll, scored = 0.0, 0
    for c in range(PPL_CHUNKS):
        chunk = ids[c * PPL_CTX:(c + 1) * PPL_CTX]
        lsm = log_softmax(model, chunk)
        for j in range(PPL_CTX // 2, PPL_CTX - 1):
            nll -= float(lsm[j, chunk[j + 1]])
            scored += 1
    want = math.exp(nll / scored)
    assert got["scored"] == scored
    print(f"perplexity: serval {got['perplexity']:.4f}, transformers {want:.4f}")
    assert abs(got["perplexity"] - want) / want < 1e-4, (got["perplexity"], want)
    assert 5 < got["perplexity"] < 60  # a trained 135M model on Wikipedia text, not a broken one
