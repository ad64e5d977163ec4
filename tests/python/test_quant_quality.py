"""scripts/quant-quality.py in a tiny mode on stories260K (base f32, q8_0 and q4_0, a few
chunks, 12 story items): the base compared with itself has KL 0 and top-1 100%, its perplexity
is that of a direct `serval perplexity` run, q4_0 differs from it, the table and the JSON say
the same, and the story accuracy is what lm-eval reports when it is run directly against
`serval serve` on the same task."""
import importlib.util
import json
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval[api], what local-completions needs
pytest.importorskip("gguf")

from conftest import run_serval  # noqa: E402
from serval_server import ServalServer  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "quant-quality.py"
CTX, CHUNKS, ITEMS = 128, 3, 12


def load_script():
    spec = importlib.util.spec_from_file_location("quant_quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def harness(tmp_path_factory, serval, models):
    work = tmp_path_factory.mktemp("quant-quality")
    stories = models.parent / "data" / "tinystories-valid-part1.txt"
    base = models / "stories260K" / "stories260K.gguf"
    out = work / "report.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--base", base, "--types", "q8_0 q4_0", "--serval", serval,
                           "--work", work, "--stories", stories, "--ctx", str(CTX), "--chunks", str(CHUNKS),
                           "--items", str(ITEMS), "--threads", "1", "--json", out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout, work, base, stories


def rows(report):
    return {r["type"]: r for r in report["rows"]}


def test_base_against_itself(harness):
    report, *_ = harness
    base = rows(report)["base f32"]["perplexity"]["tinystories"]
    # The saved log-probs are f32: the base against them is 0 up to that rounding (6e-9 measured).
    assert base["kl_mean"] < 1e-7
    assert base["same_top1_pct"] == 100.0
    assert base["ppl_delta_pct"] == 0.0


def test_base_perplexity_is_serval_perplexity(harness, serval):
    report, _, _, base, stories = harness
    direct = json.loads(run_serval(serval, "perplexity", "--model", base, "--file", stories, "--ctx", CTX,
                                   "--chunks", CHUNKS, "--threads", 1, "--json").stdout.strip().splitlines()[-1])
    got = rows(report)["base f32"]["perplexity"]["tinystories"]
    assert got["perplexity"] == pytest.approx(direct["perplexity"], rel=1e-12)
    assert got["scored"] == direct["scored"] > 0


def test_quantized_rows_differ_from_the_base(harness):
    report, *_ = harness
    r = rows(report)
    q4, q8 = r["q4_0"], r["q8_0"]
    assert q4["quantize_args"] == ["--to", "q4_0"]
    assert q4["perplexity"]["tinystories"]["kl_mean"] > q8["perplexity"]["tinystories"]["kl_mean"] > 0
    assert q4["perplexity"]["tinystories"]["same_top1_pct"] < 100
    # stories260K's 172-wide FFN stays f16 (quantize's fallback), the rest is in blocks.
    assert q4["info"]["formats"]["q4_0"] > 0 and q4["info"]["formats"]["f16"] > 0
    assert r["base f32"]["info"]["bits_per_weight"] == 32.0
    assert q4["info"]["bits_per_weight"] < q8["info"]["bits_per_weight"] < 16


def test_table_and_json_agree(harness):
    report, stdout, *_ = harness
    lines = [ln for ln in stdout.splitlines() if ln.startswith("| ")]
    assert "\n".join(lines[:1] + stdout.splitlines()[1:len(lines) + 1]) == report["table"]
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]
    assert [c[0] for c in body] == [r["type"] for r in report["rows"]] == ["base f32", "q8_0", "q4_0"]
    # stories260K's 172-wide ffn_down stays f16 (5 x 172 x 64 = 55,040 of its 292,096 matrix weights).
    assert [c[1] for c in body] == ["f32", "q8_0 81% f16 19%", "q4_0 81% f16 19%"]
    for cells, row in zip(body, report["rows"]):
        p = row["perplexity"]["tinystories"]
        assert cells[2] == f"{row['info']['bits_per_weight']:.2f}"
        assert cells[3].startswith(f"{p['perplexity']:.4f} ")
        assert float(cells[5]) == pytest.approx(p["same_top1_pct"], abs=0.005)
        assert cells[6].startswith(f"{100 * row['story']['acc']:.1f} ")
        assert cells[-1] == row["verdict"]


def test_story_accuracy_is_what_lm_eval_reports(harness, serval):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    report, _, work, _, _ = harness
    row = rows(report)["q4_0"]
    tokenizer = next(work.glob("*-tokenizer"))
    server = ServalServer(serval, row["model"])
    try:
        res = simple_evaluate(model="local-completions",
                              model_args=f"model=test-model,base_url={server.url}/v1/completions,"
                                         f"tokenizer_backend=huggingface,tokenizer={tokenizer},"
                                         "tokenized_requests=True,num_concurrent=1,max_retries=1",
                              tasks=["serval_story_choice"],
                              task_manager=TaskManager(include_path=str(work / f"story-choice-{ITEMS}")),
                              batch_size=4)
    finally:
        server.stop()
    want = res["results"]["serval_story_choice"]
    assert row["story"]["items"] == ITEMS
    assert row["story"]["acc"] == want["acc,none"]
    assert row["story"]["acc_norm"] == want["acc_norm,none"]
    assert row["story_delta_points"] == pytest.approx(100 * (row["story"]["acc"] - rows(report)["base f32"]["story"]["acc"]))


def test_type_names_and_bars():
    mod = load_script()
    assert mod.QuantType("q4_k").quantize_args() == ["--to", "q4_k"]
    int4 = mod.QuantType("int4:g128")
    assert int4.quantize_args() == ["--to", "int4", "--group-size", "128"]
    assert int4.file_stem() == "int4-g128" and int4.ppl_bar() is None  # the int4 bar is for calibrated files
    with pytest.raises(SystemExit, match="calibrates: give the text with --calibration"):
        mod.QuantType("int4:g128:cal")
    mod.QuantType.calibration = "cal.txt"
    try:
        cal = mod.QuantType("int4:g128:cal")
        assert cal.quantize_args() == ["--to", "int4", "--group-size", "128", "--calibration", "cal.txt",
                                       "--threads", "2"]
        assert cal.file_stem() == "int4-g128-cal" and cal.ppl_bar() == (4.0, 90.0)
        assert mod.QuantType("int8:cal").ppl_bar() == (0.5, 98.0)
    finally:
        mod.QuantType.calibration = None
    assert mod.QuantType("int8").ppl_bar() == (0.5, 98.0) and mod.QuantType("fp8").ppl_bar() == (1.0, 97.0)
    assert mod.QuantType("int4:g64").ppl_bar() is None and mod.QuantType("q8_0").ppl_bar() is None
    with pytest.raises(SystemExit, match="unknown option 'x7'"):
        mod.QuantType("int4:x7")
    row = {"perplexity": {"wiki": {"ppl_delta_pct": 0.7, "same_top1_pct": 99.0}}, "story": {"acc": 0.48},
           "story_delta_points": -2.0}
    got = mod.verdict(mod.QuantType("int8"), row, {"story": {"acc": 0.5}})
    assert got == "FAIL: ppl wiki +0.70% > +0.5%; story -2.0 pts"
