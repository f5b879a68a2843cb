"""lm-eval-harness's own `local-completions` client scores a small multiple-choice task
against `cardjax serve` (echo + logprobs on /v1/completions) exactly as lm-eval's `hf`
model scores it on the HF export of the same checkpoint: the same accuracy, every choice's
log-likelihood within TOLERANCE."""

import json
import subprocess
import sys

from serve_helpers import mars_run, start_server

# nats, per choice (a sum over its tokens): the server's JAX forward and transformers'
# torch forward are the same fp32 model summed in different orders, so they agree to
# float32 rounding (a few 1e-6 here), not to the bit.
TOLERANCE = 1e-4

DOCS = [
    {"q": "alpha beta", "choices": [" gamma", " delta", " five", " one"], "gold": 0},
    {"q": "one two", "choices": [" three", " six", " alpha"], "gold": 0},
    {"q": "three four", "choices": [" five", " beta", " epsilon", " two"], "gold": 1},
    {"q": "gamma delta", "choices": [" epsilon", " one", " four"], "gold": 0},
    {"q": "five", "choices": [" six", " gamma", " alpha beta"], "gold": 2},
    {"q": "beta gamma", "choices": [" delta epsilon", " two three", " six"], "gold": 0},
    {"q": "two three four", "choices": [" five six", " alpha", " delta"], "gold": 1},
    {"q": "delta", "choices": [" epsilon", " three", " beta gamma", " one"], "gold": 0},
]


def _task(folder, cache):
  """A local multiple-choice task: its YAML and JSONL in `folder`."""
  folder.mkdir()
  (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  (folder / "tiny_mc.yaml").write_text(f"""task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'docs.jsonl'}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
""")
  return folder


def _evaluate(model: str, model_args: dict, tasks):
  """(accuracy, {doc id: [(loglikelihood, is_greedy) per choice]})."""
  import lm_eval

  out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["tiny_mc"],
                                task_manager=tasks, log_samples=True, bootstrap_iters=0)
  samples = {s["doc_id"]: [tuple(r) for r in s["filtered_resps"]]
             for s in out["samples"]["tiny_mc"]}
  return out["results"]["tiny_mc"]["acc,none"], samples


def test_local_completions_scores_as_the_hf_model(tmp_path, monkeypatch):
  # Nothing may reach a hub: the task's data, the model and the tokenizer are all local.
  for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    monkeypatch.setenv(key, "1")
  import transformers
  from lm_eval.tasks import TaskManager

  from cardjax import checkpoint

  run = mars_run(tmp_path)
  hf = tmp_path / "hf"
  subprocess.run([sys.executable, "-m", "cardjax.cli", "export-hf",
                  str(run / "checkpoints"), str(hf)], check=True, capture_output=True)
  # The exported tokenizer files load in transformers and tokenize as the server does:
  # lm-eval sends the server token ids from it.
  served = checkpoint.load_tokenizer(run / "checkpoints", checkpoint.read_model_config(
      run / "checkpoints", 0))
  exported = transformers.AutoTokenizer.from_pretrained(str(hf))
  for d in DOCS:
    for c in d["choices"]:
      assert exported.encode(d["q"] + c) == served.encode(d["q"] + c)
  tasks = TaskManager(include_path=str(_task(tmp_path / "task", tmp_path / "datasets")),
                      include_defaults=False)

  acc_hf, hf_scores = _evaluate("hf", {"pretrained": str(hf), "dtype": "float32",
                                       "device": "cpu"}, tasks)
  # A MARS server: each request decodes one token with MARS, then the prompt is scored in
  # AR order (cardjax/serve/scoring.py).
  proc, url = start_server(run, "--method", "mars", "--batch-sizes", "1,4")
  try:
    acc_api, api_scores = _evaluate("local-completions", {
        "base_url": url + "/v1/completions", "model": "run", "tokenizer": str(hf),
        "tokenized_requests": True, "num_concurrent": 1, "max_retries": 1}, tasks)
  finally:
    proc.kill()
    proc.wait()
  assert acc_api == acc_hf
  assert sorted(api_scores) == sorted(hf_scores) == list(range(len(DOCS)))
  worst = 0.0
  for doc, choices in hf_scores.items():
    assert len(api_scores[doc]) == len(choices) == len(DOCS[doc]["choices"])
    for (ll_api, greedy_api), (ll_hf, greedy_hf) in zip(api_scores[doc], choices):
      worst = max(worst, abs(ll_api - ll_hf))
      assert abs(ll_api - ll_hf) < TOLERANCE, (doc, ll_api, ll_hf)
      assert greedy_api == greedy_hf, doc
  print(f"accuracy {acc_api}, largest log-likelihood difference {worst:.2e} nats")
