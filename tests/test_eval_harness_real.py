"""The imported SmolLM2-135M-Instruct through the harness: lm-eval's `cardjax` model scores
and generates as lm-eval's own `hf` model does on the `cardjax export-hf` folder of the same
checkpoint (slow: `make test-slow`).

The checkpoint is $CARDJAX_SMOLLM2_BASE, default runs/smollm2/base (`make smollm2` imports
it); the test skips without it. The tasks: the shipped arith_mc (multiple choice, 40
problems x 4 choices) and arith_sft (generation, chat template), and a rolling-loglikelihood
task on a few of this repository's own docs, long enough to need several 2048-token windows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_eval_harness import TOLERANCE, _evaluate, _responses

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BASE = Path(os.environ.get("CARDJAX_SMOLLM2_BASE", ROOT / "runs/smollm2/base"))
ROLLING_DOCS = ("docs/decoding.md", "docs/objectives.md", "README.md")
GENERATIONS = 8  # arith_sft problems decoded greedily by both, 48 new tokens each
HF_ARGS = {"dtype": "float32", "device": "cpu", "batch_size": 8}
WINDOW = 2048


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(the imported run, its export-hf folder, a folder with the rolling task), offline."""
  from cardjax.restore import checkpoints_dir

  if not checkpoints_dir(BASE).is_dir():
    pytest.skip(f"{BASE} is absent: `make smollm2` imports it (or set CARDJAX_SMOLLM2_BASE)")
  mp = pytest.MonkeyPatch()
  for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    mp.setenv(key, "1")
  root = tmp_path_factory.mktemp("harness_real")
  hf = root / "hf"
  subprocess.run([sys.executable, "-m", "cardjax.cli", "export-hf", str(BASE), str(hf)],
                 check=True, capture_output=True)
  tasks = root / "tasks"
  tasks.mkdir()
  docs = [{"text": (ROOT / d).read_text()} for d in ROLLING_DOCS]
  (tasks / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
  (tasks / "repo_docs.yaml").write_text(f"""task: repo_docs
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tasks / 'docs.jsonl'}
  cache_dir: {root / 'cache'}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""")
  yield BASE, hf, tasks
  mp.undo()


def _worst_gap(got, ref, task) -> float:
  """The largest relative log-likelihood gap over every request of `task`; asserts the
  requests, their is-greedy flags, and each gap within TOLERANCE."""
  mine, theirs = _responses(got, task), _responses(ref, task)
  assert sorted(mine) == sorted(theirs) and len(mine) >= len(ROLLING_DOCS)
  worst = 0.0
  for doc, answers in theirs.items():
    for a, b in zip(mine[doc], answers, strict=True):
      a, b = (a, b) if isinstance(b, (list, tuple)) else ((a,), (b,))
      gap = abs(a[0] - b[0]) / max(1.0, abs(b[0]))
      worst = max(worst, gap)
      assert gap < TOLERANCE, (task, doc, a, b)
      assert tuple(a[1:]) == tuple(b[1:]), (task, doc)
  return worst


def test_smollm2_scores_as_the_hf_model(setup):
  import transformers

  run, hf, folder = setup
  tok = transformers.AutoTokenizer.from_pretrained(str(hf))
  assert len(tok.encode((ROOT / ROLLING_DOCS[0]).read_text())) > 2 * WINDOW  # several windows
  gaps = {}
  # Rolling windows of 2048 tokens (both sides' max_length; the model's context is 8192),
  # two rows a batch: both models' fp32 attention scores and logits stay near a GB.
  for task, batch in (("arith_mc", 8), ("repo_docs", 2)):
    ref = _evaluate("hf", {"pretrained": str(hf), **HF_ARGS, "batch_size": batch,
                           "max_length": WINDOW}, folder, [task])
    got = _evaluate("cardjax", {"checkpoint": str(run), "batch_size": batch,
                                "max_length": WINDOW}, folder, [task])
    if task == "arith_mc":
      assert got["results"][task]["acc,none"] == ref["results"][task]["acc,none"]
      acc = got["results"][task]["acc,none"]
    gaps[task] = _worst_gap(got, ref, task)
  print(f"arith_mc acc {acc:.3f}; largest relative "
        f"log-likelihood gap {gaps}")


def test_smollm2_generates_as_the_hf_model(setup):
  run, hf, folder = setup
  common = {"apply_chat_template": True, "limit": GENERATIONS,
            "gen_kwargs": "max_gen_toks=48"}
  ref = _evaluate("hf", {"pretrained": str(hf), **HF_ARGS}, folder, ["arith_sft"], **common)
  got = _evaluate("cardjax", {"checkpoint": str(run), "batch_size": 8, "method": "ar"},
                  folder, ["arith_sft"], **common)
  # The raw completions (each filter of the task reads the same ones).
  mine, theirs = ({s["doc_id"]: s["resps"] for s in out["samples"]["arith_sft"]}
                  for out in (got, ref))
  assert len(mine) == GENERATIONS and mine == theirs
  assert all(r[0][0] for r in mine.values())
  print(f"arith_sft strict exact match {got['results']['arith_sft']}")
