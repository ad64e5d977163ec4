"""lm-eval's `local-completions` against `serval serve` (issue 51): a multiple-choice task
built from TinyStories (scripts/build_story_choice.py, dataset_path: json), a
loglikelihood_rolling task on wikitext-2 and a short generate_until task. Every
loglikelihood Serval returns equals the one lm-eval's own Hugging Face backend computes
with transformers on the same tiny random Llama 3 (f32, CPU), so the accuracy is the same."""
import json
import subprocess
import sys

import pytest

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval[api], what local-completions needs

import hf_models  # noqa: E402
from serval_server import ServalServer  # noqa: E402

TASKS = ["serval_story_choice", "serval_rolling", "serval_continue"]
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def write_tasks(folder, data_dir):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_story_choice.py"), "--stories",
                    str(data_dir / "tinystories-valid-part1.txt"), "--items", "24", "--out",
                    str(folder / "story_choice.jsonl")], check=True, capture_output=True)
    paragraphs = [p.strip() for p in (data_dir / "wikitext-2-test.raw").read_text().split("\n \n")]
    docs = [p[:1200] for p in paragraphs if len(p) > 400][:3]
    with open(folder / "rolling.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    with open(folder / "continue.jsonl", "w") as f:
        for line in ["Once upon a time", "The cat sat", "Lily and Ben went to the park"]:
            f.write(json.dumps({"prompt": line, "answer": "."}) + "\n")
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "story_choice.yaml").write_text(
        f"task: serval_story_choice\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'story_choice.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n")
    (folder / "rolling.yaml").write_text(
        f"task: serval_rolling\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'rolling.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    (folder / "continue.yaml").write_text(
        f"task: serval_continue\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'continue.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("lm-eval")
    model = folder / "model"
    hf_models.build("llama3", model, models)
    tasks = folder / "tasks"
    tasks.mkdir()
    write_tasks(tasks, models.parent / "data")
    return model, tasks


def evaluate(model_name, model_args, tasks):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    return simple_evaluate(model=model_name, model_args=model_args, tasks=TASKS,
                           task_manager=TaskManager(include_path=str(tasks)), log_samples=True, batch_size=4)


def loglikelihoods(result, task):
    """Per document, the loglikelihood of each request (multiple choice: one per choice)."""
    out = {}
    for s in result["samples"][task]:
        vals = []
        for r in s["resps"]:
            v = r[0]
            vals.append(float(v[0] if isinstance(v, (list, tuple)) else v))
        out[s["doc_id"]] = vals
    return out


def test_local_completions_equal_transformers(serval, setup):
    model, tasks = setup
    server = ServalServer(serval, model, "--max-num-batched-tokens", "64")
    try:
        got = evaluate("local-completions",
                       f"model=test-model,base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
                       f"tokenizer={model},tokenized_requests=True,num_concurrent=1,max_retries=1", tasks)
    finally:
        server.stop()
    want = evaluate("hf", f"pretrained={model},dtype=float32,device=cpu", tasks)
    for task in ("serval_story_choice", "serval_rolling"):
        g, w = loglikelihoods(got, task), loglikelihoods(want, task)
        assert g.keys() == w.keys() and len(g) > 0
        for doc in w:
            assert len(g[doc]) == len(w[doc])
            for a, b in zip(g[doc], w[doc]):
                # Sums of f32 logprobs over whole continuations and documents.
                assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (task, doc, a, b)
    assert got["results"]["serval_story_choice"]["acc,none"] == want["results"]["serval_story_choice"]["acc,none"]
    # generate_until ran: a text per document (the random model's words, whatever they are).
    outs = [s["resps"][0][0] for s in got["samples"]["serval_continue"]]
    assert len(outs) == 3 and all(isinstance(o, str) for o in outs)
