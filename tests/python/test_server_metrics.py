"""/metrics as Prometheus and vLLM's clients read it: well-formed text format 0.0.4, the
KV block gauges adding up from the first scrape, and vLLM's names (vllm:X for serval:X):
the gauges routers read always, every metric with a vLLM equivalent with
--metrics-compat vllm."""
import re
import urllib.request

import pytest

from serval_server import ServalServer

MODEL = ("stories260K", "stories260K.gguf")
GATEWAY = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "cache_config_info"]
OTHERS = ["prefix_cache_queries_total", "prefix_cache_hits_total", "num_preemptions_total", "prompt_tokens_total",
          "generation_tokens_total", "request_success_total", "request_prompt_tokens", "request_generation_tokens",
          "iteration_tokens_total", "request_max_num_generation_tokens", "request_params_n",
          "request_params_max_tokens", "time_to_first_token_seconds", "time_per_output_token_seconds",
          "inter_token_latency_seconds", "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
          "request_queue_time_seconds", "request_inference_time_seconds", "request_prefill_time_seconds",
          "request_decode_time_seconds", "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
          "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total"]

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf'^({NAME})(?:\{{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\}})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """Prometheus text format 0.0.4 -> {family: {"type", "help", "samples": [(name, labels, value)]}};
    asserts every sample belongs to the family TYPE'd just before it."""
    families, current = {}, None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"{name} exposed twice"
            current = families[name] = {"help": help_text, "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert current is families.get(name) and kind in ("counter", "gauge", "histogram"), line
            current["type"] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"malformed sample line: {line!r}"
            name, labels, value = m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))
            family = next(f for f, d in families.items() if d is current)
            suffixes = ("_bucket", "_sum", "_count") if current["type"] == "histogram" else ("",)
            assert any(name == family + s for s in suffixes), f"{name} under {family}"
            current["samples"].append((name, labels, value))
    return families


def scrape(server):
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse_exposition(r.read().decode())


def value(families, family, sample=None, **labels):
    for name, l, v in families[family]["samples"]:
        if name == (sample or family) and all(l.get(k) == w for k, w in labels.items()):
            return v
    raise KeyError(f"{family} {sample} {labels}")


def test_kv_block_gauges_add_up_from_the_first_scrape(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL), "--kv-cache-tokens", "4096", "--block-size", "16")
    try:
        m = scrape(s)  # no request has run: no engine step yet
        (_, info, one), = m["serval:cache_config_info"]["samples"]
        assert one == 1.0 and info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
        total = int(info["num_gpu_blocks"])
        assert total == 4096 // 16
        free, used, cached = (value(m, f"serval:kv_cache_blocks_{k}") for k in ("free", "used", "cached"))
        assert (free, used, cached) == (total, 0, 0)
        assert value(m, "serval:kv_cache_usage_perc") == 0.0
        assert s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})[0] == 200
        m = scrape(s)
        assert sum(value(m, f"serval:kv_cache_blocks_{k}") for k in ("free", "used", "cached")) == total
    finally:
        s.stop()


def test_the_gateway_gauges_have_vllm_names_by_default(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL))
    try:
        m = scrape(s)
        assert sorted(f for f in m if f.startswith("vllm:")) == sorted("vllm:" + n for n in GATEWAY)
        for n in GATEWAY:
            assert m["vllm:" + n]["type"] == m["serval:" + n]["type"] == "gauge"
            assert m["vllm:" + n]["samples"] == [(x.replace("serval:", "vllm:", 1), l, v)
                                                 for x, l, v in m["serval:" + n]["samples"]]
        (_, info, _), = m["vllm:cache_config_info"]["samples"]
        assert {"block_size", "num_gpu_blocks", "model_name"} <= set(info)
    finally:
        s.stop()


def test_metrics_compat_vllm_names_every_vllm_metric(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL), "--metrics-compat", "vllm")
    try:
        for _ in range(2):
            assert s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "n": 2})[0] == 200
        m = scrape(s)
        assert sorted(f for f in m if f.startswith("vllm:")) == sorted("vllm:" + n for n in GATEWAY + OTHERS)
        # Serval-only gauges have no vLLM name.
        assert not any(f.startswith("vllm:kv_cache_blocks") for f in m)
        for n in GATEWAY + OTHERS:
            ours, theirs = m["serval:" + n], m["vllm:" + n]
            assert (theirs["type"], theirs["help"]) == (ours["type"], ours["help"])
            assert theirs["samples"] == [(x.replace("serval:", "vllm:", 1), l, v) for x, l, v in ours["samples"]]
        assert value(m, "vllm:prompt_tokens_total") > 0
        assert value(m, "vllm:request_success_total", finished_reason="length") == 4
        assert value(m, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 4
        assert value(m, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 4
    finally:
        s.stop()


def test_metrics_compat_takes_only_known_values(serval, models):
    from conftest import run_serval
    proc = run_serval(serval, "serve", "--model", models.joinpath(*MODEL), "--metrics-compat", "prometheus",
                      check=False, timeout=60)
    assert proc.returncode != 0 and "metrics-compat" in proc.stderr


def test_structured_output_masks_are_counted_with_their_time(serval, models):
    s = ServalServer(serval, models.joinpath(*MODEL))
    try:
        m = scrape(s)
        assert value(m, "serval:structured_output_masks_total") == 0
        body = {"prompt": "Once upon a time", "max_tokens": 8, "guided_choice": ["yes", "no"], "n": 2}
        status, _, reply = s.post("/v1/completions", body)
        assert status == 200, reply
        m = scrape(s)
        # One mask per constrained token drawn: each sample draws at least one, then EOS.
        masks = value(m, "serval:structured_output_masks_total")
        assert masks >= 4
        assert value(m, "serval:structured_output_mask_seconds_total") > 0
        assert "vllm:structured_output_masks_total" not in m
    finally:
        s.stop()
