"""SmolLM2-135M-Instruct end to end: import, SFT, MARS, and decoding speed, in one run.

  python -m benchmarks.real_model [--root runs/smollm2] [--n 128] [--batches 1,4]
      [--taus 1.0,0.95,0.9,0.8] [--repeats 3] [--out runs/smollm2/bench]
      [--seeds 0,1,2 --quality-batch 16]

Needs `make smollm2` (the GGUF and its import at ROOT/base) and the two training stages of
configs/smollm2_135m.py at ROOT/sft and ROOT/mars (docs/real_model.md has the commands).
All timings come from this one process on this machine:
1. the cost of one cached forward with 1, 4, 8, 16 new tokens against one, batch 1 and 4:
   what tokens per forward can buy on this processor;
2. transformers `generate` (fp32, greedy, the same GGUF weights through transformers' own
   loader) against cardjax AR with a KV cache on the imported model, same prompts;
3. the arith_sft test problems: the zero-shot instruct model, the SFT model and the MARS
   model with AR (KV cache), MARS at each tau (window cache, narrow and 2B-wide windows)
   and self-verified MARS (--verify), exact match and tokens per forward, at each batch.
Each timing is the whole prompt set decoded `--repeats` times after a warm-up that
compiles every shape: tokens/s is the median with the range over repeats. Speedups divide
by AR with a KV cache on the same model at the same batch. Writes results.json,
real_model.md and real_model.png to --out, each with the machine (cardjax/machine.py).
With --seeds, the models of each training seed (benchmarks/real_model_train.sh SEED) are
judged and the quality table gives the mean and range over seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np

from cardjax import checkpoint, machine
from cardjax.config import load_config
from cardjax.eval import inputs, measure
from cardjax.decoding.frozen import Frozen
from cardjax.decoding.methods import Options, make_decoder

from benchmarks.common import announce, arg_parser, pyplot, range_cell, spread

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class HFDecode:
  """transformers generate with the same interface as a cardjax decoder (greedy, fp32)."""

  def __init__(self, gguf: Path, max_new_tokens: int, stop_ids, pad_id: int):
    import torch
    from transformers import AutoModelForCausalLM

    self.torch = torch
    self.model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    self.max_new, self.stop, self.pad = max_new_tokens, list(stop_ids), pad_id

  def __call__(self, prompts):
    torch = self.torch
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
      ids[r, width - len(p):] = torch.tensor(p)
      mask[r, width - len(p):] = 1
    with torch.no_grad():
      out = self.model.generate(ids, attention_mask=mask, do_sample=False,
                                max_new_tokens=self.max_new, eos_token_id=self.stop,
                                pad_token_id=self.pad)[:, width:].tolist()
    rows = []
    for row in out:
      cut = next((i + 1 for i, t in enumerate(row) if t in self.stop), len(row))
      rows.append(row[:cut])
    # A generate call runs one forward per step of its longest row.
    return _Gen(rows, max(len(r) for r in rows))


@dataclasses.dataclass
class _Gen:
  _rows: list[list[int]]
  forwards: int

  def rows(self):
    return self._rows


def load(root: Path):
  root = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  model, step = checkpoint.restore_model(root)
  return Frozen(model), step


def forward_cost(frozen: Frozen, batches, tokens=(1, 4, 8, 16), slots: int = 256) -> list[dict]:
  from benchmarks.decode_forward import forward_ms  # imports jax: only when a forward is timed

  out = []
  for b in batches:
    one = None
    for t in tokens:
      ms = forward_ms(frozen.graphdef, frozen.state, b, t, slots)
      one = one or ms
      out.append({"batch": b, "new_tokens": t, "ms": ms, "x_one": ms / one})
      print(f"| {b} | {t} | {ms:.2f} | {ms / one:.2f}x |", flush=True)
  return out


def summary(t: measure.Run) -> dict:
  low, high = t.tokens_per_second_range
  return {"tokens": t.tokens, "row_forwards": t.row_forwards,
          "tokens_per_forward": t.tokens_per_forward, "tokens_per_s": t.tokens_per_second,
          "tokens_per_s_min": low, "tokens_per_s_max": high, "seconds": t.repeat_seconds}


def fmt(row: dict) -> str:
  setting = ", ".join(f"{k} {v}" for k, v in row.items() if k in ("tau", "window"))
  return (f"| {row['model']} | {row['method']} | {setting} | {row['batch']} | "
          f"{row['tokens_per_forward']:.2f} | "
          f"{range_cell(row['tokens_per_s'], row['tokens_per_s_min'], row['tokens_per_s_max'], 1)}"
          f" | {row['speedup']:.2f}x |")


HEADER = ("| model | method | setting | batch | tokens/forward | tokens/s median [range] | "
          "speedup vs AR (MARS model) |\n|---|---|---|---|---|---|---|")


def _key(row: dict) -> tuple:
  return (row["model"], row["method"], row.get("tau"), row.get("window"))


def plot(rows: list[dict], quality: list[dict], batches, path: Path, caption: str) -> None:
  """Exact match (all problems) against tokens/s (median of repeats), one panel a batch."""
  plt = pyplot()
  em = {k: 100 * np.mean([r["exact_match"] for r in rs]) for k, rs in by_setting(quality).items()}
  fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.5), squeeze=False)
  for ax, b in zip(axes[0], batches):
    mine = [r for r in rows if r["batch"] == b and _key(r) in em]
    for (model, marker), color in zip((("zero-shot", "s"), ("sft", "D"), ("mars", "o")),
                                      ("tab:gray", "tab:green", "tab:red")):
      # The zero-shot model's AR is timed twice (beside transformers, and in the sweep).
      for i, r in enumerate(r for r in mine if r["model"] == model and r["method"] == "ar"):
        ax.scatter(r["tokens_per_s"], em[_key(r)], marker=marker, s=60, color=color,
                   label=None if i else f"{model}: AR + KV cache")
    for window, style in (("fit", "-o"), ("full", "--x")):
      sweep = [r for r in mine if r["method"] == "mars" and r.get("window") == window]
      if sweep:
        ax.plot([r["tokens_per_s"] for r in sweep], [em[_key(r)] for r in sweep], style,
                label=f"MARS tau sweep ({window} window)")
        for r in sweep:
          ax.annotate(f"{r['tau']}", (r["tokens_per_s"], em[_key(r)]),
                      textcoords="offset points", xytext=(4, 4), fontsize=8)
    for r in (r for r in mine if r["method"] == "mars --verify"):
      ax.scatter(r["tokens_per_s"], em[_key(r)], marker="*", s=140,
                 label="MARS --verify (lossless)")
    ax.set_title(f"batch {b}")
    ax.set_xlabel("tokens/s (median of repeats)")
    ax.set_ylabel("exact match (%)")
    ax.grid(alpha=0.3)
  axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
  fig.suptitle(f"SmolLM2-135M-Instruct on arith_sft: {caption}", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")


def trained_decoders(root: Path, opt: Options, args) -> list[tuple]:
  """(model, method, model, objective, options, extra) for ROOT/sft and ROOT/mars: AR on
  both, MARS at each tau (and the 2B window where asked), and --verify."""
  sft, _ = load(root / "sft")
  mars, _ = load(root / "mars")
  run_config = checkpoint.read_run_config(root / "mars" / "checkpoints")
  block = args.block or int(run_config.objective.block_size)
  decoders = [("sft", "ar", sft, "ar", opt, {}), ("mars", "ar", mars, "mars", opt, {})]
  full_taus = [float(t) for t in filter(None, args.full_window_taus.split(","))]
  for tau in (float(t) for t in args.taus.split(",")):
    for window in ("fit", "full") if tau in full_taus else ("fit",):
      decoders.append(("mars", "mars", mars, "mars",
                       dataclasses.replace(opt, block=block, tau=tau, window=window),
                       {"tau": tau, "window": window}))
  decoders.append(("mars", "mars --verify", mars, "mars",
                   dataclasses.replace(opt, block=block, verify=True), {}))
  return decoders


def by_setting(quality: list[dict]) -> dict[tuple, list[dict]]:
  """Quality rows grouped by (model, method, tau, window): one row per seed."""
  out: dict[tuple, list[dict]] = {}
  for r in quality:
    out.setdefault(_key(r), []).append(r)
  return out


SPREAD_HEADER = ("| model | method | setting | seeds | exact match mean [range] | "
                 "tokens/forward mean [range] (batch) |\n|---|---|---|---|---|---|")


def fmt_spread(key: tuple, rows: list[dict]) -> str:
  model, method, tau, window = key
  setting = ", ".join(f"{k} {v}" for k, v in (("tau", tau), ("window", window)) if v is not None)
  em = [100 * r["exact_match"] for r in rows]
  tpf = [r["tokens_per_forward"] for r in rows]
  same = [r["equals_ar"] for r in rows if "equals_ar" in r]
  note = f" (= AR tokens in {sum(same)} of {len(same)})" if same else ""
  return (f"| {model} | {method} | {setting} | {len(rows)} | {spread(em, 1, '%')}"
          f"{note} | {spread(tpf)} ({rows[0]['batch']}) |")


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--root", default="runs/smollm2")
  parser.add_argument("--out", default="")
  parser.add_argument("--n", type=int, default=128,
                      help="arith_sft test problems for exact match (decoded once, at the "
                           "largest batch)")
  parser.add_argument("--time-n", type=int, default=32,
                      help="the first problems, decoded --repeats times per batch for tokens/s")
  parser.add_argument("--batches", default="1,4")
  parser.add_argument("--taus", default="1.0,0.95,0.9,0.8")
  parser.add_argument("--full-window-taus", default="0.95",
                      help="taus also decoded with the 2B-wide window (the same tokens)")
  parser.add_argument("--bucket", type=int, default=128,
                      help="prompts padded to a multiple of this: one compiled width for the "
                           "whole set (each compile of the 30-layer model takes ~30 s)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max-new-tokens", type=int, default=80)
  parser.add_argument("--block", type=int, default=0, help="MARS B (0: the run's)")
  parser.add_argument("--skip", default="",
                      help="sections to skip: forward,hf,quality,timing,zero-shot (timing: "
                           "the tokens/s of the trained models; quality: both; zero-shot: the "
                           "imported model's rows)")
  parser.add_argument("--seeds", default="",
                      help="training seeds of benchmarks/real_model_train.sh (ROOT/seedS/sft, "
                           "ROOT/seedS/mars): exact match and tokens/forward for each seed's "
                           "models, with mean and range; the first seed's are timed. Empty: "
                           "ROOT/sft and ROOT/mars")
  parser.add_argument("--quality-batch", type=int, default=0,
                      help="batch of the quality pass (0: the largest of --batches); a row's "
                           "tokens do not depend on its batch, its tokens/forward do")
  parser.add_argument("--reuse", action="store_true",
                      help="keep the quality rows already in OUT/results.json (same --n and "
                           "--max-new-tokens) and judge only the seeds and settings missing")
  args = parser.parse_args()
  if importlib.util.find_spec("matplotlib") is None:  # before an hour of decoding, not after
    raise SystemExit("benchmarks.real_model draws real_model.png with matplotlib: "
                     "pip install -e '.[bench]'")
  root = Path(args.root)
  out = Path(args.out or root / "bench")
  out.mkdir(parents=True, exist_ok=True)
  batches = [int(b) for b in args.batches.split(",")]
  skip = set(filter(None, args.skip.split(",")))
  info = announce()
  caption = machine.line(info)
  results = {"machine": info, "args": vars(args)}

  base, _ = load(root / "base")
  tok = checkpoint.load_tokenizer(root / "base", base.cfg)
  config = load_config("configs/smollm2_135m.py:sft")
  prompts, answers = inputs.arith_problems(config, tok, args.n)
  timing = prompts[:args.time_n]
  opt = Options(max_new_tokens=args.max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                bucket=args.bucket)

  if "forward" not in skip:
    print("\n== one cached forward (ms) by new tokens, 256 cache slots\n| batch | new tokens | "
          "ms | x one token |\n|---|---|---|---|", flush=True)
    results["forward_cost"] = forward_cost(base, batches)
    (out / "results.json").write_text(json.dumps(results, indent=1))  # kept by --skip quality

  rows, quality = [], []
  kept = {}  # judged rows of an earlier run of this command (--reuse)
  if args.reuse and (out / "results.json").is_file():
    before = json.loads((out / "results.json").read_text())
    same = all(before["args"].get(k) == getattr(args, k) for k in ("n", "max_new_tokens"))
    kept = {(r.get("seed"), *_key(r)): r for r in before.get("quality", []) if same}
    print(f"== reusing {len(kept)} judged rows of {out}/results.json", flush=True)

  def save():
    (out / "results.json").write_text(json.dumps(
        {**results, "rows": rows, "quality": quality}, indent=1))

  def judge(model, method, decode, **extra) -> str:
    """Exact match and tokens per forward on all n problems (one pass, largest batch).
    Returns a digest of the decoded rows."""
    row = kept.get((extra.get("seed"), *_key({"model": model, "method": method, **extra})))
    if row is not None:
      quality.append(row)
      return row["rows_sha1"]
    t = measure.timed(decode, prompts, args.quality_batch or max(batches))
    row = {"model": model, "method": method, "batch": t.batch, **summary(t), **extra,
           "exact_match": measure.exact_match(t.rows, answers, tok),
           "rows_sha1": hashlib.sha1(json.dumps(t.rows).encode()).hexdigest()}
    quality.append(row)
    print(f"quality: {model} {method} {extra}: EM {100 * row['exact_match']:.1f}% on "
          f"{len(prompts)}, {row['tokens_per_forward']:.2f} tokens/forward at batch {t.batch}",
          flush=True)
    save()
    return row["rows_sha1"]

  def add(model, method, timed: measure.Run, base_run: measure.Run | None, **extra):
    row = {"model": model, "method": method, "batch": timed.batch, **summary(timed), **extra}
    row["speedup"] = (row["tokens_per_s"] / base_run.tokens_per_second
                      if base_run is not None else 1.0)
    rows.append(row)
    print(fmt(row), flush=True)
    save()
    return timed

  gguf = root / GGUF_NAME
  print(f"\n== tokens/s: the first {len(timing)} arith_sft test problems, up to "
        f"{args.max_new_tokens} new tokens, {args.repeats} repeats\n{HEADER}", flush=True)
  if "hf" not in skip and gguf.is_file():
    hf = HFDecode(gguf, args.max_new_tokens, tok.stop_ids, tok.pad_id)
    for b in batches:
      ours = add("zero-shot", "ar", measure.timed(make_decoder("ar", base, None, opt), timing,
                                                   b, args.repeats), None)
      theirs = measure.timed(hf, timing, b, args.repeats)
      same = float(np.mean([x == y for x, y in zip(theirs.rows, ours.rows)]))
      add("zero-shot", "transformers generate", theirs, ours, rows_equal_cardjax=same)
    del hf
  if "quality" in skip:
    return
  seeds = [int(x) for x in filter(None, args.seeds.split(","))]
  roots = [(s, root / f"seed{s}") for s in seeds] or [(None, root)]
  zero_shot = ("zero-shot", "ar", base, None, opt, {})
  timed_decoders = None
  for k, (seed, seed_root) in enumerate(roots):
    decoders = (([zero_shot] if k == 0 and "zero-shot" not in skip else []) +
                trained_decoders(seed_root, opt, args))
    made = {i: make_decoder(label.split()[0], model, objective, o)
            for i, (_, label, model, objective, o, _) in enumerate(decoders)}
    ar_rows = None
    tag = {} if seed is None else {"seed": seed}
    for i, (name, method, *_, extra) in enumerate(decoders):
      got = judge(name, method, made[i], **(tag if name != "zero-shot" else {}), **extra)
      if (name, method) == ("mars", "ar"):
        ar_rows = got
      elif name == "mars" and (extra.get("tau") == 1.0 or method == "mars --verify"):
        quality[-1]["equals_ar"] = got == ar_rows
    if k == 0:  # the first seed's models are also timed
      timed_decoders = (decoders, made)
  decoders, made = timed_decoders
  for b in batches if "timing" not in skip else []:
    base_run = None
    for i, (name, method, *_, extra) in enumerate(decoders):
      t = measure.timed(made[i], timing, b, args.repeats)
      if (name, method) == ("mars", "ar"):
        base_run = t
      add(name, method, t, base_run if name == "mars" and method != "ar" else None, **extra)
  md = [f"Machine: {caption}", "", "Quality (all problems):", "", QUALITY_HEADER]
  md += [fmt_quality(r) for r in quality]
  if seeds:
    md += ["", f"Quality over training seeds {args.seeds}: mean [range]", "", SPREAD_HEADER]
    md += [fmt_spread(k, rs) for k, rs in by_setting(quality).items()]
  if rows:
    md += ["", f"Speed (first {len(timing)} problems, {args.repeats} repeats):", "", HEADER]
    md += [fmt(r) for r in rows]
  (out / "real_model.md").write_text("\n".join(md) + "\n")
  plot(rows, quality, batches, out / "real_model.png", caption)
  print(f"\nwrote {out}/results.json, real_model.md, real_model.png")


QUALITY_HEADER = ("| model | method | setting | exact match | tokens/forward (batch) |\n"
                  "|---|---|---|---|---|")


def fmt_quality(row: dict) -> str:
  setting = ", ".join(f"{k} {v}" for k, v in row.items() if k in ("seed", "tau", "window"))
  same = {True: " (= AR tokens)", False: " (differs from AR)"}.get(row.get("equals_ar"), "")
  return (f"| {row['model']} | {row['method']} | {setting} | "
          f"{100 * row['exact_match']:.1f}%{same} | {row['tokens_per_forward']:.2f} "
          f"({row['batch']}) |")


if __name__ == "__main__":
  main()
