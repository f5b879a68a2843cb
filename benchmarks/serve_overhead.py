"""What `cardjax serve` costs on top of its own decode step: the server's generated tokens/s
at 1, 4, 16 and 64 closed-loop clients against a bare loop of the same compiled step on the
same rows, and the server's warm-up time on a first and on a cached start.

  python -m benchmarks.serve_overhead [--json OUT] [--checkpoint RUN] [--methods ar,mars]
      [--levels 1,4,16,64] [--requests 0] [--repeats 3] [--max-tokens 32] [--chunk 16]
      [--slots 256] [--out DIR] [--server-flags FLAGS] [--keep-cache] [--quick]

The model is the decode benchmark's shape (benchmarks/decode_forward.py's CONFIG: 128 wide,
4 layers, vocab 512, fp32) with random weights (initializer_range 1.0: peaked logits, so
MARS at tau 0.6 accepts runs of 1..B tokens as a trained model does) and a byte-level BPE of
512 ids, saved in --out as a MARS training run saves it (objective mars, B = 4), so one
checkpoint serves AR and MARS (--checkpoint: another run instead).

Server: for each method a `cardjax serve --method M` subprocess on a free loopback port,
--batch-sizes 1,4,16,64, --chunk 16 forwards a step, --slots 256, tau 0.6, everything else
at its default (its warm-up of every prompt width, continuous batching with overlap, spans
from 64, the shared-prefix cache, --admit-wait 0.1; --server-flags adds flags). A level is C
client threads, each sending its requests to /v1/completions one after another (closed
loop): prompts of 24 random token ids (every request its own), greedy, ignore_eos, so every
request writes exactly --max-tokens tokens; --requests per client, by default 256 a level
and at least 8 a client (64 clients: 512). Each level first runs once with one request per
client (first_burst_tokens_per_s: its rate, not in the ratio; the bare loop's warm pass
too), and reports the server's compilations after its warm-up so far
(compilations_after_warmup, /metrics: 0 when no request waited for one). server_tokens_per_s
is the level's tokens over its wall time (its ramp up and down included), beside the steady
rate (serve.py's steady_rate: while every client had a request out); rows_per_step is the
mean requests per decode step the server reports (/metrics: cardjax_batch_rows).

Bare loop: the server's own SlotPool, built in this process as the server builds it
(Engine.load of the same checkpoint with the same flags, Engine.pool of the requests'
settings: the same compiled step, tiers, spans and prefix store), decoding the level's own
prompts with no HTTP and no scheduler: C rows are admitted (admit_many), then
`pool.step(chunk)` runs again and again; after each step the rows that ended are released
and the next prompts admitted into them, so every step has C rows live until the prompts
run out, as under a server whose clients came back at once. bare_tokens_per_s = the tokens
the steps returned over the time inside pool.step alone (the jitted loop of `chunk`
forwards, the span changes before it and the one device_get of its results; the admissions'
and releases' work is waited for before the step starts, or jax's asynchronous dispatch
would finish a prefill inside the step's time); bare_admitting_tokens_per_s also counts the
admissions (the prefills) and releases (tier gathers), work the server does too. The bare
loop gets the same unrecorded warm pass first.

ratio = server / bare: the share of its pool's bare decode speed the server delivers to
clients. Where the rest goes: rows/step (server: cardjax_batch_rows; bare: live rows per
step) says how full the server kept its batch, ms/step (server: the decode thread's step
time over its steps, which also finishes the prefills dispatched just before) whether its
steps cost more than the bare ones (the HTTP threads share the CPU and the GIL), and the
decode thread's shares how much of the wall time went to prefills, the admission wait,
delivering answers, or waiting idle for requests (the rest). For AR, whose rows write
`chunk` tokens a step, the three multiply to the ratio: (server rows/step / bare
rows/step) x (bare ms/step / server ms/step) x the step's share. Each level runs --repeats
server passes and bare passes in turn (a slow spell of a shared machine hits both) and
keeps the fastest of each, the server row's other figures from its fastest pass; the load
generator's threads share the machine with the server.

Warm-up: the first server starts with an empty --compilation-cache folder (in --out) and is
restarted with the same folder: warmup_first_s and warmup_cached_s, from the first method's
"cardjax serve: warm-up:" lines, the time from the first to "warm-up compiled N shapes"
(the server prints whole seconds). The other methods' servers use the same folder.
--keep-cache starts from the folder an earlier run left instead of an empty one.

--quick: AR only, 1 and 4 clients, batch sizes 1,4, 64 slots, 8 requests per level, one
pass: a check that the benchmark runs (tests/test_serve_overhead.py), not a measurement.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import string
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import portpicker

from benchmarks.common import ROOT, announce, arg_parser
from benchmarks.serve import model_name, run_clients, server_use, steady_rate
from cardjax.serve.metrics import scrape

PROMPT_LEN = 24  # one prompt width bucket (32): every level prefills the same shape
BLOCK, TAU = 4, 0.6
WIDTH = 32  # --width-bucket (the default): the prompts' padded width
DEFAULT = dict(methods="ar,mars", levels="1,4,16,64", batch_sizes="1,4,16,64", slots=256,
               requests_per_level=256)
QUICK = dict(methods="ar", levels="1,4", batch_sizes="1,4", slots=64, requests_per_level=8)
MIN_REQUESTS = 8  # per client, by default: a steady window between the ramps
SERVER_TIMEOUT_S = 600
COLUMNS = ("method", "clients", "server tokens/s", "steady tokens/s", "bare tokens/s",
           "server / bare", "bare with admissions tokens/s", "rows/step server",
           "rows/step bare", "ms/step server", "ms/step bare", "p50 latency s",
           "decode thread: share of wall time")


def write_run(folder: Path) -> Path:
  """A random-init model of the decode benchmark's shape with a 512-id BPE, saved in
  folder/run as a MARS training run saves it (tests/serve_helpers.py's save_run)."""
  import dataclasses

  import orbax.checkpoint as ocp
  from flax import nnx

  from cardjax import checkpoint
  from cardjax.config import base_config
  from cardjax.data.tokenizer import train_bpe
  from cardjax.model import create_model

  from benchmarks.decode_forward import CONFIG

  run = folder / "run"
  if (run / "checkpoints").is_dir():
    return run
  rng = random.Random(0)
  # Random letter words: enough distinct pairs for the BPE to fill all 512 ids, so every id
  # the model can write decodes to text.
  words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7)))
           for _ in range(400)]
  tok = train_bpe([" ".join(rng.choice(words) for _ in range(12)) for _ in range(500)],
                  CONFIG.vocab_size, folder / "tokenizer")
  model = create_model(dataclasses.replace(CONFIG, initializer_range=1.0,
                                           mask_token_id=tok.mask_id,
                                           eos_token_id=tok.eos_id), seed=0)
  config = base_config()
  config.objective.name = "mars"
  config.objective.block_size = BLOCK
  with checkpoint.manager(run / "checkpoints") as mngr:
    mngr.save(0, args=ocp.args.Composite(
        params=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(model, nnx.Param))),
        model_config=ocp.args.JsonSave(model.cfg.to_dict()),
        config=ocp.args.JsonSave(config.to_dict())))
    mngr.wait_until_finished()
  checkpoint.copy_assets(run / "checkpoints", folder / "tokenizer")
  return run


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
  """`n` prompts of PROMPT_LEN random ids past the specials (0..3): no two share a
  prefix-cache page, so each request prefills its own prompt."""
  rng = random.Random(seed)
  return [[rng.randrange(4, vocab) for _ in range(PROMPT_LEN)] for _ in range(n)]


# -- the server ----------------------------------------------------------------------------
class Server:
  """A `cardjax serve` subprocess whose output lines are read as they come, with the time
  each arrived: the warm-up's own log gives its length to the millisecond."""

  def __init__(self, run: Path, method: str, cache: Path, args):
    port = portpicker.pick_unused_port()
    cmd = [sys.executable, "-m", "cardjax.cli", "serve", "--checkpoint", str(run), "--port",
           str(port), "--method", method, "--model-name", "bench", "--batch-sizes",
           args.batch_sizes, "--chunk", str(args.chunk), "--slots", str(args.slots),
           "--width-bucket", str(WIDTH), "--tau", str(TAU), "--compilation-cache", str(cache),
           *shlex.split(args.server_flags)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # A test runner's simulated host devices would give the server a mesh, and a server
    # over a mesh decodes in chunks, not in a SlotPool.
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                              env.get("XLA_FLAGS", "")).strip()
    self.lines: list[tuple[float, str]] = []
    self.started = time.perf_counter()
    self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()
    self.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_TIMEOUT_S
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        self.reader.join(5)
        raise SystemExit(f"cardjax serve exited with {self.proc.returncode}:\n{self.output()}")
      try:
        with urllib.request.urlopen(self.url + "/health", timeout=1):
          self.startup_s = time.perf_counter() - self.started
          return
      except OSError:
        time.sleep(0.2)
    self.stop()
    raise SystemExit(f"cardjax serve did not answer in {SERVER_TIMEOUT_S}s:\n{self.output()}")

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.append((time.perf_counter(), line.rstrip("\n")))

  def output(self) -> str:
    return "\n".join(line for _, line in self.lines)

  def warmup(self) -> dict:
    """The warm-up's seconds (first log line to the summary), the server's own whole-second
    figure, the number of programs, and how many of them the server's program store loaded
    and compiled."""
    first = next((t for t, line in self.lines if "cardjax serve: warm-up:" in line), None)
    done = next(((t, line) for t, line in self.lines if "shapes ready in" in line), None)
    if done is None:
      raise SystemExit(f"no warm-up summary in the server's output:\n{self.output()}")
    found = re.search(r"(\d+) shapes ready in (\d+)s", done[1])
    kept = re.search(r"(\d+) loaded from .*, (\d+) compiled", done[1])
    return {"seconds": round(done[0] - (first or done[0]), 3),
            "printed_s": int(found[2]), "shapes": int(found[1]),
            "startup_s": round(self.startup_s, 3),
            **({"programs_loaded": int(kept[1]), "programs_compiled": int(kept[2])}
               if kept else {})}

  def stop(self) -> None:
    self.proc.terminate()
    try:
      self.proc.wait(30)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.reader.join(5)


def complete(url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
  """(seconds, completion tokens) of one greedy /v1/completions request."""
  body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
          "ignore_eos": True}
  request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  start = time.perf_counter()
  with urllib.request.urlopen(request, timeout=600) as r:
    answer = json.loads(r.read())
  return time.perf_counter() - start, answer["usage"]["completion_tokens"]


def server_level(url: str, model: str, per_client: list[list[list[int]]],
                 max_tokens: int) -> dict:
  """One closed-loop level: client k sends per_client[k] one after another (benchmarks/
  serve.py's level, with token-id prompts)."""
  clients = len(per_client)
  spans, lock = [], threading.Lock()
  firsts, lasts = [0.0] * clients, [0.0] * clients

  def client(k: int):
    for i, prompt in enumerate(per_client[k]):
      sent = time.perf_counter()
      firsts[k] = firsts[k] if i else sent
      seconds, tokens = complete(url, model, prompt, max_tokens)
      lasts[k] = sent + seconds
      with lock:
        spans.append((sent, sent + seconds, tokens))
  before = scrape(url)
  wall = run_clients(client, clients)
  after = scrape(url)
  tokens = sum(n for _, _, n in spans)
  if len(spans) != sum(map(len, per_client)) or tokens != len(spans) * max_tokens:
    raise SystemExit(f"{len(spans)} answers with {tokens} tokens: a request failed or ended "
                     "before max_tokens")
  use = server_use(before, after, wall)

  def delta(name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
  step_s = delta('cardjax_decode_thread_seconds_total{phase="step"}')
  steps = delta("cardjax_batch_rows_count")
  steady = steady_rate(spans, max(firsts), min(lasts))
  return {"tokens": tokens, "requests": len(spans), "wall_s": round(wall, 3),
          "server_tokens_per_s": tokens / wall,
          "server_steady_tokens_per_s": steady,
          "server_step_tokens_per_s": tokens / step_s if step_s > 0 else None,
          "server_ms_per_step": 1e3 * step_s / steps if steps else None,
          "server_rows_per_step": use["rows_per_step"], "thread_share": use["thread_share"],
          "p50_s": round(statistics.median(b - a for a, b, _ in spans), 3)}


# -- the bare loop -------------------------------------------------------------------------
def bare_level(pool, level_prompts: list[list[int]], rows: int, max_tokens: int, chunk: int,
               tau: float) -> dict:
  """The level's prompts through `pool` on `rows` rows, refilled as they end; pool.step
  timed apart from the admissions and releases (module docstring)."""
  import jax

  def settled():  # jax dispatches asynchronously: a prefill would finish inside the step
    jax.block_until_ready((pool.cache, pool.rows))

  waiting = list(reversed(level_prompts))
  held: set[int] = set()
  step_s = rows_s = 0.0
  tokens, steps, row_steps, key = 0, 0, 0, 0
  while waiting or held:
    admits = []
    while waiting and len(held) + len(admits) < rows:
      admits.append((key, waiting.pop(), tau, max_tokens))
      key += 1
    start = time.perf_counter()
    pool.admit_many(admits)
    held |= {a[0] for a in admits}
    settled()
    stepped = time.perf_counter()
    new, ended, _ = pool.step(chunk)
    released = time.perf_counter()
    for k in ended:
      pool.release(k)
      held.discard(k)
    settled()
    step_s += released - stepped
    rows_s += time.perf_counter() - released + stepped - start
    tokens += sum(map(len, new.values()))
    steps, row_steps = steps + 1, row_steps + len(new)
  if tokens != len(level_prompts) * max_tokens:
    raise SystemExit(f"the bare loop wrote {tokens} tokens, not {len(level_prompts)} x "
                     f"{max_tokens}")
  return {"bare_tokens_per_s": tokens / step_s, "bare_rows_per_step": row_steps / steps,
          "bare_ms_per_step": 1e3 * step_s / steps,
          "bare_admitting_tokens_per_s": tokens / (step_s + rows_s),
          "bare_steps": steps, "bare_step_s": round(step_s, 3),
          "bare_admit_release_s": round(rows_s, 3)}


def bare_pool(engine, method: str):
  """The SlotPool the server decodes these requests in: the pool of their settings (a
  pool per method, block, rule and ignore_eos), built as Engine.pool builds it."""
  return engine.pool(engine.settings({"method": method, "ignore_eos": True}))


# -- the report ----------------------------------------------------------------------------
def cell(value, digits: int = 0) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def table_line(r: dict) -> str:
  share = dict(r["thread_share"], idle=max(0.0, 1 - sum(r["thread_share"].values())))
  return (f"| {r['method']} | {r['clients']} | {cell(r['server_tokens_per_s'])} | "
          f"{cell(r['server_steady_tokens_per_s'])} | {cell(r['bare_tokens_per_s'])} | "
          f"{r['ratio']:.2f} | {cell(r['bare_admitting_tokens_per_s'])} | "
          f"{cell(r['server_rows_per_step'], 1)} | {cell(r['bare_rows_per_step'], 1)} | "
          f"{cell(r['server_ms_per_step'], 2)} | {cell(r['bare_ms_per_step'], 2)} | "
          f"{r['p50_s']:.3f} | " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in share.items())
          + " |")


def write(path: str | None, report: dict) -> None:
  if path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--json", default=None, help="write the levels, warm-ups and machine here")
  parser.add_argument("--checkpoint", default="", help="a run to serve instead of the "
                      "random-init one (its objective must serve the methods)")
  parser.add_argument("--methods", default=None, help="default ar,mars (--quick: ar)")
  parser.add_argument("--levels", default=None, help="clients; default 1,4,16,64 (--quick 1,4)")
  parser.add_argument("--requests", type=int, default=0,
                      help="per client per level (0: 256 requests a level, at least "
                           f"{MIN_REQUESTS} a client; --quick: 8 a level)")
  parser.add_argument("--repeats", type=int, default=None,
                      help="server and bare passes of a level, in turn, the fastest of each "
                           "kept (default 3, --quick 1)")
  parser.add_argument("--max-tokens", type=int, default=32)
  parser.add_argument("--chunk", type=int, default=16, help="forwards per decode step")
  parser.add_argument("--batch-sizes", default=None, help="default 1,4,16,64 (--quick 1,4)")
  parser.add_argument("--slots", type=int, default=None, help="default 256 (--quick 64)")
  parser.add_argument("--out", default="runs/serve_overhead",
                      help="the checkpoint and the compilation cache (emptied first)")
  parser.add_argument("--server-flags", default="",
                      help="more `cardjax serve` flags for the server side, e.g. "
                           "'--admit-wait 0.5' (the bare loop does not read them)")
  parser.add_argument("--keep-cache", action="store_true",
                      help="keep the compilation cache an earlier run left in --out: its "
                           "programs load instead of compiling, so warmup_first_s is not a "
                           "first start's (a second run on a machine whose time is short)")
  parser.add_argument("--quick", action="store_true", help="a check, not a measurement")
  args = parser.parse_args(argv)
  preset = QUICK if args.quick else DEFAULT
  for name in ("methods", "levels", "batch_sizes", "slots"):
    if getattr(args, name) is None:
      setattr(args, name, preset[name])
  methods, levels = args.methods.split(","), [int(c) for c in args.levels.split(",")]
  sizes = [int(b) for b in args.batch_sizes.split(",")]
  if max(levels) > max(sizes):
    parser.error(f"--levels {args.levels}: more clients than the largest batch size")
  min_requests = 1 if args.quick else MIN_REQUESTS
  repeats = args.repeats or (1 if args.quick else 3)

  def requests(clients: int) -> int:
    return args.requests or max(min_requests, preset["requests_per_level"] // clients)

  out = (ROOT / args.out).resolve()
  run = Path(args.checkpoint) if args.checkpoint else write_run(out)
  cache = out / "xla"
  if not args.keep_cache:
    shutil.rmtree(cache, ignore_errors=True)  # the first start compiles everything
  from cardjax.serve.cli import use_compilation_cache
  from cardjax.serve.engine import Engine

  # This process's pools compile the servers' programs: the servers' cache serves them.
  use_compilation_cache(str(cache))
  info = announce(f"cardjax serve against its bare decode step, {args.max_tokens} tokens a "
                  f"request (ignore_eos), chunk {args.chunk}, batch sizes {args.batch_sizes}, "
                  f"{args.slots} slots, prompts of {PROMPT_LEN} ids")
  import jax

  from cardjax.serve.cli import served_dtype

  # The servers' dtype (--dtype auto: bf16 on an accelerator), or --server-flags' one.
  flags = shlex.split(args.server_flags)
  choice = flags[flags.index("--dtype") + 1] if "--dtype" in flags[:-1] else "auto"
  dtype = served_dtype(choice, jax.default_backend())
  engine = Engine.load(str(run), name="bench", tau=TAU, chunk=args.chunk,
                       batch_sizes=tuple(sizes), width_bucket=WIDTH, slots=args.slots,
                       max_tokens=args.max_tokens, dtype=dtype)
  vocab = engine.tokenizer.vocab_size
  report = {"levels": [], "warmup_first_s": None, "warmup_cached_s": None, "machine": info,
            "warmup": {}, "checkpoint": str(run),
            "settings": {"max_tokens": args.max_tokens, "chunk": args.chunk, "dtype": dtype,
                         "keep_cache": args.keep_cache,
                         "server_flags": args.server_flags,
                         "batch_sizes": sizes, "slots": args.slots, "prompt_len": PROMPT_LEN,
                         "tau": TAU, "block": BLOCK, "repeats": repeats,
                         "quick": args.quick}}
  started = time.perf_counter()
  for i, method in enumerate(methods):
    server = Server(run, method, cache, args)
    try:
      report["warmup"][method] = server.warmup()
      if i == 0:  # the same server again, its programs now in the cache
        report["warmup_first_s"] = report["warmup"][method]["seconds"]
        server.stop()
        server = Server(run, method, cache, args)
        report["warmup"][method + " cached"] = server.warmup()
        report["warmup_cached_s"] = report["warmup"][method + " cached"]["seconds"]
      print(f"{method}: warm-up {report['warmup'][method]['seconds']:.1f}s"
            + (f", cached {report['warmup_cached_s']:.1f}s" if i == 0 else ""), flush=True)
      pool, tau = bare_pool(engine, method), TAU if method == "mars" else 1.0
      name = model_name(server.url)
      for clients in levels:
        n = requests(clients)
        seed = 1000 * clients + (i + 1)
        warm = prompts(clients, vocab, seed)  # one request a client, unrecorded
        level = prompts(clients * n, vocab, seed + 500)
        first = server_level(server.url, name, [[p] for p in warm], args.max_tokens)
        bare_level(pool, warm, clients, args.max_tokens, args.chunk, tau)
        served, bare = [], []
        for _ in range(repeats):  # in turn: a slow spell of a shared machine hits both
          served.append(server_level(server.url, name, [level[k * n:(k + 1) * n]
                                                        for k in range(clients)],
                                     args.max_tokens))
          bare.append(bare_level(pool, level, clients, args.max_tokens, args.chunk, tau))
        row = {"method": method, "clients": clients,
               **max(served, key=lambda r: r["server_tokens_per_s"]),
               **max(bare, key=lambda r: r["bare_tokens_per_s"]),
               "server_tokens_per_s_each": [r["server_tokens_per_s"] for r in served],
               "bare_tokens_per_s_each": [r["bare_tokens_per_s"] for r in bare]}
        row["ratio"] = row["server_tokens_per_s"] / row["bare_tokens_per_s"]
        row["first_burst_tokens_per_s"] = first["server_tokens_per_s"]
        row["compilations_after_warmup"] = scrape(server.url).get(
            "cardjax_compilations_total", 0.0)
        row["rows_per_step"] = row["server_rows_per_step"] or row["bare_rows_per_step"]
        report["levels"].append(row)
        print(json.dumps(row), flush=True)
        write(args.json, report)  # after every level: a run cut short keeps what it measured
    finally:
      server.stop()
  print(f"\n({time.perf_counter() - started:.0f} s) warm-up of `cardjax serve --method "
        f"{methods[0]}`: {report['warmup_first_s']:.1f}s first, {report['warmup_cached_s']:.1f}s "
        "from the compilation cache; "
        + ", ".join(f"{k} {w['shapes']} programs {w['seconds']:.1f}s (start to /health "
                    f"{w['startup_s']:.1f}s)" for k, w in report["warmup"].items()) + "\n")
  print("| " + " | ".join(COLUMNS) + " |")
  print("|" + "---|" * len(COLUMNS))
  for r in report["levels"]:
    print(table_line(r))
  write(args.json, report)
  bad = [(r["method"], r["clients"]) for r in report["levels"]
         if not all(math.isfinite(r[k]) and r[k] > 0 for k in
                    ("server_tokens_per_s", "bare_tokens_per_s", "ratio", "rows_per_step"))]
  assert not bad, bad


if __name__ == "__main__":
  main()
