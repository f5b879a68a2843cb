"""The decoding comparison: every method against AR with a KV cache, speed and quality.

Two task families, as in the papers:
- arith (MARS): an AR SFT model and its MARS fine-tune on arith_sft; quality is exact
  match on the test split; MARS over a tau sweep (window and block-level cache) and
  self-verified MARS, against AR on the SFT model.
- code (CARD, MDLM): AR, CARD (clean_fraction 0 and 0.5) and MDLM models on
  python_stdlib; quality is the NLL of the continuation under the AR model; CARD blocks
  with the confidence planner over a tau sweep, DUS, EB and CB, and MDLM with DUS against
  the confidence planner at the same number of forwards (topk).
Speedup is tokens/s over AR with a KV cache at the same batch size, measured in this run.
benchmarks/decode.py and the demo's decode stage both call `arith_rows` / `code_rows`.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Sequence

from cardjax.decoding import evaluate
from cardjax.decoding.frozen import Frozen
from cardjax.decoding.methods import Options, make_decoder


@dataclasses.dataclass
class LoadedRun:
  model: object
  config: object  # the run's full config
  tokenizer: object
  objective: str | None

  @functools.cached_property
  def frozen(self) -> Frozen:
    """The model split once: every decoder of the comparison shares its compiled loops."""
    return Frozen(self.model)


def load_run(run_dir: str | Path) -> LoadedRun:
  """The latest checkpoint of a training run with its config, tokenizer and objective."""
  from cardjax import checkpoint
  from cardjax.config import merge_into_base

  root = Path(run_dir)
  root = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  model, _ = checkpoint.restore_model(root)
  config = merge_into_base(checkpoint.read_run_config(root))
  return LoadedRun(model, config, checkpoint.load_tokenizer(root, model.cfg),
                   config.objective.name)


def _row(task, model, method, setting, run: evaluate.Run, base: evaluate.Run | None, **quality):
  row = {"task": task, "model": model, "method": method, "setting": setting,
         "batch": run.batch, "tokens": run.tokens, "forwards": run.forwards,
         "tokens_per_forward": run.tokens_per_forward,
         "tokens_per_second": run.tokens_per_second,
         "tokens_per_second_range": list(run.tokens_per_second_range),
         "speedup": run.tokens_per_second / base.tokens_per_second if base else 1.0}
  row.update(quality)
  return row


def arith_inputs(sft: LoadedRun, n: int) -> dict:
  """The first n arith test problems: chat-rendered prompt ids and their answers."""
  prompts, answers = evaluate.arith_problems(sft.config, sft.tokenizer, n)
  return {"prompts": prompts, "answers": answers}


def code_inputs(ar: LoadedRun, n: int, prompt_len: int) -> dict:
  """n code prompts of prompt_len ids from the held-out documents."""
  return {"prompts": evaluate.code_prompts(ar.config, ar.tokenizer, n, prompt_len)}


def arith_rows(sft: LoadedRun, mars: LoadedRun, inputs: dict, batches: Sequence[int],
               taus: Sequence[float], block: int, cache_block: int, max_new_tokens: int,
               log=print, repeats: int = 1, min_seconds: float = 0.0) -> list[dict]:
  """AR (SFT model), MARS sweeps and self-verified MARS on arith problems (arith_inputs:
  kept as plain ids, so a saved set runs where the dataset is not built)."""
  tok = sft.tokenizer
  prompts, answers = inputs["prompts"], inputs["answers"]
  base_opt = Options(max_new_tokens=max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                     block=block)
  rows = []

  def timed(decode, prompts_, batch_):
    return evaluate.timed(decode, prompts_, batch_, repeats, min_seconds)

  def add(run_, model_name, method, setting, base):
    em = evaluate.exact_match(run_.rows, answers, tok)
    rows.append(_row("arith", model_name, method, setting, run_, base, exact_match=em))
    log(format_row(rows[-1]))
    return run_

  for batch in batches:
    ar = add(timed(make_decoder("ar", sft.frozen, sft.objective, base_opt), prompts,
                            batch), "sft", "ar", "kv cache", None)
    mars_ar = add(timed(make_decoder("ar", mars.frozen, mars.objective, base_opt),
                                 prompts, batch), "mars", "ar", "kv cache", ar)
    for tau in taus:
      opt = dataclasses.replace(base_opt, tau=tau)
      # The pending-sized window (the default) and the 2B-wide one: the same tokens.
      settings = [(opt, f"tau={tau} window"),
                  (dataclasses.replace(opt, window="full"), f"tau={tau} window 2B")]
      if cache_block:
        settings.append((dataclasses.replace(opt, cache_block=cache_block),
                         f"tau={tau} cache{cache_block}"))
      for opt_, setting in settings:
        got = add(timed(make_decoder("mars", mars.frozen, mars.objective, opt_),
                                 prompts, batch), "mars", "mars", setting, ar)
        if tau == 1.0:  # the invariant: MARS at tau = 1 is AR greedy
          rows[-1]["equals_ar"] = got.rows == mars_ar.rows
    verified = add(timed(make_decoder(
        "mars", mars.frozen, mars.objective, dataclasses.replace(base_opt, verify=True)),
        prompts, batch), "mars", "mars --verify", f"B={block}", ar)
    rows[-1]["equals_ar"] = verified.rows == mars_ar.rows
  return rows


def code_rows(ar: LoadedRun, cards: dict, mdlm: LoadedRun | None, inputs: dict,
              batches: Sequence[int], taus: Sequence[float], block: int, max_new_tokens: int,
              log=print, repeats: int = 1, min_seconds: float = 0.0) -> list[dict]:
  """AR, CARD (each of `cards`: name -> run) and MDLM continuations of code prompts
  (code_inputs)."""
  tok = ar.tokenizer
  prompts = inputs["prompts"]
  # No stop ids: every method writes max_new_tokens, so forwards follow the schedule.
  base_opt = Options(max_new_tokens=max_new_tokens, pad_id=tok.pad_id, block=block)
  rows = []

  def add(run_, model_name, method, setting, base):
    nll = evaluate.judge_nll(ar.model, prompts, run_.rows)
    rows.append(_row("code", model_name, method, setting, run_, base, judge_nll=nll))
    log(format_row(rows[-1]))
    return run_

  def go(run: LoadedRun, method, opt, batch):
    return evaluate.timed(make_decoder(method, run.frozen, run.objective, opt), prompts, batch,
                          repeats, min_seconds)

  for batch in batches:
    base = add(go(ar, "ar", base_opt, batch), "ar", "ar", "kv cache", None)
    for name, card in cards.items():
      card_ar = add(go(card, "ar", base_opt, batch), name, "ar", "kv cache", base)
      ltr = add(go(card, "card", dataclasses.replace(base_opt, planner="left_to_right"), batch),
                name, "card", f"left_to_right B={block}", base)
      rows[-1]["equals_ar"] = ltr.rows == card_ar.rows  # the invariant: AR order is AR
      for tau in taus:
        add(go(card, "card", dataclasses.replace(base_opt, tau=tau), batch), name, "card",
            f"confidence tau={tau} B={block}", base)
      add(go(card, "dus", base_opt, batch), name, "dus", f"B={block}", base)
      add(go(card, "dus", dataclasses.replace(base_opt, planner="topk"), batch), name,
          "confidence", f"topk, DUS forwards, B={block}", base)
      add(go(card, "eb", base_opt, batch), name, "eb", f"gamma={base_opt.gamma} B={block}",
          base)
      add(go(card, "cb", dataclasses.replace(base_opt, tau=0.7, spacing=True), batch), name,
          "cb", f"tau=0.7 spacing B={block}", base)
    if mdlm is not None:
      shift = bool(mdlm.config.objective.shift)
      opt = dataclasses.replace(base_opt, shift=shift)
      add(go(mdlm, "dus", opt, batch), "mdlm", "dus", f"B={block}", base)
      add(go(mdlm, "dus", dataclasses.replace(opt, planner="topk"), batch), "mdlm",
          "confidence", f"topk, DUS forwards, B={block}", base)
      add(go(mdlm, "eb", dataclasses.replace(opt, spacing=True), batch), "mdlm", "eb",
          f"gamma={opt.gamma} spacing B={block}", base)
  return rows


HEADER = ("| task | model | method | setting | batch | tokens/forward | tokens/s median "
          "[range] | speedup vs AR | quality |\n|---|---|---|---|---|---|---|---|---|")
QUALITY = {"exact_match": "EM", "judge_nll": "NLL"}


def merge_seeds(by_seed: dict[int, list[dict]]) -> list[dict]:
  """The first seed's rows (speed: its timings), each with the quality of the same decoder
  (task, model, method, setting) under every seed: `{quality}_seeds`, and the quality
  itself replaced by the mean over seeds. Seeds after the first may be decoded at one batch
  size only (their quality does not depend on it); a row takes the same batch's figure where
  there is one, else any batch's."""
  seeds = sorted(by_seed)
  out = []
  for row in by_seed[seeds[0]]:
    key = (row["task"], row["model"], row["method"], row["setting"])
    metric = next(q for q in QUALITY if q in row)
    values, same = [], []
    for seed in seeds:
      match = [r for r in by_seed[seed] if (r["task"], r["model"], r["method"],
                                           r["setting"]) == key]
      if not match:
        raise ValueError(f"seed {seed} has no row for {key}; decode every seed with the "
                         "same methods")
      pick = next((r for r in match if r["batch"] == row["batch"]), match[0])
      values.append(pick[metric])
      same.append(pick.get("equals_ar"))
    merged = {**row, metric: sum(values) / len(values), f"{metric}_seeds": values,
              "seeds": seeds}
    if "equals_ar" in row:
      merged["equals_ar"] = all(s is not False for s in same)
    out.append(merged)
  return out


def format_row(row: dict) -> str:
  metric = next(q for q in QUALITY if q in row)
  fmt = (lambda v: f"{100 * v:.1f}%") if metric == "exact_match" else (lambda v: f"{v:.3f}")
  quality = f"{QUALITY[metric]} {fmt(row[metric])}"
  values = row.get(f"{metric}_seeds")
  if values and len(values) > 1:
    quality += f" [{fmt(min(values))}-{fmt(max(values))}, {len(values)} seeds]"
  if "equals_ar" in row:
    quality += " (= AR tokens)" if row["equals_ar"] else " (DIFFERS from AR)"
  low, high = row.get("tokens_per_second_range", (row["tokens_per_second"],) * 2)
  return (f"| {row['task']} | {row['model']} | {row['method']} | {row['setting']} | "
          f"{row['batch']} | {row['tokens_per_forward']:.2f} | {row['tokens_per_second']:.0f} "
          f"[{low:.0f}-{high:.0f}] | {row['speedup']:.2f}x | {quality} |")


def table(rows: Sequence[dict]) -> str:
  return "\n".join([HEADER] + [format_row(r) for r in rows])
