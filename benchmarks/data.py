"""Data pipeline throughput against what training consumes, in two sections.

  python -m benchmarks.data [--section demo|plan|all] [--data-dir DIR] ...

demo: for each workload of the demo (configs/tiny.py on python_stdlib pretraining and on
arith_sft SFT rows) the pipeline's tokens/s (in-process and with 2 grain workers) next to
a jitted AdamW step of the tiny model on the same batches (next-token loss, forward +
backward + update), each `--repeats` times: the pipeline must be faster than the step.

plan: the 1B recipe (configs/card_1b.py). Demand: the tokens/s per host that `cardjax plan`
gives on each topology (tokens per step / (model FLOPs per step / (peak x MFU)), the FLOPs
from the plan's own count, cardjax.plan.compile.step_flops, without compiling the step),
divided by the topology's hosts. Supply: card_1b's own pipeline (text_corpus, seq 2048,
packing) with one host's share of the batch (make_loader's process_count = the hosts), on a
local text corpus, for 1, 2 and 4 grain workers, several timed windows each after a
warm-up, by wall clock and per CPU-second of the workers and the consumer (steadier on a
shared machine). Then the workers a host needs: ceil(headroom x demand / one worker's
tokens/s), one worker standing for a worker with a core of its own.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, announce, arg_parser, range_cell

WORKLOADS = {
    "pretrain python_stdlib": [],
    "sft arith_sft": ["--config.data.dataset=arith_sft", "--config.data.mode=sft",
                      "--config.data.pad_to_multiple=4", "--config.data.packing=true"],
}
RECIPE = "configs/card_1b.py"
# The config docstring's topologies: the shipped v5p-128 slice and one 8xH200 node.
TOPOLOGIES = ("v5p-128", "8xH200")
HEADROOM = 1.5  # a host's workers must outrun the step by this much (stalls, long documents)
# Chips per host: v4 and v5p hosts hold 4 chips, and so do v5e / v6e hosts in slices above
# 8 chips (v5e-8 / v6e-8 are one 8-chip host); a GPU node is a host of 8 GPUs.
TPU_CHIPS_PER_HOST = 4
GPUS_PER_HOST = 8
# `make smollm2` puts SmolLM2's tokenizer here: a 49k byte-level BPE trained on web text,
# the nearest offline stand-in for card_1b's GPT-NeoX tokenizer (50k, the Pile).
SMOLLM2_TOKENIZER = ROOT / "runs" / "smollm2" / "base" / "hf_assets"


# --- demo section ---------------------------------------------------------------------

def pipeline_tokens_per_s(config, workers: int, steps: int) -> float:
  from cardjax.data.prepare import make_loader

  loader = make_loader(config, num_workers=workers)
  next(loader)  # start-up (worker processes, first reads) is not throughput
  start = time.perf_counter()
  tokens = 0
  for _ in range(steps):
    tokens += next(loader)["tokens"].size
  return tokens / (time.perf_counter() - start)


def step_tokens_per_s(config, steps: int) -> float:
  """A stand-in train step: next-token cross-entropy, grads, AdamW, all in one jit."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from cardjax.config import model_config
  from cardjax.data.prepare import make_loader
  from cardjax.model import create_model

  model = create_model(model_config(config), seed=0)
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, batch):
    def loss_fn(model):
      logits = model(batch["tokens"], positions=batch["positions"],
                     segment_ids=batch["segment_ids"])
      targets = batch["tokens"][:, 1:]
      weights = (batch["loss_mask"][:, 1:] * (batch["segment_ids"][:, 1:]
                                               == batch["segment_ids"][:, :-1]))
      ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], targets)
      return (ce * weights).sum() / jnp.maximum(weights.sum(), 1)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  loader = make_loader(config)
  batches = [{k: jnp.asarray(v) for k, v in next(loader).items()} for _ in range(4)]
  jax.block_until_ready(step(model, optimizer, batches[0]))  # compile
  start = time.perf_counter()
  for i in range(steps):
    loss = step(model, optimizer, batches[i % len(batches)])
  jax.block_until_ready(loss)
  return steps * batches[0]["tokens"].size / (time.perf_counter() - start)


def _summary(values: list[float]) -> dict:
  return {"median": statistics.median(values), "min": min(values), "max": max(values),
          "runs": values}


def demo_section(data_dir: str, steps: int, repeats: int) -> list[dict]:
  """Each workload's pipeline (0 and 2 workers) and step tokens/s, `repeats` times each,
  interleaved so that a burst of load from other programs touches all three alike."""
  from cardjax.config import load_config
  from cardjax.data.prepare import prepare

  rows = []
  for name, overrides in WORKLOADS.items():
    config = load_config("configs/tiny.py", [f"--config.data.data_dir={data_dir}", *overrides])
    prepare(config)
    p0, p2, s = [], [], []
    for _ in range(repeats):
      p0.append(pipeline_tokens_per_s(config, 0, steps))
      p2.append(pipeline_tokens_per_s(config, 2, steps))
      s.append(step_tokens_per_s(config, steps))
    rows.append({"workload": name, "batch": config.data.batch_size, "seq": config.data.seq_len,
                 "pipeline": _summary(p0), "pipeline_2_workers": _summary(p2),
                 "step": _summary(s), "load_average": os.getloadavg()[0]})
  header = ("workload", "batch", "seq", "pipeline tok/s", "pipeline 2 workers",
            "train step tok/s", "pipeline / step")
  print(f"(median [range] of {repeats} runs of {steps} batches or steps each)")
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for r in rows:
    cells = [range_cell(r[k]["median"], r[k]["min"], r[k]["max"], 0)
             for k in ("pipeline", "pipeline_2_workers", "step")]
    best = max(r["pipeline"]["median"], r["pipeline_2_workers"]["median"])
    print(f"| {r['workload']} | {r['batch']} | {r['seq']} | " + " | ".join(cells) +
          f" | {best / r['step']['median']:.1f}x |")
  return rows


# --- plan section: demand ---------------------------------------------------------------

def hosts_of(target) -> int:
  """The hosts of a `cardjax plan` target (each runs one input pipeline)."""
  if target.platform == "gpu":
    return math.ceil(target.chips / GPUS_PER_HOST)
  if target.chip in ("v5e", "v6e") and target.chips <= 8 and target.slices == 1:
    return 1
  return max(1, target.chips // TPU_CHIPS_PER_HOST)


def step_flops(config) -> float:
  """The plan's model FLOPs of one step of `config` (cardjax.plan.compile.step_flops, the
  number `cardjax plan` prints), without compiling the step."""
  from cardjax.config import model_config
  from cardjax.objectives import make_objective
  from cardjax.plan.compile import step_flops as plan_step_flops

  cfg = model_config(config)
  return plan_step_flops(config, cfg, make_objective(config.objective, cfg))


def host_demand(config, topology: str, mfu: float, flops_per_step: float) -> dict:
  """Tokens/s the recipe consumes on `topology` at `mfu`, for the slice and per host: the
  formula of cardjax.plan.report."""
  from cardjax.plan.targets import parse_target

  t = parse_target(topology)
  hosts = hosts_of(t)
  peak = t.peak_per_chip * t.chips
  step_s = flops_per_step / (peak * mfu)
  rows, seq = config.data.batch_size, config.data.seq_len
  tokens_per_s = rows * seq / step_s
  if rows % hosts:
    raise ValueError(f"batch {rows} does not split over the {hosts} hosts of {topology}")
  return {"topology": topology, "chips": t.chips, "chip": t.chip, "hosts": hosts,
          "peak_flops": peak, "mfu": mfu, "flops_per_step": flops_per_step, "step_s": step_s,
          "tokens_per_s": tokens_per_s, "tokens_per_s_per_host": tokens_per_s / hosts,
          "rows_per_host": rows // hosts}


# --- plan section: supply ---------------------------------------------------------------

def stdlib_paths() -> tuple[str, ...]:
  """A text corpus every Python install has: the stdlib's top-level modules and tests."""
  root = sysconfig.get_paths()["stdlib"]
  return (f"{root}/*.py", f"{root}/test/*.py")


def recipe_config(data_dir: str, paths, tokenizer: str, overrides=()):
  """configs/card_1b.py with its data on a local text_corpus and an offline tokenizer:
  `tokenizer` a HF folder, or "" for a BPE trained on the corpus (data.tokenizer_vocab)."""
  from cardjax.config import load_config
  from cardjax.data.prepare import load_data_tokenizer, prepare
  from cardjax.data.tokenizer import load_tokenizer

  config = load_config(RECIPE, [f"--config.data.data_dir={data_dir}", *overrides])
  config.data.options = {"paths": tuple(paths), "text_field": "text", "validation_percent": 1,
                         "on_decode_error": "skip"}
  config.data.tokenizer = tokenizer
  if tokenizer:
    config.model.mask_token_id = load_tokenizer(tokenizer).mask_id
    prepare(config)
  else:
    config.model.mask_token_id = -1  # not known until the BPE is trained
    prepare(config)
    config.model.mask_token_id = load_data_tokenizer(config).mask_id
  return config


def bytes_per_token(config, examples: int = 200) -> float:
  """UTF-8 bytes per token of the corpus's first examples (tokens/s moves with it)."""
  from cardjax.data.prepare import load_data_tokenizer, sample

  tokenizer = load_data_tokenizer(config)
  texts = [e["text"] for e in sample(config, "train", examples)]
  return sum(len(t.encode()) for t in texts) / sum(len(tokenizer.encode(t)) for t in texts)


def tree_cpu_s(root: int | None = None) -> float | None:
  """CPU seconds (user + system) of this process and its live descendants (the grain
  workers), from /proc; None where there is no /proc. Unlike wall time it does not count
  the waits that other programs on a shared machine cause."""
  root = os.getpid() if root is None else root
  tick = os.sysconf("SC_CLK_TCK")
  stats = {}
  try:
    for name in os.listdir("/proc"):
      if name.isdigit():
        try:
          text = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # ended meanwhile
          continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
  except OSError:
    return None
  total, todo = 0.0, [root]
  while todo:
    pid = todo.pop()
    total += stats.get(pid, (0, 0.0))[1]
    todo += [p for p, (ppid, _) in stats.items() if ppid == pid]
  return total


def measure_supply(config, hosts: int, workers: int, repeats: int,
                   window_tokens: int) -> dict:
  """Tokens/s of host 0's pipeline (of `hosts`) with `workers` grain processes: `repeats`
  timed windows of at least `window_tokens` tokens and `workers` batches each, after a
  warm-up of workers + 1 batches (process start-up and the burst of first batches the
  workers made meanwhile are not throughput)."""
  from cardjax.data.prepare import make_loader

  loader = make_loader(config, num_workers=workers, process_index=0, process_count=hosts)
  try:
    start = time.perf_counter()
    first = next(loader)["tokens"]
    startup_s = time.perf_counter() - start
    for _ in range(workers):
      next(loader)
    batch_tokens = first.size
    per_window = max(workers, 1, math.ceil(window_tokens / batch_tokens))
    samples, per_cpu_s = [], []
    for _ in range(repeats):
      cpu, start = tree_cpu_s(), time.perf_counter()
      tokens = sum(next(loader)["tokens"].size for _ in range(per_window))
      samples.append(tokens / (time.perf_counter() - start))
      if cpu is not None:
        per_cpu_s.append(tokens / max(tree_cpu_s() - cpu, 1e-9))
  finally:
    loader.close()
  return {"hosts": hosts, "workers": workers, "rows": first.shape[0], "seq": first.shape[1],
          "batches_per_window": per_window, "startup_s": startup_s, "samples": samples,
          "median": statistics.median(samples), "min": min(samples), "max": max(samples),
          # tokens per CPU-second of the workers and the consumer together
          "per_cpu_s": per_cpu_s, "load_average": os.getloadavg()[0]}


def workers_needed(demand: float, per_worker: float, headroom: float = HEADROOM) -> int:
  """Grain workers that supply `headroom` x `demand` tokens/s at `per_worker` each."""
  return max(1, math.ceil(headroom * demand / per_worker))


def needs(demands: list[dict], supplies: list[dict], headroom: float) -> list[dict]:
  """Per topology: its host demand, the one-worker rate of its host's pipeline (the per-
  worker supply: a worker with a core of its own) by wall time and by CPU time, and the
  workers a host needs by each."""
  out = []
  for d in demands:
    one = [s for s in supplies if s["hosts"] == d["hosts"] and s["workers"] == 1]
    if not one:
      continue
    one, demand = one[0], d["tokens_per_s_per_host"]
    row = {"topology": d["topology"], "demand_per_host": demand, "headroom": headroom,
           "per_worker": one["median"], "per_worker_range": [one["min"], one["max"]],
           "workers_needed": workers_needed(demand, one["median"], headroom),
           "workers_needed_range": [workers_needed(demand, one["max"], headroom),
                                    workers_needed(demand, one["min"], headroom)]}
    if one.get("per_cpu_s"):
      cpu = statistics.median(one["per_cpu_s"])
      row.update(per_cpu_s=cpu, workers_needed_cpu=workers_needed(demand, cpu, headroom))
    out.append(row)
  return out


def plan_tables(demands: list[dict], supplies: list[dict], need: list[dict]) -> list[str]:
  lines = ["| topology | chips | hosts | FLOPs/step | step s | tok/s slice | tok/s per host |",
           "|---|---|---|---|---|---|---|"]
  for d in demands:
    lines.append(f"| {d['topology']} | {d['chips']} {d['chip']} | {d['hosts']} | "
                 f"{d['flops_per_step']:.3e} | {d['step_s']:.3f} | {d['tokens_per_s']:,.0f} | "
                 f"{d['tokens_per_s_per_host']:,.0f} |")
  lines += ["", "| topology | rows/host | workers | pipeline tok/s median [min-max] | "
            "per worker | supply / host demand | tok per CPU-s | load |",
            "|---|---|---|---|---|---|---|---|"]
  for d in demands:
    for s in (s for s in supplies if s["hosts"] == d["hosts"]):
      cell = range_cell(s["median"] / 1e3, s["min"] / 1e3, s["max"] / 1e3, 0, "k")
      ratio = range_cell(s["median"] / d["tokens_per_s_per_host"],
                         s["min"] / d["tokens_per_s_per_host"],
                         s["max"] / d["tokens_per_s_per_host"], 2, "x")
      cpu = f"{statistics.median(s['per_cpu_s']) / 1e3:,.0f}k" if s.get("per_cpu_s") else "-"
      lines.append(f"| {d['topology']} | {s['rows']} x {s['seq']} | {s['workers']} | {cell} | "
                   f"{s['median'] / max(s['workers'], 1) / 1e3:,.0f}k | {ratio} | {cpu} | "
                   f"{s.get('load_average', float('nan')):.1f} |")
  lines += ["", "| topology | demand tok/s per host | x headroom | one worker tok/s | "
            "workers a host needs | one worker tok per CPU-s | workers by CPU time |",
            "|---|---|---|---|---|---|---|"]
  for n in need:
    low, high = n["workers_needed_range"]
    span = f" [{low}-{high}]" if low != high else ""
    cpu = (f"{n['per_cpu_s'] / 1e3:,.0f}k | {n['workers_needed_cpu']}" if "per_cpu_s" in n
           else "- | -")
    lines.append(f"| {n['topology']} | {n['demand_per_host']:,.0f} | {n['headroom']}x | "
                 f"{n['per_worker'] / 1e3:,.0f}k | **{n['workers_needed']}**{span} | {cpu} |")
  return lines


def plan_section(args, data_dir: str) -> dict:
  from cardjax.config import load_config

  recipe = load_config(RECIPE, [])
  started = time.perf_counter()
  flops = step_flops(recipe)
  flops_s = time.perf_counter() - started
  demands = [host_demand(recipe, t, args.mfu, flops) for t in args.topologies.split(",")]
  tokenizer = args.tokenizer
  if tokenizer == "auto":
    tokenizer = str(SMOLLM2_TOKENIZER) if (SMOLLM2_TOKENIZER / "tokenizer.json").is_file() \
        else ""
  paths = tuple(args.paths.split(",")) if args.paths else stdlib_paths()
  config = recipe_config(data_dir, paths, tokenizer, [f"--config.data.tokenizer_vocab="
                                                      f"{args.tokenizer_vocab}"])
  bpt = bytes_per_token(config)
  print(f"demand: {RECIPE}, model FLOPs per step {flops:.3e} from cardjax.plan.compile."
        f"step_flops (no compile, {flops_s:.1f} s), at {args.mfu:.0%} MFU of each topology's "
        "dense bf16 peak (cardjax.peaks)")
  print(f"supply: {RECIPE}'s pipeline (text_corpus, seq {config.data.seq_len}, packing "
        f"{config.data.packing}) on {', '.join(paths)}; tokenizer "
        f"{tokenizer or f'a {args.tokenizer_vocab}-id BPE trained on the corpus'}; "
        f"{bpt:.2f} bytes per token; host 0 of each topology's hosts; {args.repeats} windows "
        f"of >= {args.window_tokens:,} tokens after a warm-up", flush=True)
  load_before = os.getloadavg()
  supplies = []
  for hosts in dict.fromkeys(d["hosts"] for d in demands):
    for workers in (int(w) for w in args.workers.split(",")):
      s = measure_supply(config, hosts, workers, args.repeats, args.window_tokens)
      print(f"  {hosts} hosts, {workers} workers: "
            f"{range_cell(s['median'], s['min'], s['max'], 0)} tokens/s "
            f"(start-up {s['startup_s']:.1f} s, load average {s['load_average']:.1f})",
            flush=True)
      supplies.append(s)
  load_after = os.getloadavg()
  need = needs(demands, supplies, args.headroom)
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print()
  for line in plan_tables(demands, supplies, need):
    print(line)
  print(f"\n(one worker's rate is the per-worker supply: a worker with a core of its own; "
        f"this machine has {cores} usable cores, so 2 workers share them with the consumer "
        f"and 4 oversubscribe. Tokens per CPU-second count the workers' and the consumer's "
        f"CPU time, not the waits other programs cause; load: the 1-minute load average "
        f"after each setting ({load_before[0]:.1f} before the first))")
  return {"recipe": RECIPE, "mfu": args.mfu, "headroom": args.headroom,
          "flops_source": "cardjax.plan.compile.step_flops (no compile)",
          "corpus": {"paths": list(paths), "tokenizer": tokenizer or
                     f"bpe{args.tokenizer_vocab} trained on the corpus",
                     "bytes_per_token": bpt, "seq_len": config.data.seq_len,
                     "packing": config.data.packing},
          "repeats": args.repeats, "window_tokens": args.window_tokens,
          "load_average": {"before": load_before, "after": load_after},
          "demand": demands, "supply": supplies, "needs": need}


def main():
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--section", choices=("demo", "plan", "all"), default="all")
  parser.add_argument("--data-dir", "--data_dir", dest="data_dir", default="",
                      help="default: a temporary folder (--data_dir: the old spelling)")
  parser.add_argument("--steps", type=int, default=20, help="demo: batches and steps timed")
  parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
  parser.add_argument("--mfu", type=float, default=0.4, help="as `cardjax plan --mfu`")
  parser.add_argument("--headroom", type=float, default=HEADROOM)
  parser.add_argument("--workers", default="1,2,4")
  parser.add_argument("--repeats", type=int, default=3,
                      help="plan: timed windows per worker count; demo: runs of each cell")
  parser.add_argument("--window-tokens", type=int, default=1_000_000)
  parser.add_argument("--paths", default="", help="corpus files or globs, comma-separated "
                      "(default: the Python stdlib's top-level modules and tests)")
  parser.add_argument("--tokenizer", default="auto", help="a HF tokenizer folder; auto: "
                      "SmolLM2's (make smollm2) if present, else a BPE trained on the corpus")
  parser.add_argument("--tokenizer-vocab", type=int, default=32768,
                      help="ids of the trained BPE (when no tokenizer folder is used)")
  parser.add_argument("--json", default="", help="also write the results to this JSON file")
  args = parser.parse_args()
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="cardjax-bench-")
  info = announce("data pipeline")
  result = {"machine": info, "command": "python -m benchmarks.data " + " ".join(
      a for a in sys.argv[1:])}
  if args.section in ("demo", "all"):
    result["demo"] = demo_section(data_dir, args.steps, args.repeats)
  if args.section in ("plan", "all"):
    if args.section == "all":
      print()
    result["plan"] = plan_section(args, data_dir)
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json} ({datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC)")


if __name__ == "__main__":
  main()
