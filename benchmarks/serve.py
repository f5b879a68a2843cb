"""Load test of `cardjax serve`: throughput and latency at 1, 4, 16, 64 concurrent clients.

  python -m benchmarks.serve [--checkpoint RUN] [--methods ar,mars] [--levels 1,4,16,64]
      [--requests 4] [--max-tokens 32] [--batch-sizes 1,4,16,64] [--chunk 16]
      [--schedulers continuous,continuous-full,chunked] [--slots 256] [--span-min 64]
      [--variants '|--prefix-page 0|--prefix-page 0 --prefill-rows 1']
      [--sampling greedy,mixed,sampled] [--url http://127.0.0.1:8000] [--out runs/serve_bench]

For each method it starts a server on a free loopback port with --warmup-width (every
compiled batch size and prompt width is built before serving; or, with --url, it uses the
server running there with whatever method it serves), then runs each level: C client
threads, each sending --requests chat completions one after another (arithmetic questions,
greedy, ignore_eos so every request writes exactly --max-tokens tokens and the levels
compare like for like; --sampling: each level once per setting, in turn: `greedy`,
`sampled` (temperature 0.7, top_p 0.9, no seed) or `mixed` (odd-numbered clients sampled,
the others greedy), which share the server's steps). --schedulers runs each method once
per scheduler: `continuous` (rows keep their KV cache, `cardjax serve --slots N --span-min
S`: a step reads only the span its rows reach), `continuous-full` (the same with
`--span-min 0`: every step reads all N slots) and `chunked` (`--slots 0`: every chunk
re-prefills its rows). --variants runs each of those once per '|'-separated set of extra
`cardjax serve` flags (the empty set: the defaults), labelled with them: the A/B of a
server option in one run, e.g. the shared-prefix cache (`--prefix-page 0` turns it off)
and batched admission (`--prefill-rows 1`: one prefill forward per request).
Per level: generated tokens/s and requests/s over the level's wall time, tokens/s in its
steady window (while every client had a request out: no ramp at the level's ends), p50
and p99 request latency, the mean tokens per forward the server reported, and the mean
requests per decode step (the server's cardjax_batch_rows histogram over the level): how
full the batch was, which with a step's cost bounds the throughput; and the share of the
level's wall time the server's decode thread spent stepping, prefilling, in the admission
wait and delivering (cardjax_decode_thread_seconds; the rest it waited for requests). The
table and the machine go to stdout and --out/results.json.

The default checkpoint is the decode benchmark's trained AR SFT model (configs/
decode_bench.py:sft, 128 x 4 layers, runs/bench_decode/runs/sft); MARS is served from it
with --objective mars (it was not trained for MARS: the MARS rows show what batching does
to the MARS decoder's throughput, not MARS's speed-up). With no such run, a random-init
model of the same size is written to --out/init first.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import portpicker

from cardjax.serve.metrics import scrape

from benchmarks.common import ROOT, arg_parser

DEFAULT_RUN = ROOT / "runs/bench_decode/runs/sft"


def checkpoint(args) -> Path:
  if args.checkpoint:
    return Path(args.checkpoint)
  if (DEFAULT_RUN / "checkpoints").is_dir() and any(
      p.name.isdigit() for p in (DEFAULT_RUN / "checkpoints").iterdir()):
    return DEFAULT_RUN
  init = Path(args.out) / "init"
  if not (init / "checkpoints").is_dir():
    def cli(*argv):
      subprocess.run([sys.executable, "-m", "cardjax.cli", *argv, "--config",
                      "configs/decode_bench.py:sft"], cwd=ROOT, check=True)
    cli("data", "build", "arith_sft")  # the tokenizer the server loads with the run config
    cli("init", "--workdir", str(init))
  return init


def start(run: Path, method: str, scheduler: str, variant: str,
          args) -> tuple[subprocess.Popen, str]:
  port = portpicker.pick_unused_port()
  cmd = [sys.executable, "-m", "cardjax.cli", "serve", "--checkpoint", str(run), "--port",
         str(port), "--method", method, "--batch-sizes", args.batch_sizes, "--chunk",
         str(args.chunk), "--model-name", "bench", "--warmup-width", str(args.warmup_width)]
  if method != "ar":
    cmd += ["--objective", "mars", "--tau", str(args.tau)]
  cmd += ["--slots", str(0 if scheduler == "chunked" else args.slots),
          "--span-min", str(0 if scheduler == "continuous-full" else args.span_min)]
  cmd += variant.split()
  proc = subprocess.Popen(cmd, cwd=ROOT)
  url = f"http://127.0.0.1:{port}"
  for _ in range(2400):
    try:
      urllib.request.urlopen(url + "/health", timeout=1)
      return proc, url
    except OSError:
      if proc.poll() is not None:
        raise SystemExit(f"the server exited with {proc.returncode}")
      time.sleep(0.5)
  raise SystemExit("the server did not start within 20 minutes")


SAMPLINGS = ("greedy", "sampled", "mixed")
SAMPLED = {"temperature": 0.7, "top_p": 0.9}


def ask(url: str, model: str, question: str, max_tokens: int,
        sampled: bool = False) -> tuple[float, dict]:
  body = {"model": model, "messages": [{"role": "user", "content": question}],
          "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
          **(SAMPLED if sampled else {})}
  request = urllib.request.Request(url + "/v1/chat/completions",
                                   data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  start = time.perf_counter()
  with urllib.request.urlopen(request, timeout=3600) as r:
    answer = json.loads(r.read())
  return time.perf_counter() - start, answer["usage"]


def run_clients(client, clients: int) -> float:
  """Seconds for `clients` threads running client(k), k = 0.., all started together."""
  threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
  start = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return time.perf_counter() - start


def level(url: str, model: str, clients: int, requests: int, max_tokens: int,
          seed: int, sampling: str = "greedy") -> dict:
  rng = random.Random(seed)
  questions = [f"What is {rng.randint(1, 999)} + {rng.randint(1, 999)}?"
               for _ in range(clients * requests)]
  latencies, usages, spans, lock = [], [], [], threading.Lock()
  firsts, lasts = [0.0] * clients, [0.0] * clients

  def client(k: int):
    for i, q in enumerate(questions[k * requests:(k + 1) * requests]):
      sent = time.perf_counter()
      firsts[k] = firsts[k] if i else sent
      sampled = sampling == "sampled" or (sampling == "mixed" and k % 2 == 1)
      seconds, usage = ask(url, model, q, max_tokens, sampled)
      lasts[k] = sent + seconds
      with lock:
        latencies.append(seconds)
        usages.append(usage)
        spans.append((sent, sent + seconds, usage["completion_tokens"]))
  wall = run_clients(client, clients)
  tokens = sum(u["completion_tokens"] for u in usages)
  latencies.sort()
  steady = steady_rate(spans, max(firsts), min(lasts))
  return {"clients": clients, "requests": len(latencies), "tokens": tokens,
          "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1),
          "steady_tokens_per_s": steady and round(steady, 1),
          "requests_per_s": round(len(latencies) / wall, 2),
          "p50_s": round(statistics.median(latencies), 3),
          "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
          "tokens_per_forward": round(statistics.mean(u["tokens_per_forward"]
                                                      for u in usages), 3)}


def steady_rate(spans, begin: float, end: float) -> float | None:
  """Tokens/s while every client had a request out: from the last client's first send to
  the first client's last answer. A level's own rate also counts its ramp (clients whose
  last answer came leave their rows empty), which a server under steady load does not
  have. Each request's tokens are spread evenly over its lifetime (send to answer), and
  the share inside the window counts. None when the window is empty (one request a client)."""
  if end <= begin:
    return None
  inside = sum(tokens * max(0.0, min(done, end) - max(sent, begin)) / (done - sent)
               for sent, done, tokens in spans if done > sent)
  return inside / (end - begin)


PHASES = ("step", "prefill", "admit_wait", "deliver", "chunk")


def server_use(before: dict, after: dict, wall: float) -> dict:
  """From two /metrics scrapes around a level: the mean requests per decode call
  (cardjax_batch_rows) and the share of the level's wall time the decode thread spent in
  each phase (cardjax_decode_thread_seconds; the rest it waited for requests)."""
  def delta(name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)

  calls = delta("cardjax_batch_rows_count")
  share = {phase: round(delta(f'cardjax_decode_thread_seconds_total{{phase="{phase}"}}')
                        / wall, 3) for phase in PHASES}
  return {"rows_per_step": round(delta("cardjax_batch_rows_sum") / calls, 1) if calls else None,
          "thread_share": {k: v for k, v in share.items() if v}}


def model_name(url: str) -> str:
  with urllib.request.urlopen(url + "/v1/models") as r:
    return json.loads(r.read())["data"][0]["id"]


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--checkpoint", default="")
  parser.add_argument("--url", default="", help="an already running server (one method)")
  parser.add_argument("--methods", default="ar,mars")
  parser.add_argument("--levels", default="1,4,16,64")
  parser.add_argument("--requests", type=int, default=4, help="per client per level")
  parser.add_argument("--max-tokens", type=int, default=32)
  parser.add_argument("--batch-sizes", default="1,4,16,64")
  parser.add_argument("--chunk", type=int, default=16)
  parser.add_argument("--tau", type=float, default=0.9)
  parser.add_argument("--schedulers", default="continuous",
                      help="continuous (rows keep their KV cache), continuous-full (the same, "
                           "each step reading all --slots) and/or chunked")
  parser.add_argument("--slots", type=int, default=256,
                      help="continuous: KV-cache slots per row (prompt + completion)")
  parser.add_argument("--span-min", type=int, default=64,
                      help="continuous: the smallest cache span a step reads")
  parser.add_argument("--variants", default="",
                      help="'|'-separated sets of extra `cardjax serve` flags, one server "
                           "each (empty: the defaults), e.g. '|--prefix-page 0'")
  parser.add_argument("--warmup-width", type=int, default=64,
                      help="the server compiles prompt widths up to this before serving")
  parser.add_argument("--warm-levels", action="store_true",
                      help="before each level, run it once with one request per client, "
                           "unrecorded: the small programs a server compiles on first use (row "
                           "puts, tier and span gathers) are then not in the measured pass")
  parser.add_argument("--sampling", default="greedy",
                      help="comma-separated: greedy, sampled (temperature 0.7, top_p 0.9), "
                           "mixed (half the clients each); each level runs once per setting")
  parser.add_argument("--out", default="runs/serve_bench")
  args = parser.parse_args()
  samplings = args.sampling.split(",")
  if not set(samplings) <= set(SAMPLINGS):
    raise SystemExit(f"--sampling={args.sampling!r}: each must be one of {SAMPLINGS}")
  os.chdir(ROOT)
  # The servers keep their compiled programs here: a rerun skips the warm-up compiles.
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(args.out).resolve() / "xla"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  from cardjax import machine

  info = machine.describe()
  levels = [int(x) for x in args.levels.split(",")]
  run = None if args.url else checkpoint(args)
  results = []
  variants = [v.strip() for v in args.variants.split("|")]
  runs = [("(--url)", "", "")] if args.url else [
      (m, sch, v) for m in args.methods.split(",") for sch in args.schedulers.split(",")
      for v in variants]
  for method, scheduler, variant in runs:
    if scheduler not in ("", "continuous", "continuous-full", "chunked"):
      raise SystemExit(f"--schedulers: {scheduler!r} is not continuous, continuous-full or "
                       "chunked")
    proc, url = (None, args.url) if args.url else start(run, method, scheduler, variant, args)
    method = f"{method} {scheduler} {variant}".strip()
    try:
      name = model_name(url)
      t = time.perf_counter()
      level(url, name, 4, 1, args.max_tokens, seed=999)  # anything the server's missed
      print(f"{method}: warm-up {time.perf_counter() - t:.0f}s", flush=True)
      for c in levels:
        if args.warm_levels:  # each level's shapes (tiers, spans, gathers) once, unrecorded
          level(url, name, c, 1, args.max_tokens, seed=1000 + c)
        for sampling in samplings:  # in turn: the settings compare within minutes
          label = f"{method} {sampling}" if len(samplings) > 1 else method
          before = scrape(url)
          row = dict(method=label, sampling=sampling,
                     **level(url, name, c, args.requests, args.max_tokens, c, sampling))
          row.update(server_use(before, scrape(url), row["wall_s"]))
          print(json.dumps(row), flush=True)
          results.append(row)
    finally:
      if proc is not None:
        proc.terminate()
        proc.wait()
  print(f"\ncardjax serve load test: {run or args.url}, {args.max_tokens} tokens per request "
        f"(ignore_eos), {args.requests} requests per client, batch sizes {args.batch_sizes}, "
        f"chunk {args.chunk}, continuous: {args.slots} slots a row, spans from "
        f"{args.span_min}\nmachine: {machine.line(info)}\n")
  print("| method | clients | tokens/s | requests/s | p50 latency s | p99 latency s | "
        "tokens/forward | rows per step | x 1 client | steady tokens/s | steady x 1 client | "
        "decode thread: share of wall time |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in results:
    first = next(b for b in results if b["method"] == r["method"])
    steady, base = r.get("steady_tokens_per_s"), first.get("steady_tokens_per_s")
    print(f"| {r['method']} | {r['clients']} | {r['tokens_per_s']} | {r['requests_per_s']} | "
          f"{r['p50_s']} | {r['p99_s']} | {r['tokens_per_forward']} | "
          f"{r.get('rows_per_step')} | {r['tokens_per_s'] / first['tokens_per_s']:.1f} | "
          f"{steady or '-'} | {f'{steady / base:.1f}' if steady and base else '-'} | "
          + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r.get("thread_share", {}).items())
          + " |")
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.json").write_text(json.dumps(
      {"machine": info, "checkpoint": str(run or args.url), "args": vars(args),
       "results": results}, indent=1))


if __name__ == "__main__":
  main()
