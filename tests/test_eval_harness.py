"""`cardjax eval --harness`: lm-eval-harness's `cardjax` model scores and generates as
lm-eval's own `hf` model does on the `cardjax export-hf` folder of the same checkpoint
(a tiny MARS run, tests/serve_helpers.py), and MARS decodes the same completions as AR.

Every task is local (YAML and JSONL in a temporary folder) and nothing reaches a hub.
"""

import itertools
import json
import subprocess
import sys

import pytest

from serve_helpers import TEXTS, mars_run, save_run
from test_serve_lm_eval import DOCS

# nats per request, relative to max(1, |log-likelihood|): the JAX forward and transformers'
# torch forward are the same fp32 model summed in different orders (test_serve_lm_eval.py).
TOLERANCE = 1e-4
# Documents of the rolling task: one over twice the model's 128-token context, so it is
# scored in three windows.
ROLLING = ["alpha beta gamma delta", "one two three four five six seven",
           " ".join(TEXTS[:40]), "six five four three two one"]
PROMPTS = ["alpha beta", "one two three", "gamma", "five six", "delta epsilon alpha",
           "two", "beta gamma delta", "four five"]


def _tasks(folder):
  """tiny_mc (multiple choice), tiny_roll (loglikelihood_rolling), tiny_gen (generate_until)
  in `folder`."""
  folder.mkdir()
  docs = {"mc": DOCS, "roll": [{"text": t} for t in ROLLING],
          "gen": [{"prompt": p} for p in PROMPTS]}
  for name, rows in docs.items():
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in rows))
  common = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\n" \
           f"  cache_dir: {folder / 'cache'}\ntest_split: test\n"
  (folder / "tiny_mc.yaml").write_text(f"""task: tiny_mc
{common.format(folder / 'mc.jsonl')}output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
""")
  (folder / "tiny_roll.yaml").write_text(f"""task: tiny_roll
{common.format(folder / 'roll.jsonl')}output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""")
  (folder / "tiny_gen.yaml").write_text(f"""task: tiny_gen
{common.format(folder / 'gen.jsonl')}output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: ""
generation_kwargs:
  until: ["<|im_end|>", "zzz"]
  do_sample: false
  max_gen_toks: 12
metric_list:
  - metric: exact_match
""")
  return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(run, its export-hf folder, the tasks folder), offline."""
  mp = pytest.MonkeyPatch()
  for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    mp.setenv(key, "1")
  root = tmp_path_factory.mktemp("harness")
  run = mars_run(root)
  hf = root / "hf"
  subprocess.run([sys.executable, "-m", "cardjax.cli", "export-hf", str(run / "checkpoints"),
                  str(hf)], check=True, capture_output=True)
  yield run, hf, _tasks(root / "tasks")
  mp.undo()


def _evaluate(model, model_args: dict, folder, names, **options):
  """lm-eval's output dict with every sample; the tasks from `folder` and the shipped ones;
  `options`: more of simple_evaluate's arguments."""
  import lm_eval
  from lm_eval.tasks import TaskManager

  import cardjax.eval.harness.model  # noqa: F401 (registers `cardjax`)
  from cardjax.eval.harness.documents import TASKS

  tasks = TaskManager(include_path=[str(folder), str(TASKS)], include_defaults=False)
  return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=names,
                                 task_manager=tasks, log_samples=True, bootstrap_iters=0,
                                 **options)


def _responses(out, task) -> dict:
  return {s["doc_id"]: s["filtered_resps"] for s in out["samples"][task]}


HF_ARGS = {"dtype": "float32", "device": "cpu", "batch_size": 4}


def test_scores_as_the_hf_model(setup):
  import transformers

  run, hf, folder = setup
  assert len(transformers.AutoTokenizer.from_pretrained(str(hf)).encode(ROLLING[2])) > 256
  names = ["tiny_mc", "tiny_roll"]
  ref = _evaluate("hf", {"pretrained": str(hf), **HF_ARGS}, folder, names)
  got = _evaluate("cardjax", {"checkpoint": str(run), "batch_size": 4}, folder, names)
  assert got["results"]["tiny_mc"]["acc,none"] == ref["results"]["tiny_mc"]["acc,none"]
  worst = 0.0
  for task in names:
    mine, theirs = _responses(got, task), _responses(ref, task)
    assert sorted(mine) == sorted(theirs) and len(mine) > 3
    for doc, choices in theirs.items():
      for a, b in zip(mine[doc], choices, strict=True):
        a, b = (a, b) if task == "tiny_mc" else ((a,), (b,))
        gap = abs(a[0] - b[0]) / max(1.0, abs(b[0]))
        worst = max(worst, gap)
        assert gap < TOLERANCE, (task, doc, a, b)
        assert a[1:] == b[1:], (task, doc)  # is-greedy of each choice
  print(f"largest relative log-likelihood difference {worst:.1e}")


def test_generates_as_the_hf_model(setup):
  run, hf, folder = setup
  ref = _evaluate("hf", {"pretrained": str(hf), **HF_ARGS}, folder, ["tiny_gen"])
  got = _evaluate("cardjax", {"checkpoint": str(run), "batch_size": 4, "method": "ar"},
                  folder, ["tiny_gen"])
  mine, theirs = _responses(got, "tiny_gen"), _responses(ref, "tiny_gen")
  assert mine == theirs
  assert any(r[0] for r in mine.values())  # something was generated


def _cli(run, folder, out, *flags):
  from cardjax.cli import main

  assert main(["eval", "--checkpoint", str(run), "--harness", "tiny_gen", "--include-path",
               str(folder), "--batch-size", "4", "--bootstrap-iters", "0", "--log-samples",
               "--output", str(out), *flags]) == 0
  data = json.loads(out.read_text())
  return ({s["doc_id"]: s["filtered_resps"] for s in data["samples"]["tiny_gen"]},
          data["results"]["tiny_gen"]["cardjax"])


def test_mars_decodes_as_ar_and_reports_speed(setup, tmp_path, capsys):
  run, _, folder = setup
  ar, ar_block = _cli(run, folder, tmp_path / "ar.json")
  assert ar_block["method"] == "ar" and ar_block["generate_until"]["tokens_per_forward"] == 1.0
  assert "tiny_gen" in capsys.readouterr().out  # lm-eval's table
  for flags in (["--tau", "1.0"], ["--verify"]):
    got, block = _cli(run, folder, tmp_path / "mars.json", "--method", "mars", *flags)
    assert got == ar, flags
    assert block["method"] == "mars" and block["options"]["block"] == 4  # the run's B
  # The untrained model's drafts pass a low threshold only (tau 0.5 accepts one token a
  # forward; 0.05 about two): what is checked is that the JSON reports it.
  _, short = _cli(run, folder, tmp_path / "short.json", "--max-length", "64")
  assert short["max_length"] == 64 and ar_block["max_length"] == 128  # the model's context
  _, fast = _cli(run, folder, tmp_path / "fast.json", "--method", "mars", "--tau", "0.05")
  g = fast["generate_until"]
  assert g["requests"] == len(PROMPTS) and g["tokens"] > 0 and g["seconds"] > 0
  assert g["tokens_per_forward"] > 1.0 and fast["machine"]["cores"] >= 1
  assert fast["options"]["tau"] == 0.05
  print(f"MARS tau 0.05: {g['tokens_per_forward']:.2f} tokens per forward")


def test_bad_inputs_are_one_clear_error(setup, monkeypatch, capsys):
  from cardjax.cli import main

  run, _, folder = setup
  args = ["eval", "--checkpoint", str(run), "--include-path", str(folder), "--harness"]
  cases = [  # (flags, the one line on stderr)
      (["tiny_gne"], "unknown lm-eval task 'tiny_gne' (close: tiny_gen"),
      (["tiny_gen", "--method", "card"], "cannot serve --method card; methods that fit: ar, "
                                         "mars"),
  ]
  for flags, message in cases:
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
  # An objective with neither an AR-order likelihood nor an ELBO estimate cannot score; a
  # BD3LM checkpoint scores (test_bd3lm_scores_its_blockwise_elbo) but no decoder serves it.
  from types import SimpleNamespace

  from cardjax.errors import CardjaxError
  from cardjax.eval.harness.model import CardjaxLM
  lm = CardjaxLM.__new__(CardjaxLM)
  lm.run = SimpleNamespace(objective="unknown")
  lm.settings = SimpleNamespace(checkpoint="b", decoding=SimpleNamespace(method="ar"))
  for request in (lm.loglikelihood, lm.loglikelihood_rolling):
    with pytest.raises(CardjaxError, match="nor an ELBO estimate .* run generate_until"):
      request([])
  lm.run = SimpleNamespace(objective="bd3lm")
  with pytest.raises(CardjaxError, match="bd3lm.*--method ar; methods that fit: none of"):
    lm.generate_until([])
  monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
  assert main([*args, "tiny_gen"]) == 2
  assert "pip install 'cardjax[eval]'" in capsys.readouterr().err


def test_shipped_tasks_run_offline_with_the_chat_template(setup, tmp_path):
  """arith_sft and arith_mc load from the package (no --include-path, no download); with
  --apply-chat-template the arith prompt is `cardjax eval --task arith`'s: the question as
  the user turn of the checkpoint's chat template."""
  from cardjax import checkpoint
  from cardjax.cli import main
  from cardjax.eval.harness import documents

  run, _, _ = setup
  assert documents.write_arith_mc(tmp_path / "mc.jsonl").read_text() == \
      (documents.TASKS / "arith_mc.jsonl").read_text()  # the shipped file is regenerable
  out = tmp_path / "shipped.json"
  assert main(["eval", "--checkpoint", str(run), "--harness", "arith_sft,arith_mc",
               "--limit", "2", "--apply-chat-template", "--gen-kwargs", "max_gen_toks=8",
               "--bootstrap-iters", "0", "--log-samples", "--output", str(out)]) == 0
  data = json.loads(out.read_text())
  tok = checkpoint.load_tokenizer(run / "checkpoints", checkpoint.read_model_config(
      run / "checkpoints", 0))
  test = documents.arith_sft()["test"]
  for s in data["samples"]["arith_sft"]:
    question = test[s["doc_id"]]["question"]
    assert s["arguments"][0][0] == tok.render_chat(
        [{"role": "user", "content": question}], add_generation_prompt=True)
  results = data["results"]
  assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(results["arith_sft"])
  assert "acc,none" in results["arith_mc"]
  assert results["arith_sft"]["cardjax"]["generate_until"]["requests"] == 2
  assert results["arith_mc"]["cardjax"]["loglikelihood"]["requests"] == 8  # 2 docs x 4


def _mdlm_run(root, name: str = "mdlm", **objective):
  """The tiny model saved as an MDLM training run (objective mdlm, shift off), or as one of
  objective `name` with the given objective settings."""
  from cardjax.data.tokenizer import load_tokenizer
  from cardjax.model import ModelConfig, create_model

  tok = load_tokenizer(root / "tok")
  model = create_model(ModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64,
                                   num_layers=2, num_heads=4, num_kv_heads=2,
                                   initializer_range=0.3, max_position_embeddings=128,
                                   mask_token_id=tok.mask_id, eos_token_id=tok.eos_id),
                       seed=5)
  return save_run(model, root / name, root / "tok", name, **objective), model


def test_mdlm_scores_its_elbo(setup):
  """One masked token: every draw masks it, so the estimate is exactly its log-prob under
  the bidirectional forward. Two: the mean of 512 draws lies within four standard errors
  of the ELBO enumerated over every mask (l = 1: either token, weight 2; l = 2: both)."""
  from types import SimpleNamespace

  import jax
  import jax.numpy as jnp
  import numpy as np

  from cardjax.attention import BIDIRECTIONAL
  from cardjax.eval.harness.model import CardjaxLM

  run, _, _ = setup
  path, model = _mdlm_run(run.parent)
  lm = CardjaxLM(checkpoint=str(path), method="dus", batch_size=8, elbo_draws=512)
  mask = lm.run.model.cfg.mask_token_id

  def logp(ids, masked):
    seq = jnp.asarray([[mask if i in masked else t for i, t in enumerate(ids)]])
    out = jax.nn.log_softmax(model(seq, mask=BIDIRECTIONAL)[0].astype(jnp.float32), -1)
    return ({i: float(out[i, ids[i]]) for i in masked},
            {i: int(out[i].argmax()) for i in masked})

  requests = [("alpha beta", " gamma"), ("one two", " three four")]
  pairs = [lm.encode_pair(*r) for r in requests]
  assert len(pairs[0][1]) == 1 and len(pairs[1][1]) > 1
  got = lm.loglikelihood([SimpleNamespace(args=r, task_name="t") for r in requests],
                         disable_tqdm=True)
  ids = pairs[0][0] + pairs[0][1]
  lp, best = logp(ids, {len(ids) - 1})
  assert abs(got[0][0] - lp[len(ids) - 1]) < 1e-4
  assert got[0][1] == (best[len(ids) - 1] == ids[-1])
  # Every mask of the L continuation tokens, with its probability and its draw's value.
  ids, n = pairs[1][0] + pairs[1][1], len(pairs[1][1])
  values, probs = [], []
  for l in range(1, n + 1):
    subsets = list(itertools.combinations(range(len(ids) - n, len(ids)), l))
    for subset in subsets:
      values.append(n / l * sum(logp(ids, set(subset))[0].values()))
      probs.append(1 / n / len(subsets))
  values, probs = np.asarray(values), np.asarray(probs)
  mean = float(values @ probs)
  error = float(np.sqrt(((values - mean) ** 2) @ probs / 512))
  assert abs(got[1][0] - mean) < 4 * error + 1e-4, (got[1][0], mean, error)
  print(f"ELBO {mean:.3f}, estimate {got[1][0]:.3f} (standard error {error:.3f})")
  block = lm.report()["t"]["loglikelihood"]
  assert block["requests"] == 2 and block["forwards"] == -(-2 * 513 // 8)


@pytest.mark.integration  # 40 s on 2 cores: lm-eval over a BD3LM's ELBO
def test_bd3lm_scores_its_blockwise_elbo(setup):
  """Blocks of 4 from the sequence start, each a masked diffusion over the clean blocks
  before it, all read in one [x_t | x_0] forward under training's bd3lm mask. One masked
  token per block (one block, then two): the estimate is exactly the log-probs of that
  forward. Three tokens in one block, then 3 + 2 across two: the mean of 512 draws lies
  within four standard errors of the ELBO enumerated over every joint mask."""
  from types import SimpleNamespace

  import jax
  import jax.numpy as jnp
  import numpy as np

  from cardjax.errors import CardjaxError
  from cardjax.eval.harness.model import CardjaxLM
  from cardjax.objectives.bd3lm import stream_inputs

  run, _, folder = setup
  path, model = _mdlm_run(run.parent, "bd3lm", block_size=4)
  # The default method (ar) serves no BD3LM checkpoint: scoring loads all the same.
  lm = CardjaxLM(checkpoint=str(path), batch_size=8, elbo_draws=512)
  mask = lm.run.model.cfg.mask_token_id

  def logp(ids, masked):
    n = len(ids)
    x_t = [mask if i in masked else t for i, t in enumerate(ids)]
    inputs = stream_inputs(jnp.asarray([x_t]), jnp.asarray([ids]), jnp.arange(n)[None],
                           jnp.ones((1, n), jnp.int32), 4)
    out = jax.nn.log_softmax(model(**inputs)[0, :n].astype(jnp.float32), -1)
    return ({i: float(out[i, ids[i]]) for i in masked},
            {i: int(out[i].argmax()) for i in masked})

  def elbo(ids, n):
    """(ELBO, standard error of a 512-draw mean) over every joint mask of the blocks."""
    cont = range(len(ids) - n, len(ids))
    per_block = []  # per block: [(subset, probability, weight L_b / l_b)]
    for b in sorted({q // 4 for q in cont}):
      mine = [q for q in cont if q // 4 == b]
      options = []
      for l in range(1, len(mine) + 1):
        subsets = list(itertools.combinations(mine, l))
        options += [(s, 1 / len(mine) / len(subsets), len(mine) / l) for s in subsets]
      per_block.append(options)
    values, probs = [], []
    for joint in itertools.product(*per_block):
      got, _ = logp(ids, {q for s, _, _ in joint for q in s})
      values.append(sum(w * got[q] for s, _, w in joint for q in s))
      probs.append(np.prod([p for _, p, _ in joint]))
    values, probs = np.asarray(values), np.asarray(probs)
    mean = float(values @ probs)
    return mean, float(np.sqrt(((values - mean) ** 2) @ probs / 512))

  requests = [("alpha beta", " gamma"), ("alpha beta gamma", " delta epsilon"),
              ("one two three", " four five six"), ("one", " two three four five")]
  pairs = [lm.encode_pair(*r) for r in requests]
  blocks = [[q // 4 for q in range(len(c), len(c) + len(x))] for c, x in pairs]
  assert blocks == [[0], [0, 1], [1, 1, 1], [0, 0, 0, 1, 1]], blocks
  got = lm.loglikelihood([SimpleNamespace(args=r, task_name="t") for r in requests],
                         disable_tqdm=True)
  for (context, continuation), (estimate, greedy) in zip(pairs, got, strict=True):
    ids, n = context + continuation, len(continuation)
    mean, error = elbo(ids, n)
    if n == len(set(q // 4 for q in range(len(context), len(ids)))):
      assert error == 0.0  # one token per block: every draw masks exactly those
    assert abs(estimate - mean) < 4 * error + 1e-4, (estimate, mean, error)
    _, best = logp(ids, set(range(len(context), len(ids))))
    assert greedy == all(best[q] == ids[q] for q in best)
    print(f"ELBO {mean:.3f}, estimate {estimate:.3f} (standard error {error:.3f})")
  block = lm.report()["t"]["loglikelihood"]
  assert block["requests"] == 4 and block["forwards"] == -(-4 * 513 // 8)
  assert lm.report()["t"]["elbo_draws"] == 512
  with pytest.raises(CardjaxError, match="methods that fit: none of cardjax's decoders"):
    lm.generate_until([SimpleNamespace(args=("alpha", {}), task_name="g")])
  # The whole `cardjax eval --harness` path, with the default method, on multiple choice.
  from cardjax.cli import main
  out = path / "mc.json"
  assert main(["eval", "--checkpoint", str(path), "--harness", "tiny_mc", "--include-path",
               str(folder), "--elbo-draws", "4", "--bootstrap-iters", "0", "--output",
               str(out)]) == 0
  mc = json.loads(out.read_text())["results"]["tiny_mc"]
  assert "acc,none" in mc and mc["cardjax"]["elbo_draws"] == 4


def test_arith_sft_documents_are_the_builds_problems_in_its_order(tmp_path):
  """`cardjax eval --task arith` reads the first N problems of the built test split, which
  tfds stores in its own order: the harness task's first N are the same N, in that order."""
  from cardjax.data import builders
  from cardjax.eval.harness import documents

  options = {"train_size": 30, "test_size": 40, "seed": 3}
  builders.build("arith_sft", tmp_path, **options)
  source = builders.load_source("arith_sft", "test", tmp_path, **options)
  built = [builders.decode(source[i]) for i in range(len(source))]
  docs = documents.arith_sft(seed=3, test_size=40)["test"]
  assert [d["messages"][0]["content"] for d in built] == docs["question"]
  assert [d["answer"] for d in built] == docs["answer"]


def test_a_trained_run_scores_as_the_hf_model(tmp_path):
  """The same scoring parity on a run the trainer made (tiny_sft, 30 steps on arith_sft),
  not a random init: its export-hf folder through lm-eval's `hf` model."""
  from cardjax.config import load_config
  from cardjax.data.prepare import prepare
  from cardjax.train import train

  overrides = [f"--config.data.data_dir={tmp_path / 'data'}", "--config.model.hidden_size=32",
               "--config.model.intermediate_size=64", "--config.data.batch_size=8",
               "--config.data.options.train_size=240", "--config.data.options.test_size=8",
               "--config.train.progress=false", "--config.train.eval_every=0",
               "--config.train.eval_steps=1", "--config.train.steps=30",
               "--config.train.checkpoint_every=30"]
  config = load_config("configs/tiny_sft.py", overrides)
  prepare(config)
  train(config, str(tmp_path / "run"))
  subprocess.run([sys.executable, "-m", "cardjax.cli", "export-hf",
                  str(tmp_path / "run" / "checkpoints"), str(tmp_path / "hf")], check=True,
                 capture_output=True)
  folder = _tasks(tmp_path / "tasks")
  names = ["tiny_mc", "tiny_roll"]
  with pytest.MonkeyPatch.context() as mp:
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
      mp.setenv(key, "1")
    ref = _evaluate("hf", {"pretrained": str(tmp_path / "hf"), **HF_ARGS}, folder, names)
    got = _evaluate("cardjax", {"checkpoint": str(tmp_path / "run"), "batch_size": 4}, folder,
                    names)
  assert got["results"]["tiny_mc"]["acc,none"] == ref["results"]["tiny_mc"]["acc,none"]
  for task in names:
    mine, theirs = _responses(got, task), _responses(ref, task)
    assert sorted(mine) == sorted(theirs) and len(mine) > 3
    for doc, answers in theirs.items():
      for a, b in zip(mine[doc], answers, strict=True):
        a, b = (a, b) if task == "tiny_mc" else ((a,), (b,))
        assert abs(a[0] - b[0]) / max(1.0, abs(b[0])) < TOLERANCE, (task, doc, a, b)
        assert a[1:] == b[1:], (task, doc)



@pytest.mark.parametrize("objective,method,settings", [
    ("card", "card", {"block_size": 4}), ("mdlm", "dus", {}), ("mdlm", "eb", {}),
    ("mdlm", "cb", {})])
def test_diffusion_methods_generate_through_the_harness(setup, tmp_path, objective, method,
                                                        settings):
  """generate_until decodes with the checkpoint's diffusion methods too (CARD blocks, and
  DUS / EB / CB on MDLM), reporting their forwards."""
  import shutil

  run, _, folder = setup
  shutil.copytree(run.parent / "tok", tmp_path / "tok")
  path, _ = _mdlm_run(tmp_path, objective, **settings)
  got, block = _cli(path, folder, tmp_path / "out.json", "--method", method)
  assert sorted(got) == list(range(len(PROMPTS)))
  assert block["method"] == method and block["objective"] == objective
  g = block["generate_until"]
  assert g["requests"] == len(PROMPTS) and g["tokens"] > 0 and g["forwards"] > 0
