"""`make demo`: the main job in miniature, on CPU, with every artefact under one folder.

Build the embedded datasets and their tokenizers, stream packed and SFT batches through the
grain pipeline, run the tiny model on them, fine-tune MARS on arith_sft from the kept
arithmetic instruct model (INSTRUCT; --train-sft trains it first) and train AR and CARD
models on python_stdlib with the decode benchmark's recipes (configs/decode_bench.py,
shortened: BUDGETS), save an orbax checkpoint (with the data iterator's state), export it
as a Hugging Face folder, and load that back into cardjax and (when installed) into
transformers, comparing logits. Last, decode with every method (AR
with a KV cache, MARS over tau, self-verified MARS, CARD blocks, DUS, EB, CB), print speed
against AR and quality (cardjax.eval.suite), what a forward of w tokens costs against one
of 1 token on this machine and the latest accelerator measurement, and draw two pictures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

SFT = ["--config.data.dataset=arith_sft", "--config.data.mode=sft",
       "--config.data.pad_to_multiple=4", "--config.data.eval_split=test"]


def _stage(name: str):
  print(f"== {name}", flush=True)
  return time.time()


def _nll(model, batch) -> float:
  """Mean next-token NLL over loss-carrying targets inside one segment."""
  logits = model(jnp.asarray(batch["tokens"]), positions=jnp.asarray(batch["positions"]),
                 segment_ids=jnp.asarray(batch["segment_ids"]))
  seg = batch["segment_ids"]
  weights = batch["loss_mask"][:, 1:] * (seg[:, 1:] == seg[:, :-1])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1],
                                                       jnp.asarray(batch["tokens"][:, 1:]))
  return float((ce * weights).sum() / max(weights.sum(), 1))


# "full": the decode benchmark's recipes (configs/decode_bench.py: 128 x 4 layers),
# shortened to where decoding means something: the MARS fine-tune writes several tokens a
# forward at the instruct model's exact match, and the code models write varied text
# (results/recipes/demo_budget_2026-12-06.json found how far each recipe must go). "quick":
# the repo's tiny configs (64 x 2) for a few steps, a tour of every stage in a couple of
# minutes, its models too short to decode well.
BUDGETS = {"full": {"sft": 2500, "mars": 300, "ar": 300, "card": 300},
           "quick": {"sft": 60, "mars": 60, "ar": 60, "card": 60}}
# What a shortened run changes besides its steps: the SFT recipe holds its learning rate
# and decays over the last fifth (a cosine over fewer steps decays before the model
# learns to add: 31% exact match at 2000 steps, against 35-64% at step 2000 of 4000).
SHORTENED = {"sft": ("--config.train.schedule=wsd", "--config.train.decay_fraction=0.2")}
RUNS = (("sft", "sft", ()), ("mars", "mars", ("init_from_sft",)), ("ar", "ar", ()),
        ("card", "card", ()))
# MARS turns an instruct AR model into a multi-token one, so the full demo starts where a
# user starts (from SmolLM2-135M-Instruct or Qwen2.5-Instruct): from a trained instruct
# model, the decode benchmark's arithmetic SFT model (configs/decode_bench.py:sft, 4000
# steps, seed 0: 91.4% exact match on the demo's 128 problems), kept in the repository.
# Training it in the demo too costs about 9 minutes more on 2 cores (--train-sft: the
# 2500-step shortened recipe, 78% exact match).
INSTRUCT = Path(__file__).resolve().parents[1] / "results" / "bench_pack" / "runs" / "sft"


def config_file(recipe: str, budget: str) -> str:
  """The config a RUNS recipe trains with at `budget`."""
  # Recipe names, not paths: found in the repository's configs/ or the wheel's copy,
  # whatever the working directory holds.
  return f"decode_bench:{recipe}" if budget == "full" else f"tiny_{recipe}"


def instruct_model(tokenizer_folder: Path, instruct: Path = INSTRUCT) -> Path | None:
  """The kept instruct model's run folder, or None (and a line saying why) when it is not
  in this install or was trained with another tokenizer than the one the demo built (its
  ids would mean other text)."""
  kept = instruct / "checkpoints" / "hf_assets" / "tokenizer.json"
  if not kept.is_file():
    print(f"   the kept instruct model is not in this install ({instruct}: a wheel carries "
          "no trained models); the demo trains it first, about 9 minutes more on 2 cores "
          "(from a clone of the repository it is loaded instead)")
    return None
  if kept.read_bytes() != (Path(tokenizer_folder) / "tokenizer.json").read_bytes():
    print(f"   the kept instruct model ({instruct}) was trained with another arith_sft "
          "tokenizer than the one built here; the demo trains its own")
    return None
  return instruct


def _train_models(workdir: Path, base, budget: str = "full",
                  instruct: Path | None = None, steps: int = 0) -> tuple[dict, dict]:
  """The decode benchmark's recipes at the budget's steps; MARS starts from the SFT run
  (the recipe), or from `instruct` (an SFT run folder), which then is not trained. Returns
  the report's rows and each run's folder."""
  from cardjax.checkpoint import latest_step
  from cardjax.config import load_config
  from cardjax.train import train

  results, folders = {}, {}
  print("   | run | steps | first loss | last loss | validation AR NLL |")
  for name, recipe, flags in RUNS:
    if name == "sft" and instruct is not None:
      folders[name] = instruct
      kept_steps = latest_step(instruct / "checkpoints")
      results[name] = {"loaded_from": str(instruct), "steps": kept_steps}
      print(f"   | sft | {kept_steps} (kept, loaded from {instruct}) | | | |", flush=True)
      continue
    n = steps or BUDGETS[budget][name]
    extra = [f"--config.train.steps={n}", "--config.train.eval_every=0",
             f"--config.train.checkpoint_every={n}", "--config.train.log_every=10",
             "--config.train.keep_checkpoints=1"]
    if budget == "full":
      extra += SHORTENED.get(name, ())
    if "init_from_sft" in flags:
      extra.append(f"--config.train.init_from={folders['sft'] / 'checkpoints'}")
    config = load_config(config_file(recipe, budget), list(base) + extra)
    folders[name] = workdir / "runs" / name
    out = train(config, folders[name])
    text = (folders[name] / "metrics.jsonl").read_text()
    lines = [json.loads(l) for l in text.splitlines()]
    losses = [l["train/loss"] for l in lines if "train/loss" in l]
    results[name] = {"steps": n, "first_loss": losses[0], "last_loss": losses[-1],
                     "eval_ar_nll": out["eval"]["ar_nll"]}
    print(f"   | {name} | {n} | {losses[0]:.3f} | {losses[-1]:.3f} | "
          f"{out['eval']['ar_nll']:.3f} |", flush=True)
  return results, folders


CODE_PROMPTS, BATCH, BLOCK = 16, 16, 4
# Arithmetic problems decoded: at the full budget 128 (one problem is 0.8 points; the first
# 64 are easier than the rest for the instruct model), at the quick one 64 (its models are
# too short to decode well, so more problems would only cost time).
ARITH_PROBLEMS = {"full": 128, "quick": 64}


def _decode(workdir: Path, folders: dict, data, budget: str = "full",
            kept_sft: bool = False) -> list[dict]:
  """The decode benchmark in miniature on the demo's runs (benchmarks/decode.py in full);
  kept_sft: the SFT model was loaded, not trained here. The prompts come from the demo's
  own data folder `data`, never from the one a run stored (a kept run was trained on
  another machine; the tokenizers match, stage 4 checked)."""
  from cardjax.eval import suite

  runs = {name: suite.load_run(folder) for name, folder in folders.items()}
  for loaded in runs.values():
    loaded.config.data.data_dir = str(data)
  print("   " + suite.HEADER.replace("\n", "\n   "), flush=True)
  log = lambda line: print("   " + line, flush=True)  # noqa: E731
  rows = suite.arith_rows(runs["sft"], runs["mars"],
                          suite.arith_inputs(runs["sft"], ARITH_PROBLEMS[budget]), batches=(BATCH,),
                          taus=(1.0, 0.95, 0.8), block=BLOCK, cache_block=8,
                          max_new_tokens=96, log=log, full_window=False)
  rows += suite.code_rows(runs["ar"], {"card": runs["card"]}, {},
                          suite.code_inputs(runs["ar"], CODE_PROMPTS, prompt_len=16),
                          batches=(BATCH,), taus=(0.9, 0.5), block=8, max_new_tokens=32,
                          log=log)
  (workdir / "decode.md").write_text(suite.table(rows) + "\n")
  print("   tokens/forward counts each row's forwards while it generates (AR: 1.00); the '= "
        "AR tokens' checks are the invariants (MARS at tau 1 and --verify write AR's greedy "
        "tokens).")
  _same_text(rows)
  _summary(rows, runs["sft"], budget, kept_sft)
  return rows


def _same_text(rows: list[dict]) -> None:
  """Says which code rows wrote the same tokens as another, and why, beyond the invariants
  the table marks (a CARD model decoding in AR order writes its AR tokens)."""
  groups: dict = {}
  for row in rows:
    if row["task"] == "code" and "equals_ar" not in row:
      key = (row["model"], round(row["judge_nll"], 6), round(row["tokens_per_forward"], 4))
      groups.setdefault(key, []).append(f"{row['method']} {row['setting']}")
  for (model, _, per_forward), names in groups.items():
    if len(names) > 1:
      why = (" (no slot passed their thresholds, so each forward revealed its most "
             "confident one)" if per_forward == 1.0 else "")
      print(f"   {model}: {'; '.join(names)} wrote the same tokens{why}.")


def _summary(rows: list[dict], sft, budget: str, kept_sft: bool) -> None:
  """What the table says about the claim, and why a CPU shows little of it in seconds."""
  from cardjax.demo_speed import accelerator_line, forward_cost_line, forward_costs

  def arith(model, method, setting=None):
    return next(r for r in rows if r["task"] == "arith" and r["model"] == model and
                r["method"] == method and setting in (None, r["setting"]))

  base, own = arith("sft", "ar"), arith("mars", "ar")
  mars, verify = arith("mars", "mars", "tau=0.95 window"), arith("mars", "mars --verify")
  print(f"   MARS at tau 0.95 wrote {mars['tokens_per_forward']:.2f} tokens a forward at "
        f"{100 * mars['exact_match']:.1f}% exact match, against "
        f"{100 * own['exact_match']:.1f}% for the same model one token a forward (AR) and "
        f"{100 * base['exact_match']:.1f}% for the "
        f"{'kept instruct' if kept_sft else 'AR SFT'} model it started from; self-verified "
        f"MARS wrote AR's tokens at {verify['tokens_per_forward']:.2f} a forward. On this "
        f"CPU that is {mars['speedup']:.2f}x and {verify['speedup']:.2f}x the SFT model's AR "
        "tokens/s.")
  if budget == "quick":
    print("   (quick budget: these models are too short to decode well; `cardjax demo` "
          "without --quick trains them until they do)")
  costs = forward_costs(sft, BATCH, (1, 1 + BLOCK, 2 * BLOCK))
  print("   " + forward_cost_line(costs, {1 + BLOCK: "MARS's narrow window",
                                         2 * BLOCK: "MARS's 2B window"}) +
        f" (batch {BATCH}): a forward costs about its tokens on a CPU, so tokens a forward "
        "buy little speed here.")
  print("   " + accelerator_line() + ".")


def add_arguments(p) -> None:
  p.add_argument("--workdir", default="runs/demo", help="where every artefact is written")
  p.add_argument("--quick", action="store_true",
                 help="a few training steps per model: every stage in a couple of minutes, "
                      "its models too short to decode well")
  p.add_argument("--steps", type=int, default=0,
                 help="train each model this many steps instead of the budget's: a check "
                      "that every stage runs on this machine, in a few minutes (its models "
                      "decode poorly)")
  p.add_argument("--train-sft", action="store_true",
                 help="train the arithmetic instruct (AR SFT) model too instead of loading "
                      "the one kept in the repository (about 9 minutes more on 2 cores)")


def run(args) -> None:
  """`cardjax demo`: its --config.k=v overrides apply to every config the demo loads."""
  if args.steps < 0:
    raise SystemExit(f"cardjax demo: --steps {args.steps}: give a positive number of steps "
                     "(0 = the budget's)")
  run_demo(args.workdir, args.overrides, budget="quick" if args.quick else "full",
           train_sft=args.train_sft, steps=args.steps)


def run_demo(workdir: str | Path, overrides=(), budget: str = "full",
             train_sft: bool = False, steps: int = 0) -> dict:
  """Every stage under `workdir`. The full budget starts MARS from the kept instruct model
  (INSTRUCT) unless train_sft; the quick one trains its tiny models, the SFT one too.
  steps: each trained model's steps instead of the budget's (0: the budget's)."""
  from cardjax import checkpoint, hf
  from cardjax.config import load_config, model_config
  from cardjax.data import builders
  from cardjax.data.prepare import (builder_options, data_dir, load_data_tokenizer, make_loader,
                                    pipeline_spec, prepare, tokenizer_dir)
  from cardjax.data.show import show_rows
  from cardjax.model import create_model, param_count

  from cardjax.storage import checked_path, check, is_remote, resolve
  from cardjax.storage.cache import staging_dir
  from cardjax.storage.transfer import cached_copy

  check(workdir)
  # An epath.Path: a local folder or a bucket (gs://, s3://). A bucket demo builds its
  # datasets in the local staging folder (inputs, rebuilt from the embedded sources).
  workdir = checked_path(resolve(workdir))
  if not is_remote(workdir):  # a bucket has no folders to make
    workdir.mkdir(parents=True, exist_ok=True)
  report: dict = {"jax": jax.__version__, "backend": jax.default_backend()}
  data = staging_dir(str(workdir)) / "data" if is_remote(workdir) else workdir / "data"
  base = [f"--config.data.data_dir={data}", *overrides]
  pretrain = load_config("tiny", base)
  sft = load_config("tiny", base + SFT)

  t = _stage("1/7 build the embedded datasets and their tokenizers")
  for name, config in (("python_stdlib", pretrain), ("arith_sft", sft)):
    builder, tokenizer = prepare(config)
    splits = {k: v.num_examples for k, v in builder.info.splits.items()}
    report[f"{name}_splits"] = splits
    print(f"   {name}: {splits}, tokenizer {tokenizer.vocab_size} ids")
  print(f"   ({time.time() - t:.1f}s)")

  t = _stage("2/7 stream batches through the grain pipeline")
  loaders = {"python_stdlib": make_loader(pretrain), "arith_sft": make_loader(sft)}
  batches = {name: next(loader) for name, loader in loaders.items()}
  for name, batch in batches.items():
    fill = float((batch["segment_ids"] > 0).mean())
    print(f"   {name}: tokens {list(batch['tokens'].shape)}, {fill:.0%} of slots used, "
          f"{int(batch['loss_mask'].sum())} loss tokens")
  source = builders.load_source("arith_sft", "test", data_dir(sft), **builder_options(sft))
  spec = pipeline_spec(sft, packing=False)
  print("   an SFT row, loss on \u27e6response tokens\u27e7:\n" + "\n".join(
      "   " + line for line in show_rows(source, load_data_tokenizer(sft), spec, 1)[0]
      .splitlines()))
  print(f"   ({time.time() - t:.1f}s)")

  t = _stage("3/7 run the tiny model (configs/tiny.py) on real batches")
  cfg = model_config(pretrain)
  model = create_model(cfg, seed=pretrain.seed)
  report["params"] = param_count(model)
  for name, batch in batches.items():
    report[f"init_nll_{name}"] = _nll(model, batch)
  print(f"   {report['params']:,} parameters; untrained next-token NLL "
        f"{report['init_nll_python_stdlib']:.3f} (code), {report['init_nll_arith_sft']:.3f} "
        f"(SFT responses); uniform would be {np.log(cfg.vocab_size):.3f} "
        f"({time.time() - t:.1f}s)")

  kept = budget == "full" and not train_sft
  t = _stage(f"4/7 train {'MARS from the kept instruct model' if kept else 'AR SFT then MARS'} "
             f"on arith_sft, AR and CARD on python_stdlib ({budget} budget)")
  instruct = instruct_model(tokenizer_dir(sft)) if kept else None
  report["training"], folders = _train_models(workdir, base, budget, instruct, steps)
  print(f"   ({time.time() - t:.1f}s)")

  t = _stage("5/7 save and restore an orbax checkpoint (model + data iterator)")
  ckpt = checkpoint.save_model(workdir / "checkpoints", model, step=0,
                               data_loader=loaders["python_stdlib"])
  restored, _ = checkpoint.restore_model(ckpt)
  tokens = jnp.asarray(batches["python_stdlib"]["tokens"][:2])
  logits = np.asarray(model(tokens))
  report["orbax_max_abs_diff"] = float(np.abs(np.asarray(restored(tokens)) - logits).max())
  resumed = make_loader(pretrain)
  checkpoint.restore_data_state(ckpt, resumed)
  same = all(np.array_equal(a, b) for a, b in zip(next(resumed).values(),
                                                   next(loaders["python_stdlib"]).values()))
  report["data_resume_exact"] = same
  print(f"   {ckpt}: logits differ by {report['orbax_max_abs_diff']:.2e}; resumed data "
        f"iterator gives the same next batch: {same} ({time.time() - t:.1f}s)")

  t = _stage("6/7 export to Hugging Face, import back, load in transformers")
  hf_dir = hf.save_pretrained(restored, workdir / "hf", assets_from=tokenizer_dir(pretrain))
  reimported = hf.from_pretrained(hf_dir)
  report["hf_roundtrip_max_abs_diff"] = float(
      np.abs(np.asarray(reimported(tokens)) - logits).max())
  message = f"   {hf_dir}: re-imported logits differ by {report['hf_roundtrip_max_abs_diff']:.2e}"
  try:
    import torch
    import transformers
  except ImportError:
    message += "; transformers not installed (pip install -e '.[test]')"
  else:
    tm = transformers.AutoModelForCausalLM.from_pretrained(cached_copy(hf_dir),
                                                           dtype=torch.float32)
    with torch.no_grad():
      ref = tm.eval()(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    report["transformers_max_abs_diff"] = float(np.abs(ref - logits).max())
    message += (f"; transformers {transformers.__version__} differs by "
                f"{report['transformers_max_abs_diff']:.2e}")
  print(message + f" ({time.time() - t:.1f}s)")
  for loader in loaders.values():
    loader.close()

  t = _stage("7/7 decode with every method: speed against AR with a KV cache, and quality")
  report["decoding"] = _decode(workdir, folders, data, budget, instruct is not None)
  print(f"   ({time.time() - t:.1f}s)")
  from cardjax.demo_figures import draw

  trained = {name: folders[name] for name in report["training"]
             if "loaded_from" not in report["training"][name]}
  pictures = draw(workdir, trained, report["decoding"]) if not is_remote(workdir) else []
  (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
  print(f"== done: every artefact is under {workdir}; summary in report.json" +
        "".join(f"\n   picture: {p}" for p in pictures))
  return report
