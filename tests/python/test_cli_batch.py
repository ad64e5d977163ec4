"""`serval generate --input prompts.jsonl --output results.jsonl` on stories260K:
greedy results equal single-prompt runs (and llama2.c's published ids), n samples,
stop strings, logprobs, bad lines named before anything runs, the summary, and
the KV memory plan logged at start-up."""
import json
import re

import pytest

from conftest import run_serval
from test_cli_generate import PROMPT, reference_ids


def stories(models):
    return models / "stories260K" / "stories260K.gguf"


def run_batch(serval, models, tmp_path, requests, *args, check=True):
    inp = tmp_path / "prompts.jsonl"
    out = tmp_path / "results.jsonl"
    inp.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests))
    proc = run_serval(serval, "generate", "--model", stories(models), "--input", inp,
                      "--output", out, *args, check=check)
    results = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, results


def single(serval, models, prompt, max_tokens):
    return json.loads(run_serval(serval, "generate", "--json", "--model", stories(models),
                                 "--prompt", prompt, "--temperature", "0", "--max-tokens",
                                 max_tokens).stdout)


PROMPTS = ["Once upon a time", "Lily and Ben", "The cat sat", "One day, a little bird",
           "Tom had a big red ball. He"]


def test_greedy_results_equal_single_runs_in_input_order(serval, models, tmp_path):
    requests = [{"prompt": p, "max_tokens": 24 + 3 * i, "temperature": 0}
                for i, p in enumerate(PROMPTS)]
    proc, results = run_batch(serval, models, tmp_path, requests)
    assert [r["index"] for r in results] == list(range(len(PROMPTS)))
    for i, (p, r) in enumerate(zip(PROMPTS, results)):
        alone = single(serval, models, p, 24 + 3 * i)
        assert r["prompt_token_ids"] == alone["prompt_token_ids"]
        (choice,) = r["choices"]
        assert choice["index"] == 0
        assert choice["token_ids"] == alone["token_ids"], p
        assert choice["text"] == alone["text"]
        assert choice["finish_reason"] == alone["finish_reason"]
        usage = r["usage"]
        assert usage["prompt_tokens"] == len(alone["prompt_token_ids"])
        assert usage["completion_tokens"] == len(alone["token_ids"])
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0


def test_golden_ids_through_the_batch_path(serval, models, tmp_path):
    ref = reference_ids(models)
    requests = [{"prompt": PROMPT, "max_tokens": 200, "temperature": 0},
                {"prompt": [1] + ref[:4], "max_tokens": 200, "temperature": 0, "n": 2}]
    _, results = run_batch(serval, models, tmp_path, requests, "--max-num-batched-tokens", "16")
    assert results[0]["prompt_token_ids"] == [1] + ref[:4]
    assert results[0]["choices"][0]["token_ids"] == ref[4:204]
    assert [c["token_ids"] for c in results[1]["choices"]] == [ref[4:204]] * 2
    assert [c["index"] for c in results[1]["choices"]] == [0, 1]


def test_batch_invariant_mode_keeps_the_golden_ids(serval, models, tmp_path):
    # --batch-invariant (on the CPU here: fixed-order dot products for every
    # matmul row) changes no greedy token of the published output, batched
    # with chunked prefill, and says so at start-up.
    ref = reference_ids(models)
    requests = [{"prompt": PROMPT, "max_tokens": 200, "temperature": 0},
                {"prompt": "Lily and Ben", "max_tokens": 40, "temperature": 0},
                {"prompt": [1] + ref[:4], "max_tokens": 200, "temperature": 0}]
    proc, results = run_batch(serval, models, tmp_path, requests, "--batch-invariant",
                              "--max-num-batched-tokens", "16")
    assert "batch-invariant" in proc.stderr
    assert results[0]["choices"][0]["token_ids"] == ref[4:204]
    assert results[2]["choices"][0]["token_ids"] == ref[4:204]
    alone = single(serval, models, "Lily and Ben", 40)
    assert results[1]["choices"][0]["token_ids"] == alone["token_ids"]


def test_gemm_search_is_a_hint_the_cpu_ignores(serval, models, tmp_path):
    # --gemm-search (and its cache file) widens cuBLASLt's algorithm search on
    # a GPU; the CPU accepts both, computes exactly as before, writes nothing.
    ref = reference_ids(models)
    cache = tmp_path / "gemm-search.txt"
    _, results = run_batch(serval, models, tmp_path,
                           [{"prompt": PROMPT, "max_tokens": 64, "temperature": 0}], "--gemm-search",
                           "--gemm-search-cache", cache, "--device", "cpu")
    assert results[0]["choices"][0]["token_ids"] == ref[4:68]
    assert not cache.exists()


def test_n_samples_seeded_differ_and_reproduce(serval, models, tmp_path):
    req = {"prompt": PROMPT, "max_tokens": 32, "temperature": 1.0, "seed": 5, "n": 3}
    _, a = run_batch(serval, models, tmp_path, [req, req])
    ids = [c["token_ids"] for c in a[0]["choices"]]
    assert len(ids) == 3 and len({tuple(x) for x in ids}) == 3
    assert ids == [c["token_ids"] for c in a[1]["choices"]]
    assert a[0]["usage"]["completion_tokens"] == sum(len(x) for x in ids)
    # Sample i draws from seed + i.
    _, b = run_batch(serval, models, tmp_path, [dict(req, n=1, seed=6)])
    assert b[0]["choices"][0]["token_ids"] == ids[1]


def test_stop_strings_and_stop_token_ids(serval, models, tmp_path):
    full = single(serval, models, PROMPT, 40)
    stop = full["text"][20:26]
    requests = [{"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": stop},
                {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["zzz", stop]},
                {"prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                 "stop_token_ids": [full["token_ids"][5]]}]
    _, results = run_batch(serval, models, tmp_path, requests)
    for r in results[:2]:
        c = r["choices"][0]
        assert c["text"] == full["text"][: full["text"].find(stop)]
        assert c["finish_reason"] == "stop"
    c = results[2]["choices"][0]
    assert c["finish_reason"] == "stop"
    assert c["token_ids"] == full["token_ids"][: full["token_ids"].index(full["token_ids"][5]) + 1]


def test_min_tokens_ignore_eos_and_logprobs(serval, models, tmp_path):
    requests = [{"prompt": PROMPT, "max_tokens": 8, "min_tokens": 8, "temperature": 0,
                 "logprobs": 2},
                {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "temperature": 0}]
    _, results = run_batch(serval, models, tmp_path, requests)
    c = results[0]["choices"][0]
    assert len(c["token_ids"]) == 8
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 8
    assert all(len(t) <= 2 and v <= 0 for t in lp["top_logprobs"] for v in t.values())
    assert "logprobs" not in results[1]["choices"][0]
    assert len(results[1]["choices"][0]["token_ids"]) == 300


def test_small_kv_pool_preempts_with_equal_results_and_summary(serval, models, tmp_path):
    requests = [{"prompt": p, "max_tokens": 60, "temperature": 0, "n": 2} for p in PROMPTS]
    big, expected = run_batch(serval, models, tmp_path, requests)
    proc, results = run_batch(serval, models, tmp_path, requests, "--kv-cache-tokens", "160",
                              "--max-num-batched-tokens", "32")
    assert results == expected
    err = proc.stderr
    assert "KV cache: 160 tokens in 10 blocks of 16" in err
    assert re.search(r"requests: 5 \(10 samples, 0 failed\)", err), err
    completion = sum(r["usage"]["completion_tokens"] for r in results)
    assert re.search(rf"output tokens: {completion}, [0-9.]+ tokens/s", err), err
    assert re.search(r"TTFT ms p50/p90/p99: [0-9.]+ / [0-9.]+ / [0-9.]+", err), err
    assert re.search(r"TPOT ms p50/p90/p99: [0-9.]+ / [0-9.]+ / [0-9.]+", err), err
    assert re.search(r"prefix cache hit rate: [0-9.]+%", err), err
    preemptions = int(re.search(r"preemptions: (\d+)", err).group(1))
    assert preemptions > 0
    assert "preemptions: 0" in big.stderr


def test_async_scheduling_gives_the_results_of_steps_planned_one_at_a_time(serval, models, tmp_path):
    # Forced on (on the CPU its steps still run one after the other), each
    # step is planned while the one before is in flight, its decodes fed the
    # tokens that step samples: penalized rows (the fed token counted),
    # seeded n = 2, a stop string and min_tokens, more requests than seats and
    # prompts in chunks. Seeded draws under strong penalties: an uncounted fed
    # token would change the text.
    requests = [
        {"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 1.0, "seed": 7, "frequency_penalty": 2,
         "presence_penalty": 2},
        {"prompt": PROMPTS[1], "max_tokens": 40, "temperature": 1.0, "seed": 8, "repetition_penalty": 0.4},
        {"prompt": PROMPTS[2], "max_tokens": 40, "temperature": 0.8, "seed": 9, "n": 2,
         "frequency_penalty": -2},
        {"prompt": PROMPTS[3], "max_tokens": 30, "temperature": 0, "stop": "."},
        {"prompt": PROMPTS[4], "max_tokens": 12, "min_tokens": 12, "temperature": 0,
         "presence_penalty": -2},
    ]
    args = ("--max-num-seqs", "2", "--max-num-batched-tokens", "8")
    _, off = run_batch(serval, models, tmp_path, requests, *args, "--async-scheduling", "off")
    _, on = run_batch(serval, models, tmp_path, requests, *args, "--async-scheduling", "on")
    assert on == off
    plain = [{k: v for k, v in r.items() if "penalty" not in k} for r in requests]
    _, unpenalized = run_batch(serval, models, tmp_path, plain, *args)
    assert [r["choices"] for r in unpenalized] != [r["choices"] for r in off]


def test_shared_prefix_hits_the_prefix_cache(serval, models, tmp_path):
    long_prompt = "Once upon a time, there was a little girl named Lily. " * 8
    requests = [{"prompt": long_prompt + s, "max_tokens": 4, "temperature": 0}
                for s in ["She", "He", "They", "It"]]
    proc, results = run_batch(serval, models, tmp_path, requests, "--max-num-seqs", "1")
    rate = float(re.search(r"prefix cache hit rate: ([0-9.]+)%", proc.stderr).group(1))
    assert rate > 50
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results]
    assert cached[0] == 0
    assert all(c > 0 and c % 16 == 0 for c in cached[1:]), cached
    proc, _ = run_batch(serval, models, tmp_path, requests, "--max-num-seqs", "1",
                        "--no-prefix-cache")
    assert "prefix cache hit rate: 0.0%" in proc.stderr


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "hi", "temperature": "hot"}', 'line 2: field "temperature": expected a number'),
    ('{"prompt": "hi", "max_tokenz": 5}', 'line 2: field "max_tokenz" is not supported'),
    ('{"prompt": ["a", "b"]}', 'line 2: field "prompt": expected a string or a list of token ids'),
    ('{"max_tokens": 5}', 'line 2: field "prompt" is missing'),
    ('{"prompt": "hi", "top_p": 1.5}', "line 2: top_p must be in [0, 1], got 1.5"),
    ('{"prompt": "hi", "n": 0}', 'line 2: field "n": must be at least 1'),
    ('{"prompt": "hi", "stop": 3}', 'line 2: field "stop": expected a string or a list of strings'),
    ('{"prompt": "hi"', "line 2: not valid JSON"),
    ('{"prompt": "hi", "max_tokens": 100000}', "line 2: "),
    ('{"prompt": [1, 100000]}', "line 2: prompt token id 100000 is outside the vocabulary"),
])
def test_bad_lines_are_named_and_nothing_runs(serval, models, tmp_path, line, message):
    proc, results = run_batch(serval, models, tmp_path, ['{"prompt": "ok"}', line, ""],
                              check=False)
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr
    assert "nothing was run" in proc.stderr
    assert results == []


def test_every_bad_line_is_listed(serval, models, tmp_path):
    proc, _ = run_batch(serval, models, tmp_path,
                        ['{"prompt": 1}', '{"prompt": "ok"}', '{"prompt": "x", "seed": -1}'],
                        check=False)
    assert proc.returncode == 1
    assert "2 bad request lines" in proc.stderr
    assert "line 1:" in proc.stderr and "line 3:" in proc.stderr


def test_batch_mode_needs_both_files(serval, models, tmp_path):
    proc = run_serval(serval, "generate", "--model", stories(models), "--input",
                      tmp_path / "x.jsonl", check=False)
    assert proc.returncode == 1 and "--output" in proc.stderr


def test_memory_fraction_plans_the_pool(serval, models):
    proc = run_serval(serval, "generate", "--model", stories(models), "--prompt", PROMPT,
                      "--max-tokens", "4", "--kv-cache-memory-fraction", "0.01")
    m = re.search(r"KV cache: (\d+) tokens in (\d+) blocks of 16 \(([0-9.]+) GiB, f32\), ([0-9.]+) "
                  r"sequences of the model's context length \((\d+) tokens\)", proc.stderr)
    assert m, proc.stderr
    tokens, blocks, ctx = int(m.group(1)), int(m.group(2)), int(m.group(5))
    assert tokens == 16 * blocks and tokens > 0
    assert float(m.group(4)) == pytest.approx(tokens / ctx, abs=0.1)
    bad = run_serval(serval, "generate", "--model", stories(models), "--prompt", PROMPT,
                     "--kv-cache-memory-fraction", "1.5", check=False)
    assert bad.returncode == 1 and "fraction" in bad.stderr
