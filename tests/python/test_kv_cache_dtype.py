"""--kv-cache-dtype on stories260K: fp8 and int8 pools hold 4x the tokens of
f32 in the same memory (the start-up plan and `serval info` say so), the
start-up log says where the scales came from, and an unknown type is refused
naming the flag and the accepted values."""
import re

from conftest import run_serval


def stories(models):
    return models / "stories260K" / "stories260K.gguf"


def plan(stderr):
    m = re.search(r"KV cache: (\d+) tokens in \d+ blocks of 16 \(([0-9.]+) GiB, (\w+)\)", stderr)
    assert m, stderr
    return int(m.group(1)), m.group(3)


def test_quantized_pools_hold_four_times_the_tokens(serval, models):
    args = ["generate", "--model", stories(models), "--prompt", "Once upon a time", "--max-tokens", "8",
            "--temperature", "0", "--kv-cache-memory-fraction", "0.002"]
    base = run_serval(serval, *args)
    tokens, dtype = plan(base.stderr)
    assert dtype == "f32"
    for kv, name in (("fp8", "fp8_e4m3"), ("int8", "i8")):
        proc = run_serval(serval, *args, "--kv-cache-dtype", kv)
        q_tokens, q_dtype = plan(proc.stderr)
        assert q_dtype == name
        # The same fraction of the memory available, which moves a little between runs.
        assert abs(q_tokens / tokens - 4) < 0.2, (tokens, q_tokens)
        assert f"KV cache in {name}, scales per (layer, KV head)" in proc.stderr
        assert "calibrated at start-up on 512 tokens of built-in text" in proc.stderr
        assert proc.stdout.strip()


def test_info_shows_the_kv_bytes_of_the_type(serval, models):
    def per_token(kv):
        out = run_serval(serval, "info", "--model", stories(models), "--kv-cache-dtype", kv).stdout
        return re.search(r"KV per token +([0-9.]+ \w+) in", out).group(1)
    assert per_token("f32") == "1.25 KiB"
    assert per_token("fp8") == "320 B"
    assert per_token("int8") == "320 B"


def test_unknown_kv_cache_dtype_is_refused(serval, models):
    proc = run_serval(serval, "generate", "--model", stories(models), "--prompt", "x", "--kv-cache-dtype", "int4",
                      check=False)
    assert proc.returncode == 1
    assert '--kv-cache-dtype must be auto, fp8 or int8, got "int4"' in proc.stderr
