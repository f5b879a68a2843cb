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
benchmarks/decode.py and the demo's decode stage both call `arith_rows` / `code_rows`;
`cardjax eval` measures one method the same way (eval/measure.py).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

from cardjax.decoding.methods import Options, make_decoder
from cardjax.eval import inputs as prompt_sets
from cardjax.eval import measure
from cardjax.restore import LoadedRun, load_run

__all__ = ["HEADER", "LoadedRun", "arith_inputs", "arith_rows", "code_inputs", "code_rows",
           "format_row", "load_run", "merge_seeds", "table"]


def _row(task, model, method, setting, timed, base: measure.Run | None, **quality):
  """timed: a Run, or (Run, per-round speedups) from measure.timed_against; the speedup is
  then the median of the rounds' paired ratios, with their range."""
  run, speedups = timed if isinstance(timed, tuple) else (timed, None)
  row = {"task": task, "model": model, "method": method, "setting": setting,
         "batch": run.batch, "tokens": run.tokens, "forwards": run.forwards,
         "tokens_per_forward": run.tokens_per_forward, "batch_fill": run.batch_fill,
         "tokens_per_second": run.tokens_per_second,
         "tokens_per_second_range": list(run.tokens_per_second_range),
         "speedup": run.tokens_per_second / base.tokens_per_second if base else 1.0}
  if speedups:
    row["speedup"] = statistics.median(speedups)
    row["speedup_range"] = [min(speedups), max(speedups)]
  row.update(quality)
  return row


def _timed(decode, prompts, batch: int, base_decode, repeats: int, min_seconds: float):
  """A timed run's rows are paired with the AR reference (measure.timed_against), round by
  round; an untimed one (one pass, no minimum: the demo, other seeds' quality) is not, so
  it decodes once."""
  if base_decode is None or (repeats <= 1 and min_seconds <= 0):
    return measure.timed(decode, prompts, batch, repeats, min_seconds)
  return measure.timed_against(decode, base_decode, prompts, batch, repeats, min_seconds)


def _run(timing) -> measure.Run:
  return timing[0] if isinstance(timing, tuple) else timing


def arith_inputs(sft: LoadedRun, n: int) -> dict:
  """The first n arith test problems: chat-rendered prompt ids and their answers."""
  prompts, answers = prompt_sets.arith_problems(sft.config, sft.tokenizer, n)
  return {"prompts": prompts, "answers": answers}


def code_inputs(ar: LoadedRun, n: int, prompt_len: int) -> dict:
  """n code prompts of prompt_len ids from the held-out documents."""
  return {"prompts": prompt_sets.code_prompts(ar.config, ar.tokenizer, n, prompt_len)}


def arith_rows(sft: LoadedRun, mars: LoadedRun, inputs: dict, batches: Sequence[int],
               taus: Sequence[float], block: int, cache_block: int, max_new_tokens: int,
               log=print, repeats: int = 1, min_seconds: float = 0.0,
               full_window: bool = True, on_row=None) -> list[dict]:
  """AR (SFT model), MARS sweeps and self-verified MARS on arith problems (arith_inputs:
  kept as plain ids, so a saved set runs where the dataset is not built). full_window=False
  leaves out the 2B-window rows (the same tokens as the default window, only slower);
  on_row(row) sees each row as soon as it is measured."""
  tok = sft.tokenizer
  prompts, answers = inputs["prompts"], inputs["answers"]
  base_opt = Options(max_new_tokens=max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                     block=block)
  rows = []

  def timed(decode, batch_, base_decode=None):
    return _timed(decode, prompts, batch_, base_decode, repeats, min_seconds)

  def add(timing, model_name, method, setting, base, same_as=None):
    """same_as: the AR run whose tokens this row must equal (the invariants)."""
    run_ = _run(timing)
    em = measure.exact_match(run_.rows, answers, tok)
    rows.append(_row("arith", model_name, method, setting, timing, base, exact_match=em))
    if same_as is not None:
      rows[-1]["equals_ar"] = run_.rows == same_as.rows
    log(format_row(rows[-1]))
    if on_row:
      on_row(rows[-1])
    return run_

  for batch in batches:
    ar_decode = make_decoder("ar", sft.frozen, sft.objective, base_opt)
    ar = add(timed(ar_decode, batch), "sft", "ar", "kv cache", None)
    mars_ar = add(timed(make_decoder("ar", mars.frozen, mars.objective, base_opt), batch,
                        ar_decode), "mars", "ar", "kv cache", ar)
    for tau in taus:
      opt = dataclasses.replace(base_opt, tau=tau)
      # The pending-sized window (the default) and the 2B-wide one: the same tokens.
      settings = [(opt, f"tau={tau} window")]
      if full_window:
        settings.append((dataclasses.replace(opt, window="full"), f"tau={tau} window 2B"))
      if cache_block:
        settings.append((dataclasses.replace(opt, cache_block=cache_block),
                         f"tau={tau} cache{cache_block}"))
      for opt_, setting in settings:
        # the invariant: MARS at tau = 1 is AR greedy
        add(timed(make_decoder("mars", mars.frozen, mars.objective, opt_), batch,
                  ar_decode), "mars", "mars", setting, ar, mars_ar if tau == 1.0 else None)
    add(timed(make_decoder(
        "mars", mars.frozen, mars.objective, dataclasses.replace(base_opt, verify=True)),
        batch, ar_decode), "mars", "mars --verify", f"B={block}", ar, mars_ar)
  return rows


def code_rows(ar: LoadedRun, cards: dict, mdlms: dict | None, inputs: dict,
              batches: Sequence[int], taus: Sequence[float], block: int, max_new_tokens: int,
              log=print, repeats: int = 1, min_seconds: float = 0.0,
              on_row=None) -> list[dict]:
  """AR, CARD (each of `cards`: name -> run) and MDLM (each of `mdlms`: name -> run)
  continuations of code prompts (code_inputs); on_row(row) sees each row as it comes."""
  tok = ar.tokenizer
  prompts = inputs["prompts"]
  # No stop ids: every method writes max_new_tokens, so forwards follow the schedule.
  base_opt = Options(max_new_tokens=max_new_tokens, pad_id=tok.pad_id, block=block)
  rows = []

  def add(timing, model_name, method, setting, base, same_as=None):
    run_ = _run(timing)
    nll = measure.judge_nll(ar.model, prompts, run_.rows)
    rows.append(_row("code", model_name, method, setting, timing, base, judge_nll=nll))
    if same_as is not None:
      rows[-1]["equals_ar"] = run_.rows == same_as.rows
    log(format_row(rows[-1]))
    if on_row:
      on_row(rows[-1])
    return run_

  def go(run: LoadedRun, method, opt, batch):
    return _timed(make_decoder(method, run.frozen, run.objective, opt), prompts, batch,
                  ar_decode, repeats, min_seconds)

  for batch in batches:
    ar_decode = make_decoder("ar", ar.frozen, ar.objective, base_opt)
    base = add(_timed(ar_decode, prompts, batch, None, repeats, min_seconds), "ar", "ar",
               "kv cache", None)
    for name, card in cards.items():
      card_ar = add(go(card, "ar", base_opt, batch), name, "ar", "kv cache", base)
      add(go(card, "card", dataclasses.replace(base_opt, planner="left_to_right"), batch),
          name, "card", f"left_to_right B={block}", base, card_ar)  # AR order is AR
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
    for name, mdlm in (mdlms or {}).items():
      opt = dataclasses.replace(base_opt, shift=mdlm.shift)
      for setting, method, o in mdlm_settings(opt):
        add(go(mdlm, method, o, batch), name, method, setting, base)
  return rows


# EB's entropy budget in the MDLM rows (bits): at gamma 1 the benchmark's MDLM models take
# one token a forward; at 16 about DUS's forwards at B = 8 (2.67 tokens a forward, seed 0).
EB_GAMMA = 16.0


def mdlm_settings(opt: Options) -> list[tuple[str, str, Options]]:
  """(setting, method, options) of the MDLM rows: the DUS paper's comparison. DUS against
  the confidence planner at the same forwards (topk at DUS's round sizes) at B and at 4B,
  the adaptive EB and CB samplers with the spacing filter off and on, and one token a
  forward (CB at tau 1: the most confident slot only), the quality ceiling. The spacing
  filter's initial gap is B / 4, the DUS code's ratio (8 for blocks of 32): the default 8
  would keep one slot a forward in a block of 8. B is opt.block."""
  block = opt.block
  wide = 4 * block
  rows = []
  for b in (block, wide):
    at_b = dataclasses.replace(opt, block=b)
    rows += [(f"B={b}", "dus", at_b),
             (f"topk, DUS forwards, B={b}", "dus", dataclasses.replace(at_b, planner="topk"))]
  g0 = max(1, block // 4)
  for spacing in (False, True):
    tag = f" spacing g0={g0}" if spacing else ""
    rows += [(f"gamma={EB_GAMMA}{tag} B={block}", "eb",
              dataclasses.replace(opt, gamma=EB_GAMMA, spacing=spacing, g0=g0)),
             (f"tau=0.7{tag} B={block}", "cb", dataclasses.replace(opt, tau=0.7,
                                                                   spacing=spacing, g0=g0))]
  rows.append((f"tau=1 (one token a forward) B={block}", "cb",
               dataclasses.replace(opt, tau=1.0)))
  return rows


HEADER = ("| task | model | method | setting | batch | tokens/forward | tokens/s median "
          "[range] | speedup vs AR [paired range] | quality |\n"
          "|---|---|---|---|---|---|---|---|---|")
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
          f"[{low:.0f}-{high:.0f}] | {_speedup(row)} | {quality} |")


def _speedup(row: dict) -> str:
  if "speedup_range" not in row:
    return f"{row['speedup']:.2f}x"
  low, high = row["speedup_range"]
  return f"{row['speedup']:.2f}x [{low:.2f}-{high:.2f}]"


def table(rows: Sequence[dict]) -> str:
  return "\n".join([HEADER] + [format_row(r) for r in rows])
