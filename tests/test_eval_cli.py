"""`cardjax eval` on the demo's runs (trained the demo's way, a few steps each): nll is the
trainer's validation, arith the decode comparison's exact match and forwards; jsonl on a
file whose expected score is known from greedy decoding in-process; --compare; errors."""

import json

import pytest

from cardjax.cli import main
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.demo import RUNS, SFT, config_file
from cardjax.train import train

STEPS = 3
SMALL = ["--config.data.options.max_files=40", "--config.data.options.validation_percent=10",
         "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.data.seq_len=64", "--config.train.progress=false",
         "--config.train.eval_steps=2", "--config.train.log_every=1"]
ARITH = ["--config.data.options.train_size=64", "--config.data.options.test_size=12"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The demo's runs (demo.RUNS at its quick budget's configs, MARS from the SFT run),
  small."""
  root = tmp_path_factory.mktemp("eval")
  base = [f"--config.data.data_dir={root / 'data'}"]
  prepare(load_config("configs/tiny_ar.py", base + SMALL))
  prepare(load_config("configs/tiny_sft.py", base + SFT + SMALL[2:] + ARITH))
  out = {}
  for name, recipe, flags in RUNS:
    if name == "card":
      continue  # nll and arith read the AR, SFT and MARS runs
    extra = [f"--config.train.steps={STEPS}", f"--config.train.checkpoint_every={STEPS}"]
    options = SMALL if name == "ar" else SMALL[2:] + ARITH
    if "init_from_sft" in flags:
      extra.append(f"--config.train.init_from={root / 'sft' / 'checkpoints'}")
    config = load_config(config_file(recipe, "quick"), base + list(options) + extra)
    result = train(config, root / name)
    out[name] = {"dir": root / name, "eval": result["eval"]}
  out["root"] = root
  return out


def _eval(tmp_path, capsys, *args):
  out = tmp_path / "report.json"
  capsys.readouterr()
  assert main(["eval", *args, "--out", str(out)]) == 0, capsys.readouterr().err
  return json.loads(out.read_text()), capsys.readouterr().out


def test_nll_is_the_trainers_validation(runs, tmp_path, capsys):
  for name in ("ar", "sft", "mars"):
    report, printed = _eval(tmp_path, capsys, "--checkpoint", str(runs[name]["dir"]),
                            "--task", "nll")
    metrics = report["runs"][0]["metrics"]
    assert metrics["ar_nll"] == pytest.approx(runs[name]["eval"]["ar_nll"], abs=1e-6), name
    assert metrics["loss"] == pytest.approx(runs[name]["eval"]["loss"], abs=1e-6), name
    assert metrics["batches"] == 2 and metrics["split"] in ("validation", "test")
    assert "| ar_nll |" in printed and "| perplexity |" in printed
  assert report["machine"]["jax"] and report["task"] == {"name": "nll"}
  # Another built dataset (its split found: validation), with the checkpoint's tokenizer.
  report, _ = _eval(tmp_path, capsys, "--checkpoint", str(runs["sft"]["dir"]), "--task", "nll",
                    "--dataset", "python_stdlib", "--option", "max_files=40", "--option",
                    "validation_percent=10", "--batches", "1")
  metrics = report["runs"][0]["metrics"]
  assert metrics["dataset"] == "python_stdlib" and metrics["split"] == "validation"
  assert metrics["ar_nll"] > 0 and metrics["batches"] == 1


def test_arith_is_the_decode_comparisons_numbers(runs, tmp_path, capsys):
  """The demo's decode stage (eval.suite.arith_rows) and `cardjax eval --task arith` agree
  on exact match, tokens and forwards for AR, MARS and self-verified MARS."""
  from cardjax.eval import suite

  sft, mars = (suite.load_run(runs[n]["dir"]) for n in ("sft", "mars"))
  rows = suite.arith_rows(sft, mars, suite.arith_inputs(sft, 8), batches=(4,), taus=(0.9,),
                          block=4, cache_block=0, max_new_tokens=24, log=lambda line: None)
  row = {(r["model"], r["method"], r["setting"]): r for r in rows}
  common = ["--task", "arith", "--n", "8", "--batch", "4", "--max-new-tokens", "24"]
  cases = [("sft", [], ("sft", "ar", "kv cache")),
           ("mars", ["--method", "mars", "--tau", "0.9"], ("mars", "mars", "tau=0.9 window")),
           ("mars", ["--method", "mars", "--verify"], ("mars", "mars --verify", "B=4"))]
  for name, flags, key in cases:
    report, printed = _eval(tmp_path, capsys, "--checkpoint", str(runs[name]["dir"]),
                            *common, *flags)
    got, want = report["runs"][0]["metrics"], row[key]
    assert got["exact_match"] == want["exact_match"], key
    assert (got["tokens"], got["forwards"]) == (want["tokens"], want["forwards"]), key
    assert got["tokens_per_forward"] == pytest.approx(want["tokens_per_forward"]), key
    assert got["n"] == 8 and len(report["runs"][0]["examples"]) == 8
    assert "| exact_match |" in printed and "| tokens_per_forward |" in printed
  assert report["settings"]["method"] == "mars" and report["settings"]["options"]["verify"]
  assert report["settings"]["options"]["block"] == 4  # the MARS run's objective.block_size


def test_jsonl_scores_what_greedy_decoding_writes(runs, tmp_path, capsys):
  """A random-init model with untied embeddings (its greedy text is arbitrary tokens; a
  3-step or tied one repeats the prompt's last newline) and the SFT run's tokenizer and chat
  template."""
  from cardjax import checkpoint
  from cardjax.decoding.methods import Options, make_decoder
  from cardjax.model import ModelConfig, create_model
  from cardjax.restore import load_run

  model = create_model(ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64,
                                   num_layers=1, mask_token_id=3, eos_token_id=0,
                                   tie_word_embeddings=False), seed=0)
  ckpt = tmp_path / "random"
  checkpoint.save_model(ckpt, model, step=0,
                        assets_from=runs["sft"]["dir"] / "checkpoints" / checkpoint.ASSETS)
  run = load_run(ckpt)
  tok = run.tokenizer
  questions = ["What is 2 + 3?", "Tom has 4 apples.", "How many legs has a cat?"]
  prompts = [tok.encode(tok.render_chat([{"role": "user", "content": q}],
                                        add_generation_prompt=True)) for q in questions]
  opt = Options(max_new_tokens=8, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
  texts = [tok.decode(r, skip_special=True)
           for r in make_decoder("ar", run.model, None, opt)(prompts).rows()]
  assert all(t.strip() for t in texts), texts  # each line below needs a non-empty answer
  lines = [{"q": questions[0], "a": texts[0]}, {"q": questions[1], "a": "not what it wrote"},
           {"q": questions[2], "a": texts[2]}]
  path = tmp_path / "set.jsonl"
  path.write_text("".join(json.dumps(line) + "\n" for line in lines))
  report, printed = _eval(tmp_path, capsys, "--checkpoint", str(ckpt), "--task", "jsonl",
                          "--file", str(path), "--prompt-field", "q", "--answer-field", "a",
                          "--extract", r"(?s)^(.*)$", "--max-new-tokens", "8", "--batch", "2")
  metrics = report["runs"][0]["metrics"]
  assert metrics["exact_match"] == pytest.approx(2 / 3) and metrics["chat_template"] is True
  assert [e["correct"] for e in report["runs"][0]["examples"]] == [True, False, True]
  assert [e["line"] for e in report["runs"][0]["examples"]] == [1, 2, 3]
  assert report["task"]["prompt_field"] == "q" and "66.7%" in printed
  # --no-chat feeds the question as written: other prompts, so other text.
  report, _ = _eval(tmp_path, capsys, "--checkpoint", str(ckpt), "--task", "jsonl", "--file",
                    str(path), "--prompt-field", "q", "--answer-field", "a",
                    "--max-new-tokens", "8", "--no-chat")
  assert report["runs"][0]["metrics"]["chat_template"] is False
  assert report["task"]["chat"] is False


def test_compare_prints_both_and_the_difference(runs, tmp_path, capsys):
  args = ["--task", "arith", "--n", "4", "--batch", "4", "--max-new-tokens", "16"]
  alone, _ = _eval(tmp_path, capsys, "--checkpoint", str(runs["mars"]["dir"]), *args)
  report, printed = _eval(tmp_path, capsys, "--checkpoint", str(runs["sft"]["dir"]),
                          "--compare", str(runs["mars"]["dir"]), *args)
  first, second = (r["metrics"] for r in report["runs"])
  assert [r["checkpoint"] for r in report["runs"]] == [str(runs["sft"]["dir"]),
                                                        str(runs["mars"]["dir"])]
  assert second["tokens"] == alone["runs"][0]["metrics"]["tokens"]  # the same settings
  assert report["difference"]["tokens"] == second["tokens"] - first["tokens"]
  assert report["difference"]["exact_match"] == second["exact_match"] - first["exact_match"]
  header = printed.splitlines()[0]
  assert str(runs["sft"]["dir"]) in header and str(runs["mars"]["dir"]) in header
  assert header.endswith("| difference |")


def test_errors_are_one_line_each(runs, tmp_path, capsys):
  sft = str(runs["sft"]["dir"])

  def error(*args):
    capsys.readouterr()
    assert main(["eval", *args]) == 2
    return capsys.readouterr().err

  assert "checkpoint " + str(tmp_path / "nope") + " does not exist" in error(
      "--checkpoint", str(tmp_path / "nope"), "--task", "nll")
  assert "does not exist" in error("--checkpoint", sft, "--compare", str(tmp_path / "nope"),
                                   "--task", "nll")
  assert "unknown task 'mmlu'; choose one of nll, arith, jsonl" in error(
      "--checkpoint", sft, "--task", "mmlu")
  assert "cannot serve --method card; methods that fit: ar" in error(
      "--checkpoint", sft, "--task", "arith", "--method", "card")
  assert "--task jsonl needs --file" in error("--checkpoint", sft, "--task", "jsonl")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"\n')
  assert "bad.jsonl:2 is not valid JSON" in error("--checkpoint", sft, "--task", "jsonl",
                                                   "--file", str(bad))
  bad.write_text('{"prompt": "a", "answer": "1"}\n\n')
  assert "bad.jsonl:2 is empty" in error("--checkpoint", sft, "--task", "jsonl", "--file",
                                         str(bad))
  assert "--extract '[0-9' is not a valid regular expression" in error(
      "--checkpoint", sft, "--task", "jsonl", "--file", str(bad), "--extract", "[0-9")
  assert "--file is read by --task jsonl only" in error("--checkpoint", sft, "--task", "nll",
                                                        "--file", str(bad))
