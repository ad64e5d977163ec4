#!/usr/bin/env python3
"""Builds a multiple-choice story-completion task for lm-eval from a TinyStories text:
each item is a paragraph's opening (its first sentences), its true next sentence and
`--distractors` next sentences of other paragraphs, in a deterministic random order.
Writes JSON lines {"context", "choices", "label"}; lm-eval reads them with
dataset_path: json (tests/data/lm_eval/story_choice.yaml).
Usage: build_story_choice.py --stories tinystories-valid-part1.txt --items 500 --out FILE.jsonl"""
import argparse
import json
import random
import re

SENTENCE = re.compile(r"[^.!?]+[.!?]+[\"']?")


def sentences(paragraph):
    return [s.strip() for s in SENTENCE.findall(paragraph) if s.strip()]


def build(text, items, opening, distractors, seed):
    paragraphs = [p.replace("\n", " ").strip() for p in text.split("\n\n")]
    usable = []
    for p in paragraphs:
        s = sentences(p)
        # A whole opening and a next sentence of ordinary length.
        if len(s) > opening and all(3 <= len(x.split()) <= 40 for x in s[:opening + 1]):
            usable.append((" ".join(s[:opening]), s[opening]))
    rng = random.Random(seed)
    rng.shuffle(usable)
    if len(usable) < items + distractors:
        raise SystemExit(f"only {len(usable)} usable paragraphs for {items} items")
    chosen, pool = usable[:items], [nxt for _, nxt in usable[items:]]
    out = []
    for context, truth in chosen:
        wrong = set()
        while len(wrong) < distractors:
            cand = rng.choice(pool)
            if cand != truth:
                wrong.add(cand)
        choices = [truth] + sorted(wrong)
        rng.shuffle(choices)
        out.append({"context": context, "choices": choices, "label": choices.index(truth)})
    return out


def task_yaml(name, data_file):
    """lm-eval's task for the items in data_file: acc and acc_norm (the choice's loglikelihood
    per byte) of the choice joined to the opening by a space."""
    return (f"task: {name}\ndataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data_file}\noutput_type: multiple_choice\ndoc_to_text: \"{{{{context}}}}\"\n"
            "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\n"
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stories", required=True)
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--opening", type=int, default=2, help="sentences of context")
    ap.add_argument("--distractors", type=int, default=3)
    ap.add_argument("--seed", type=int, default=52)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.stories, encoding="utf-8") as f:
        items = build(f.read(), a.items, a.opening, a.distractors, a.seed)
    with open(a.out, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    print(f"{len(items)} items -> {a.out}")


if __name__ == "__main__":
    main()
