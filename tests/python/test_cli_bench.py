"""`serval bench` on the CPU with stories260K: each mode (runner, engine, sweep,
attention) at tiny sizes prints well-formed JSON with its documented keys and
positive figures, a readable table without --json, and bad arguments fail
with a message naming the problem."""
import json

import pytest

from conftest import run_serval


def stories(models):
    return models / "stories260K" / "stories260K.gguf"


def bench_json(serval, *args):
    proc = run_serval(serval, "bench", "--device", "cpu", "--threads", "1", "--json", *args)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def assert_positive(point, keys):
    for k in keys:
        assert isinstance(point[k], (int, float)) and point[k] > 0, (k, point[k])


def test_runner_mode_keeps_its_keys(serval, models):
    (p,) = bench_json(serval, "--model", stories(models), "--requests", 3, "--input-len", 20,
                      "--output-len", 6, "--max-batch-tokens", 32)
    assert p["mode"] == "runner" and p["device"] == "cpu"
    assert (p["requests"], p["input_len"], p["output_len"]) == (3, 20, 6)
    assert p["prefill_steps"] == 2  # 60 prompt tokens in steps of at most 32
    assert p["decode_steps"] == 5
    assert_positive(p, ["load_s", "prefill_s", "prefill_tokens_per_s", "prefill_mfu", "decode_s",
                        "decode_step_ms", "decode_tokens_per_s", "decode_roofline_fraction",
                        "decode_op_limit_fraction", "total_tokens_per_s", "bandwidth_gbs", "peak_tflops"])
    assert p["decode_roofline_fraction"] < 1 and p["prefill_mfu"] < 1
    # Op by op the floor is at least the bytes' alone.
    assert p["decode_roofline_fraction"] <= p["decode_op_limit_fraction"] < 1


def test_runner_mode_repeats_reports_the_median_run_and_the_range(serval, models):
    (one,) = bench_json(serval, "--model", stories(models), "--requests", 2, "--input-len", 8,
                        "--output-len", 4)
    assert "repeats" not in one and "decode_tokens_per_s_min" not in one
    (p,) = bench_json(serval, "--model", stories(models), "--requests", 2, "--input-len", 8,
                      "--output-len", 4, "--repeats", 3)
    assert p["repeats"] == 3 and p["decode_steps"] == 3
    for name in ("prefill", "decode"):
        lo, mid, hi = (p[f"{name}_tokens_per_s{k}"] for k in ("_min", "", "_max"))
        assert 0 < lo <= mid <= hi, (name, lo, mid, hi)  # the median run is one of the runs
    out = run_serval(serval, "bench", "--device", "cpu", "--model", stories(models), "--requests", 2,
                     "--input-len", 8, "--output-len", 4, "--repeats", 2).stdout
    assert "the median of 2 passes; their range:" in out


def test_runner_mode_table(serval, models):
    out = run_serval(serval, "bench", "--device", "cpu", "--model", stories(models), "--requests", 2,
                     "--input-len", 8, "--output-len", 4).stdout
    assert "prefill:" in out and "decode:" in out and "roofline" in out


ENGINE_KEYS = ["requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "duration_s",
               "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
               "itl_ms_p99", "mean_running_batch", "steps", "mean_step_ms", "decode_steps",
               "decode_step_ms", "decode_roofline_fraction", "step_roofline_fraction",
               "decode_op_limit_fraction", "step_op_limit_fraction", "kv_cache_tokens"]


def test_engine_mode_random_requests(serval, models):
    (p,) = bench_json(serval, "--mode", "engine", "--model", stories(models), "--requests", 6,
                      "--input-len", 24, "--output-len", 10, "--max-num-seqs", 4,
                      "--kv-cache-tokens", 512)
    assert p["mode"] == "engine"
    assert p["requests"] == 6 and p["failed"] == 0
    assert p["prompt_tokens"] == 6 * 24 and p["output_tokens"] == 6 * 10  # ignore_eos
    assert p["warmup_requests"] == 4  # min(requests, max-num-seqs)
    assert p["warmup_prompt_lens"] == [33]  # contexts up to 34: the first class of decode graphs
    assert_positive(p, ENGINE_KEYS)
    assert 1 <= p["mean_running_batch"] <= 4
    assert p["kv_cache_tokens"] == 512 and p["preemptions"] >= 0
    assert p["ttft_ms_p50"] <= p["ttft_ms_p99"]
    # 60 tokens, at most 4 per step: at least 15 steps, and the first of each request
    # comes from a prefill step.
    assert p["steps"] >= 15 and p["decode_steps"] < p["steps"]
    # The op-by-op floor sums each op's max(bytes, FLOPs): never below the step's max.
    assert p["step_roofline_fraction"] <= p["step_op_limit_fraction"] < 1
    assert p["decode_roofline_fraction"] <= p["decode_op_limit_fraction"] < 1
    # A step's host time split three ways (on the CPU the step runs inside
    # start_sample, so there is nothing to wait for), and the gaps between steps.
    parts = [p["host_start_ms"], p["host_under_device_ms"], p["host_wait_ms"]]
    assert min(parts) >= 0 and p["host_start_ms"] > p["host_wait_ms"]
    assert sum(parts) == pytest.approx(p["mean_step_ms"], rel=1e-6)
    # (gaps lie inside the measured run: their mean is under its wall time over steps - 1)
    assert 0 < p["host_between_steps_ms"] < p["duration_s"] * 1e3 / (p["steps"] - 1)
    assert p["pipelined_steps"] == 0  # no async scheduling on the CPU


def test_engine_mode_async_scheduling_on_the_cpu(serval, models):
    # Forced on, the CPU engine plans each step while the one before is in
    # flight (its steps still run one after the other): continuations admit
    # the 8 requests past the 3 seats and chunk 40-token prompts at a
    # 16-token budget.
    args = ["--mode", "engine", "--model", stories(models), "--requests", 8, "--input-len", 40,
            "--output-len", 12, "--max-num-seqs", 3, "--max-num-batched-tokens", 16,
            "--kv-cache-tokens", 512]
    (on,) = bench_json(serval, *args, "--async-scheduling", "on")
    (off,) = bench_json(serval, *args)
    assert on["async_scheduling"] is True and off["async_scheduling"] is False
    assert on["failed"] == 0 and on["output_tokens"] == off["output_tokens"] == 8 * 12
    assert off["pipelined_steps"] == 0
    assert on["pipelined_steps"] > on["steps"] // 2, on
    # A CPU step runs inside its start: it has ended before the next is queued.
    assert on["pipelined_after_end_steps"] == on["pipelined_steps"]
    assert off["pipelined_after_end_steps"] == 0


def test_engine_mode_warms_up_each_class_of_context_the_run_reaches(serval, models):
    # Contexts up to 130 + 6: decode graphs for bounds 128 and 1024 (StepGraphs::class_starts).
    (p,) = bench_json(serval, "--mode", "engine", "--model", stories(models), "--requests", 3,
                      "--input-len", 130, "--output-len", 6)
    assert p["warmup_prompt_lens"] == [33, 129] and p["failed"] == 0
    assert p["graphs_captured_in_run"] == 0


def test_engine_mode_warm_up_runs_a_step_of_the_whole_token_budget(serval, models):
    # A prompt fits the context (64), the budget (160) does not: the warm-up
    # sends prompts of 63 tokens until the scheduler can fill one step with
    # them (63 + 63 + a chunk of 34). Without that step, the run's first full
    # step would grow buffers sized by step tokens (on a GPU: dropping every
    # decode graph recorded in the warm-up).
    (p,) = bench_json(serval, "--mode", "engine", "--model", stories(models), "--requests", 3,
                      "--input-len", 40, "--output-len", 4, "--max-model-len", 64,
                      "--max-num-batched-tokens", 160)
    assert p["failed"] == 0 and p["warmup_max_step_tokens"] == 160


def test_engine_mode_jsonl_input(serval, models, tmp_path):
    inp = tmp_path / "requests.jsonl"
    lines = [{"prompt": "Once upon a time", "max_tokens": 9},
             {"prompt": [1, 403, 407, 261], "max_tokens": 5, "temperature": 0.7, "seed": 3},
             {"prompt": "Lily and Ben"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (p,) = bench_json(serval, "--mode", "engine", "--model", stories(models), "--input", inp,
                      "--output-len", 7, "--warmup-requests", 0)
    assert p["requests"] == 3 and p["failed"] == 0 and p["warmup_requests"] == 0
    assert p["output_tokens"] == 9 + 5 + 7  # the lines' max_tokens, else --output-len
    assert p["input_len"] is None and p["input"] == str(inp)
    assert_positive(p, ["requests_per_s", "output_tokens_per_s", "steps", "ttft_ms_p50"])


def test_sweep_mode_points_and_aliasing(serval, models):
    points = bench_json(serval, "--mode", "sweep", "--model", stories(models), "--batch-sizes", "1,4",
                        "--context-lens", "16,80", "--steps", 3, "--warmup-steps", 1,
                        "--kv-cache-tokens", 160)
    assert [(p["batch"], p["context_len"]) for p in points] == [(1, 16), (1, 80), (4, 16), (4, 80)]
    for p in points:
        assert p["mode"] == "sweep" and p["steps"] == 3
        assert_positive(p, ["step_ms", "tokens_per_s", "weight_bytes", "kv_bytes_per_step",
                            "bytes_per_step", "roofline_ms", "roofline_fraction", "flops_per_step",
                            "flop_fraction", "op_limit_ms", "op_limit_fraction", "kv_blocks", "aliased"])
        assert p["bytes_per_step"] == pytest.approx(p["weight_bytes"] + p["kv_bytes_per_step"])
        # Op by op: matmuls then attention, each at its max(bytes, FLOPs).
        bw, peak = p["bandwidth_gbs"] * 1e9, p["peak_tflops"] * 1e12
        assert p["op_limit_ms"] >= p["roofline_ms"]
        assert p["op_limit_ms"] <= (p["bytes_per_step"] / bw + p["flops_per_step"] / peak) * 1e3 * (1 + 1e-9)
        # stories260K at 4 sequences is bound by bytes in every op: the two limits agree.
        assert p["op_limit_ms"] == pytest.approx(p["roofline_ms"])
        assert p["tokens_per_s"] == pytest.approx(p["batch"] / (p["step_ms"] / 1e3))
    # 4 x 80 tokens = 20 blocks of 16 but the pool has 10: shared blocks, said so.
    assert points[3]["aliased"] == pytest.approx(2.0) and points[3]["kv_blocks"] == 10
    assert all(p["aliased"] == 1.0 for p in points[:3])
    # More context, more K/V read per step.
    assert points[1]["kv_bytes_per_step"] == 5 * points[0]["kv_bytes_per_step"]


def test_sweep_mode_table_says_aliased(serval, models):
    proc = run_serval(serval, "bench", "--mode", "sweep", "--device", "cpu", "--model", stories(models),
                      "--batch-sizes", "2", "--context-lens", "64", "--steps", 2,
                      "--kv-cache-tokens", 64)
    header = proc.stdout.splitlines()[0]
    assert "step ms" in header and "roofline %" in header and "aliased x" in header
    assert "share physical blocks" in proc.stderr


def test_attention_mode(serval, models):
    points = bench_json(serval, "--mode", "attention", "--batch-sizes", "1,3", "--context-lens", "40",
                        "--heads", 4, "--kv-heads", 2, "--head-dim", 16, "--iters", 3, "--repeats", 2)
    assert [(p["batch"], p["context_len"]) for p in points] == [(1, 40), (3, 40)]
    for p in points:
        assert (p["heads"], p["kv_heads"], p["head_dim"]) == (4, 2, 16)
        assert_positive(p, ["us_per_call", "kv_bytes", "kv_gbs", "bandwidth_fraction", "kv_layers"])
        # K and V of every token of every sequence, f32 on the CPU.
        assert p["kv_bytes"] == p["batch"] * 40 * 2 * 16 * 4 * 2
        assert p["kv_gbs"] == pytest.approx(p["kv_bytes"] / (p["us_per_call"] * 1e3))


def test_attention_mode_takes_the_shape_from_the_model(serval, models):
    (p,) = bench_json(serval, "--mode", "attention", "--model", stories(models), "--batch-sizes", "2",
                      "--context-lens", "100", "--iters", 2, "--repeats", 1)
    assert (p["heads"], p["kv_heads"], p["head_dim"]) == (8, 4, 8)


@pytest.mark.parametrize("args,message", [
    (["--mode", "sweep", "--context-lens", "4096"], "--context-lens 4096 exceeds the model's context of 2048"),
    (["--mode", "sweep", "--batch-sizes", "4,0"], "--batch-sizes must hold positive numbers, got 0"),
    (["--mode", "attention", "--context-lens", "3000"], "--context-lens 3000 exceeds the model's context"),
    (["--mode", "engine", "--input-len", "2000", "--output-len", "100"], "exceeds the model's context"),
    (["--input-len", "0"], "must be positive"),
    (["--mode", "sweep", "--requests", "3"], "--requests does not apply to --mode sweep"),
    (["--mode", "runner", "--kv-cache-tokens", "64"], "--kv-cache-tokens does not apply to --mode runner"),
    (["--mode", "attention", "--gemm-search"], "--gemm-search does not apply to --mode attention"),
    (["--mode", "engine", "--input", "/nonexistent/requests.jsonl"], "cannot open --input"),
    (["--mode", "engine", "--requests", "2", "--input-len", "100", "--output-len", "100",
      "--kv-cache-tokens", "64"], "need 13 KV blocks"),
    (["--mode", "sweep", "--steps", "0"], "--steps must be positive"),
    (["--repeats", "0"], "--repeats must be positive"),
    (["--mode", "engine", "--repeats", "2"], "--repeats does not apply to --mode engine"),
    (["--mode", "bogus"], "bogus not in"),
    (["--mode", "engine", "--async-scheduling", "maybe"], "maybe not in"),
    (["--mode", "engine", "--async-scheduling", "on", "--no-async-scheduling"],
     "--no-async-scheduling contradicts --async-scheduling on"),
    (["--mode", "runner", "--async-scheduling", "on"], "--async-scheduling does not apply to --mode runner"),
])
def test_bad_arguments_name_the_problem(serval, models, args, message):
    proc = run_serval(serval, "bench", "--device", "cpu", "--model", stories(models), *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_bad_attention_shape_and_missing_model(serval):
    proc = run_serval(serval, "bench", "--mode", "attention", "--device", "cpu", "--heads", 6,
                      "--kv-heads", 4, check=False)
    assert proc.returncode != 0 and "not a multiple of --kv-heads 4" in proc.stderr
    proc = run_serval(serval, "bench", "--mode", "sweep", "--device", "cpu", check=False)
    assert proc.returncode != 0 and "--mode sweep needs --model" in proc.stderr
