#!/usr/bin/env python3
"""Quality of Serval's quantized formats against their unquantized base (issue 52).

For the base and each type (`serval quantize BASE --to T`): perplexity on each text
(`serval perplexity`, llama.cpp's method), mean KL divergence and same-top-1 % against the
base's saved log-probabilities, and the accuracy of a multiple-choice story-completion task
(scripts/build_story_choice.py) that lm-eval's `local-completions` runs against a
`serval serve` this script starts and stops. Prints one markdown table and writes a JSON file.

Types: a `serval quantize --to` name, with options after colons: `int4:g128:cal` is
`--to int4 --group-size 128 --calibration TEXT` (TEXT from --calibration). Bars (issue 52): int8
ppl +0.5% / top-1 >= 98%, fp8 +1% / 97%, int4 g128 calibrated +4% / 90%; every type: story accuracy within 1.5 points of the base.

  quant-quality.py --smollm2 --serval build-cpu/serval --work /tmp/qq --types "q8_0 q4_k" \\
      --wikitext ../shared/data/wikitext-2-test.raw --stories ../shared/data/tinystories-valid-part1.txt
"""
import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import build_story_choice  # noqa: E402

SMOLLM2_DIR = pathlib.Path.home() / ".cache" / "serval" / "models" / "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TASK = "serval_story_choice"
# (format, group size or None) -> (max perplexity increase %, min same-top-1 %); issue 52.
# (name, group, calibrated): the int4 bar is for a calibrated file; int8's and fp8's hold either way.
PPL_BARS = {("int8", None): (0.5, 98.0), ("fp8", None): (1.0, 97.0), ("int4", 128, True): (4.0, 90.0)}
STORY_BAR_POINTS = 1.5
CHANCE = 0.25
ABOVE_CHANCE_POINTS = 10.0  # "well above chance": at least this many points over 25%


def log(msg):
    print(f"[quant-quality {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class QuantType:
    """`q4_k`, `int8`, `int4:g128` (-> --group-size 128), `int4:g128:cal` (-> --calibration TEXT)."""

    calibration = None  # --calibration: the text `cal` types calibrate on
    threads = 2

    def __init__(self, spec):
        self.spec = spec
        self.name, *opts = spec.split(":")
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise SystemExit(f"--types: {spec!r}: the format name {self.name!r} is not a quantize --to name")
        self.group = None
        self.cal = False
        for o in opts:
            if re.fullmatch(r"g[0-9]+", o):
                self.group = int(o[1:])
            elif o == "cal":
                self.cal = True
            else:
                raise SystemExit(f"--types: {spec!r}: unknown option {o!r} (known: gN, --group-size N; "
                                 "cal, --calibration)")
        if self.cal and not QuantType.calibration:
            raise SystemExit(f"--types: {spec!r} calibrates: give the text with --calibration")

    def quantize_args(self):
        return (["--to", self.name] + (["--group-size", str(self.group)] if self.group else [])
                + (["--calibration", str(QuantType.calibration), "--threads", str(QuantType.threads)]
                   if self.cal else []))

    def file_stem(self):
        return self.spec.replace(":", "-")

    def ppl_bar(self):
        return PPL_BARS.get((self.name, self.group)) or PPL_BARS.get((self.name, self.group, self.cal))


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-4000:]}")
    return proc.stdout


# ---- models -------------------------------------------------------------------------------

def prepare_smollm2(serval, work):
    """SmolLM2-135M's Q4_1 GGUF dequantized to f16 by transformers, converted to an f16 GGUF."""
    hf = work / "smollm2-f16-hf"
    gguf = work / "smollm2-f16.gguf"
    if not (hf / "config.json").exists():
        log(f"dequantizing {SMOLLM2_DIR / SMOLLM2_GGUF} to f16 with transformers -> {hf}")
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        # dequantize=True: transformers 5 would otherwise keep the blocks packed (and refuse to
        # save); 4.x has no GgufConfig and always dequantizes.
        extra = ({"quantization_config": transformers.GgufConfig(dequantize=True)}
                 if hasattr(transformers, "GgufConfig") else {})
        model = AutoModelForCausalLM.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_GGUF, dtype=torch.float16, **extra)
        tok = AutoTokenizer.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_GGUF)
        model.save_pretrained(hf)
        tok.save_pretrained(hf)
    if not gguf.exists():
        run([serval, "convert", hf, "-o", gguf])
    return gguf, hf


def base_gguf(serval, base, work):
    """quantize reads GGUF: a Hugging Face folder is converted first (cached in the work dir)."""
    base = pathlib.Path(base)
    if base.is_file():
        return base
    out = work / f"{base.name}-base.gguf"
    if not out.exists():
        run([serval, "convert", base, "-o", out])
    return out


def hf_tokenizer_folder(base, gguf, work):
    """A Hugging Face tokenizer for lm-eval: the base folder's own, or the one transformers reads
    from the GGUF. llama2.c's GGUFs store an unset pad token as id 0xFFFFFFFF, which that reader
    indexes the vocabulary with: such a token is left out."""
    base = pathlib.Path(base)
    if base.is_dir() and any((base / f).exists() for f in ("tokenizer.json", "tokenizer.model")):
        return base
    out = work / f"{gguf.stem}-tokenizer"
    if (out / "tokenizer_config.json").exists():
        return out
    from gguf import GGUFReader
    from transformers import AutoTokenizer
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping
    except ImportError:  # transformers before 5: its reader takes the file as it is
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(out)
        return out
    fields = GGUFReader(str(gguf)).fields
    vocab = len(fields["tokenizer.ggml.tokens"].data)
    special = dict(mapping._SPECIAL_TOKENS)
    for name, key in special.items():
        f = fields.get(f"tokenizer.ggml.{key}")
        if f is not None and not 0 <= int(f.parts[f.data[0]][0]) < vocab:
            del mapping._SPECIAL_TOKENS[name]
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    finally:
        mapping._SPECIAL_TOKENS.clear()
        mapping._SPECIAL_TOKENS.update(special)
    tok.save_pretrained(out)
    return out


def model_info(model):
    """Parameters and bytes of the GGUF's tensors, all of them and the matrices alone."""
    from gguf import GGUFReader
    tensors = GGUFReader(str(model)).tensors
    params = sum(int(t.n_elements) for t in tensors)
    nbytes = sum(int(t.n_bytes) for t in tensors)
    mats = [t for t in tensors if len(t.shape) == 2]
    formats, matrix_formats = {}, {}
    for t in tensors:
        kind = t.tensor_type.name.lower()
        formats[kind] = formats.get(kind, 0) + int(t.n_elements)
        if len(t.shape) == 2:
            matrix_formats[kind] = matrix_formats.get(kind, 0) + int(t.n_elements)
    return {"params": params, "tensor_bytes": nbytes, "file_bytes": os.path.getsize(model),
            "bits_per_weight": 8 * nbytes / params,
            "bits_per_weight_matrices": 8 * sum(int(t.n_bytes) for t in mats) / sum(int(t.n_elements) for t in mats),
            "formats": formats, "matrix_formats": matrix_formats}


# ---- perplexity and KL --------------------------------------------------------------------

def perplexity(a, model, text, kl_flag, kl_file):
    cmd = [a.serval, "perplexity", "--model", model, "--file", text, "--ctx", a.ctx, "--json",
           "--threads", a.threads, kl_flag, kl_file]
    if a.chunks:
        cmd += ["--chunks", a.chunks]
    return json.loads(run(cmd).strip().splitlines()[-1])


def cached(path, model, compute):
    """compute()'s result, kept in path (JSON) for a later run while model is not newer:
    an interrupted run goes on where it stopped."""
    if path.exists() and path.stat().st_mtime >= model.stat().st_mtime:
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")
    return value


def text_quality(a, work, base, qt, model, label, name, text):
    """Perplexity, and KL / same-top-1 against the base's log-probs (written by the base's row;
    the base itself is compared with them too, unless --no-self-check)."""
    logprobs = work / f"{base.stem}-{name}-ctx{a.ctx}-chunks{a.chunks}.logprobs"
    tag = f"{name}-ctx{a.ctx}-chunks{a.chunks}"
    if qt is None:
        first = work / "results" / f"{model.stem}-{tag}-base.json"
        if not logprobs.exists():
            first.unlink(missing_ok=True)
        p = cached(first, model, lambda: (log(f"{label}: perplexity on {name}, writing its log-probs"),
                                          perplexity(a, model, text, "--kl-divergence-base", logprobs))[1])
        if not a.self_check:
            return {"perplexity": p["perplexity"], "mean_nll": p["mean_nll"], "scored": p["scored"],
                    "chunks": p["chunks"]}
    p = cached(work / "results" / f"{model.stem}-{tag}.json", model, lambda: (
        log(f"{label}: perplexity and KL on {name}"),
        perplexity(a, model, text, "--kl-divergence", logprobs))[1])
    return {"perplexity": p["perplexity"], "mean_nll": p["mean_nll"], "scored": p["scored"],
            "chunks": p["chunks"], "kl_mean": p["kl_divergence"]["mean"],
            "kl_stderr": p["kl_divergence"]["stderr"], "kl_p99": p["kl_divergence"]["p99"],
            "same_top1_pct": 100 * p["kl_divergence"]["same_top1"]}


# ---- story choice -------------------------------------------------------------------------

def write_story_task(a, work):
    """The items (build_story_choice.py) and the lm-eval task yaml."""
    folder = work / f"story-choice-{a.items}"
    folder.mkdir(exist_ok=True)
    with open(a.stories, encoding="utf-8") as f:
        items = build_story_choice.build(f.read(), a.items, 2, 3, 52)
    data = folder / "story_choice.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    (folder / "story_choice.yaml").write_text(build_story_choice.task_yaml(TASK, data))
    return folder, items


def tokenizer_mismatches(server_url, tokenizer, items, limit):
    """Texts (opening; opening + " " + choice, as lm-eval joins them) whose ids from the
    Hugging Face tokenizer lm-eval uses differ from the served model's own (/tokenize)."""
    bad = []
    for it in items[:limit]:
        for text in [it["context"]] + [it["context"] + " " + c for c in it["choices"]]:
            req = urllib.request.Request(server_url + "/tokenize", method="POST",
                                         data=json.dumps({"prompt": text, "add_special_tokens": False}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                served = json.loads(r.read())["tokens"]
            if served != tokenizer(text, add_special_tokens=False).input_ids:
                bad.append(text)
    return bad


def story_choice(a, model, tokenizer_dir, task_folder, items, check_tokenizer):
    from serval_server import ServalServer
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    server = ServalServer(a.serval, model, name="quant-quality", threads=a.threads)
    try:
        mismatches = None
        if check_tokenizer:
            from transformers import AutoTokenizer
            bad = tokenizer_mismatches(server.url, AutoTokenizer.from_pretrained(tokenizer_dir), items, len(items))
            if bad:
                raise SystemExit(f"{len(bad)} item texts tokenize differently in {tokenizer_dir} and in "
                                 f"serval serve, e.g. {bad[0]!r}: lm-eval would score token ids the "
                                 "model never sees; pass --tokenizer with the model's own")
            mismatches = 0
        res = simple_evaluate(
            model="local-completions",
            model_args=(f"model=quant-quality,base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
                        f"tokenizer={tokenizer_dir},tokenized_requests=True,num_concurrent={a.concurrent},"
                        "max_retries=1"),
            tasks=[TASK], task_manager=TaskManager(include_path=str(task_folder)), batch_size=a.batch_size,
            log_samples=False)
    finally:
        server.stop()
    r = res["results"][TASK]
    out = {k: r[f"{k},none"] for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
    out["items"] = len(items)
    if mismatches is not None:
        out["tokenizer_mismatches"] = mismatches
    return out


# ---- the report ---------------------------------------------------------------------------

def verdict(qt, row, base_row):
    """'pass', 'FAIL: ...', or '-' when no bar applies (the base)."""
    if qt is None:
        return "-"
    fails, checked = [], False
    bar = qt.ppl_bar()
    if bar:
        for name, p in row["perplexity"].items():
            checked = True
            if p["ppl_delta_pct"] > bar[0]:
                fails.append(f"ppl {name} {p['ppl_delta_pct']:+.2f}% > +{bar[0]}%")
            if p["same_top1_pct"] < bar[1]:
                fails.append(f"top-1 {name} {p['same_top1_pct']:.1f}% < {bar[1]}%")
    if row.get("story") and base_row.get("story"):
        checked = True
        if abs(row["story_delta_points"]) > STORY_BAR_POINTS:
            fails.append(f"story {row['story_delta_points']:+.1f} pts")
    if not checked:
        return "-"
    return "FAIL: " + "; ".join(fails) if fails else "pass"


def held_as(matrix_formats):
    """The matrices' formats by share of their parameters: quantize keeps a wider format where a
    type's block does not divide a width (SmolLM2's 576, stories260K's 64 and 172)."""
    total = sum(matrix_formats.values())
    parts = sorted(matrix_formats.items(), key=lambda kv: -kv[1])
    if len(parts) == 1:
        return parts[0][0]
    return " ".join(f"{k} {100 * n / total:.0f}%" for k, n in parts)


def table(report):
    texts = report["texts"]
    head = ["type", "matrices held as", "bits/weight"]
    for t in texts:
        head += [f"ppl {t} (Δ%)", f"KL {t}", f"top-1 {t} %"]
    if report["items"]:
        head += ["story acc % (Δ pts)", "acc_norm %"]
    head += ["verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        cells = [row["type"], held_as(row["info"]["matrix_formats"]), f"{row['info']['bits_per_weight']:.2f}"]
        for t in texts:
            p = row["perplexity"][t]
            cells += [f"{p['perplexity']:.4f} ({p['ppl_delta_pct']:+.2f}%)",
                      f"{p['kl_mean']:.5f}" if "kl_mean" in p else "-",
                      f"{p['same_top1_pct']:.2f}" if "same_top1_pct" in p else "-"]
        if report["items"] and "story" not in row:
            cells += ["-", "-"]
        elif report["items"]:
            s = row["story"]
            cells += [f"{100 * s['acc']:.1f} ± {100 * s['acc_stderr']:.1f} ({row['story_delta_points']:+.1f})",
                      f"{100 * s['acc_norm']:.1f} ± {100 * s['acc_norm_stderr']:.1f}"]
        cells += [row["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--base", help="unquantized model: an f32/f16/bf16 GGUF or a Hugging Face folder")
    src.add_argument("--smollm2", action="store_true",
                     help=f"base: {SMOLLM2_GGUF} dequantized to f16 by transformers (cached in --work)")
    ap.add_argument("--types", default="q8_0 q4_0", help="space-separated quantize types, options after ':'")
    ap.add_argument("--serval", default=str(ROOT / "build-cpu" / "serval"))
    ap.add_argument("--work", required=True, help="folder for the models, log-probs and tasks")
    ap.add_argument("--wikitext", help="wikitext-2 test text (perplexity, KL)")
    ap.add_argument("--stories", help="TinyStories text (perplexity, KL and the story-choice items)")
    ap.add_argument("--tokenizer", help="Hugging Face tokenizer folder for lm-eval (default: the base's)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0, help="chunks per text (default: all)")
    ap.add_argument("--items", type=int, default=500, help="story-choice items (0: no story task)")
    ap.add_argument("--story-types", help="run the story task on these only (`base` for the base; default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calibration", help="text the `cal` types calibrate on (serval quantize --calibration); "
                    "never the evaluated text")
    ap.add_argument("--batch-size", type=int, default=8, help="lm-eval prompts per request")
    ap.add_argument("--concurrent", type=int, default=2, help="lm-eval requests in flight")
    ap.add_argument("--no-self-check", dest="self_check", action="store_false",
                    help="skip comparing the base with its own saved log-probs (KL 0, top-1 100%%)")
    ap.add_argument("--json", help="write the whole report here")
    a = ap.parse_args()
    if not (a.wikitext or a.stories):
        ap.error("give --wikitext and/or --stories")
    if a.items and not a.stories:
        ap.error("the story-choice items come from --stories (or pass --items 0)")
    QuantType.calibration = pathlib.Path(a.calibration).resolve() if a.calibration else None
    QuantType.threads = a.threads
    types = [QuantType(s) for s in a.types.split()]
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    a.serval = str(pathlib.Path(a.serval).resolve())

    if a.smollm2:
        base, hf = prepare_smollm2(a.serval, work)
        base_src = hf
    else:
        base = base_gguf(a.serval, a.base, work)
        base_src = a.base
    texts = {k: v for k, v in (("wikitext", a.wikitext), ("tinystories", a.stories)) if v}
    models = [(None, base)]
    for qt in types:
        out = work / f"{base.stem}-{qt.file_stem()}.gguf"
        if not out.exists() or out.stat().st_mtime < base.stat().st_mtime:
            log(f"quantize {qt.spec}")
            cmd = [a.serval, "quantize", base, *qt.quantize_args(), "-o", out]
            proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
            out.with_suffix(".quantize.log").write_text(proc.stderr)  # fallbacks, calibration alphas
            if proc.returncode != 0:
                raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-4000:]}")
        models.append((qt, out))

    task_folder = items = tok_dir = None
    if a.items:
        task_folder, items = write_story_task(a, work)
        tok_dir = a.tokenizer or hf_tokenizer_folder(base_src, base, work)

    report = {"commit": git_commit(), "command": sys.argv, "serval": a.serval, "base": str(base),
              "ctx": a.ctx, "chunks": a.chunks or None, "items": a.items, "texts": texts, "rows": []}
    rows = []
    for qt, model in models:
        info = model_info(model)
        label = qt.spec if qt else "base " + max(info["formats"], key=info["formats"].get)
        rows.append({"type": label, "model": str(model), "quantize_args": qt.quantize_args() if qt else [],
                     "info": info, "perplexity": {}})
    # Perplexity of every model first, then the story task: the slower part comes last.
    for (qt, model), row in zip(models, rows):
        for name, text in texts.items():
            row["perplexity"][name] = text_quality(a, work, base, qt, model, row["type"], name, text)
    if items:
        for (qt, model), row in zip(models, rows):
            if a.story_types is not None and (qt.spec if qt else "base") not in a.story_types.split():
                continue
            row["story"] = cached(work / "results" / f"{model.stem}-story{a.items}.json", model, lambda: (
                log(f"{row['type']}: story choice, {len(items)} items"),
                story_choice(a, model, tok_dir, task_folder, items, check_tokenizer=qt is None))[1])
    report["rows"] = rows

    base_row = report["rows"][0]
    if items and "story" not in base_row:
        raise SystemExit("the story task needs the base's row: add `base` to --story-types")
    for (qt, _), row in zip(models, report["rows"]):
        for name, p in row["perplexity"].items():
            b = base_row["perplexity"][name]["perplexity"]
            p["ppl_delta_pct"] = 100 * (p["perplexity"] / b - 1)
        if "story" in row:
            row["story_delta_points"] = 100 * (row["story"]["acc"] - base_row["story"]["acc"])
        row["verdict"] = verdict(qt, row, base_row)
    if items:
        acc = base_row["story"]["acc"]
        report["base_above_chance"] = 100 * (acc - CHANCE) >= ABOVE_CHANCE_POINTS
    report["table"] = table(report)
    print(report["table"])
    if items:
        print(f"\nbase story accuracy {100 * base_row['story']['acc']:.1f}% against chance {100 * CHANCE:.0f}%: "
              + ("well above" if report["base_above_chance"] else f"NOT {ABOVE_CHANCE_POINTS:.0f}+ points above"))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
