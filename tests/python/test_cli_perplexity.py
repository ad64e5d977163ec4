"""`serval perplexity` against the same computation in Hugging Face transformers:
llama.cpp's method (chunks of --ctx tokens, BOS first in each where the
tokenizer adds one, the second half of each scored) on a tiny random Llama-3
model and real English text, in f32 on the CPU: the perplexity within 1e-5
relative, the tokens counted alike; --kl-divergence against a saved base run
(0 against itself up to the file's f32 rounding, small but not 0 for the same weights rounded to bf16); and
bad input refused with the reason."""
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by scripts/install-deps.sh")
transformers = pytest.importorskip("transformers")

import hf_models  # noqa: E402
from conftest import run_serval  # noqa: E402

CTX, CHUNKS = 64, 3


@pytest.fixture(scope="module")
def llama3(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("llama3-ppl")
    model = hf_models.build("llama3", folder, models)
    model.to(torch.float32).save_pretrained(folder, safe_serialization=True)
    ref = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return folder, ref, tok


@pytest.fixture(scope="module")
def text(models, tmp_path_factory):
    raw = (models.parent / "data" / "wikitext-2-test.raw").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("ppl-text") / "text.txt"
    path.write_text(raw[:6000], encoding="utf-8")
    return path


def reference_perplexity(ref, ids, bos):
    import math
    nll, scored = 0.0, 0
    with torch.no_grad():
        for c in range(CHUNKS):
            chunk = list(ids[c * CTX:(c + 1) * CTX])
            if bos is not None:
                chunk[0] = bos
            logp = torch.log_softmax(ref(torch.tensor([chunk])).logits[0].double(), dim=-1)
            for j in range(CTX // 2, CTX - 1):
                nll -= float(logp[j, ids[c * CTX + j + 1]])
                scored += 1
    return math.exp(nll / scored), scored


def test_perplexity_matches_transformers(serval, llama3, text):
    folder, ref, tok = llama3
    proc = run_serval(serval, "perplexity", "--model", folder, "--file", text, "--ctx", CTX, "--chunks", CHUNKS,
                      "--device", "cpu", "--json")
    got = json.loads(proc.stdout)
    ids = tok(text.read_text(encoding="utf-8"), add_special_tokens=True)["input_ids"]
    assert got["tokens"] == len(ids)
    bos = tok.bos_token_id if ids[0] == tok.bos_token_id else None
    want, scored = reference_perplexity(ref, ids, bos)
    assert got["chunks"] == CHUNKS and got["scored"] == scored
    assert abs(got["perplexity"] - want) / want < 1e-5, (got["perplexity"], want)
    assert len(got["running"]) == CHUNKS and got["running"][-1] == pytest.approx(got["perplexity"])
    assert "[1]" in proc.stderr and "[3]" in proc.stderr


def test_kl_divergence_against_a_base_run(serval, llama3, text, tmp_path):
    folder, ref, tok = llama3
    common = ["--file", text, "--ctx", CTX, "--chunks", CHUNKS, "--device", "cpu", "--json"]
    base = tmp_path / "base.kld"
    run_serval(serval, "perplexity", "--model", folder, *common, "--kl-divergence-base", base)
    rows = CHUNKS * (CTX - 1 - CTX // 2)
    assert base.stat().st_size == 8 + 6 * 8 + rows * ref.config.vocab_size * 4

    same = json.loads(run_serval(serval, "perplexity", "--model", folder, *common, "--kl-divergence", base).stdout)
    assert same["kl_divergence"]["mean"] < 1e-6 and same["kl_divergence"]["same_top1"] == 1.0

    rounded = tmp_path / "bf16"
    ref.to(torch.bfloat16).save_pretrained(rounded, safe_serialization=True)
    ref.to(torch.float32)
    tok.save_pretrained(rounded)
    other = json.loads(run_serval(serval, "perplexity", "--model", rounded, *common, "--kl-divergence", base).stdout)
    kl = other["kl_divergence"]
    assert 0 < kl["mean"] < 0.05 and kl["median"] <= kl["p99"] <= kl["max"], kl
    assert 0.5 < kl["same_top1"] <= 1.0

    proc = run_serval(serval, "perplexity", "--model", folder, "--file", text, "--ctx", CTX, "--chunks", CHUNKS - 1,
                      "--device", "cpu", "--kl-divergence", base, check=False)
    assert proc.returncode != 0 and "give the same text, tokenizer, --ctx and --chunks" in proc.stderr


def test_perplexity_refuses_what_it_cannot_score(serval, models, tmp_path):
    stories = models / "stories260K" / "stories260K.gguf"
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time", encoding="utf-8")
    proc = run_serval(serval, "perplexity", "--model", stories, "--file", short, "--ctx", 64, "--device", "cpu",
                      check=False)
    assert proc.returncode != 0 and "fewer than one chunk of 64" in proc.stderr
    proc = run_serval(serval, "perplexity", "--model", stories, "--file", tmp_path / "missing.txt", "--device", "cpu",
                      check=False)
    assert proc.returncode != 0 and "missing.txt" in proc.stderr
    proc = run_serval(serval, "perplexity", "--model", stories, "--file", short, "--ctx", 2, "--device", "cpu",
                      check=False)
    assert proc.returncode != 0 and "--ctx must be at least 4" in proc.stderr
