"""Where a served request's host time goes: the CPU each thread of `cardjax serve` spends over
one closed-loop level, and the event loop's CPU per request.

  python -m benchmarks.studies.serve_host_cost [--clients 16] [--requests 64] [--method ar]
      [--server-flags FLAGS] [--keep-alive] [--out DIR] [--json OUT]

The server and its model are benchmarks/serve_overhead.py's (the decode benchmark's shape,
random weights, --chunk 16, batch sizes 1,4,16,64, 256 slots, its warm-up, a compilation
cache in --out). C client threads send --requests 24-token prompts each (32 tokens back,
greedy, ignore_eos) one after another, after a warm level of 16 requests each. Over the
measured level the study reads each server thread's CPU time from /proc (Linux): the XLA
compute pool (threads named tf_XLAEigen), the event loop (the process's main thread, where
uvicorn runs), and the other threads (the decode thread; jax's threads, which run each
program's unsplit ops and dispatch: at one row most of a step runs there), as
cores in use over the wall time; the event loop's CPU per request; the load generator's own
CPU. With --keep-alive each client keeps one HTTP connection (as the OpenAI client does)
instead of urllib's connection per request.

What it answers: whether the two cores are saturated (the sum of the columns against 2)
and how much event-loop time each request costs. Closed-loop clients whose answers go out
together send their next requests together, and one event loop handles them in turn, so
that cost times the clients is how long the last of them takes to come back.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import types
import urllib.parse
from pathlib import Path

from benchmarks import serve_overhead
from benchmarks.common import announce, arg_parser


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
  """CPU seconds per (thread id, thread name) of process `pid`."""
  tick = os.sysconf("SC_CLK_TCK")
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
      fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # the thread ended
      continue
    out[(int(tid), name)] = (int(fields[11]) + int(fields[12])) / tick
  return out


def keep_alive_complete():
  """serve_overhead.complete with one persistent connection per client thread."""
  local = threading.local()

  def complete(url: str, model: str, prompt: list[int], max_tokens: int):
    if getattr(local, "conn", None) is None:
      parts = urllib.parse.urlparse(url)
      local.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True})
    start = time.perf_counter()
    local.conn.request("POST", "/v1/completions", body=body,
                       headers={"Content-Type": "application/json"})
    answer = json.loads(local.conn.getresponse().read())
    return time.perf_counter() - start, answer["usage"]["completion_tokens"]
  return complete


def main(argv: list[str] | None = None) -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--clients", type=int, default=16)
  parser.add_argument("--requests", type=int, default=64, help="per client, measured")
  parser.add_argument("--method", default="ar", choices=("ar", "mars"))
  parser.add_argument("--server-flags", default="")
  parser.add_argument("--keep-alive", action="store_true")
  parser.add_argument("--out", default="runs/serve_host_cost")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  run = out / "run" if (out / "run").exists() else serve_overhead.write_run(out)
  if args.keep_alive:
    serve_overhead.complete = keep_alive_complete()
  # The options serve_overhead.Server reads from its own command line.
  options = types.SimpleNamespace(batch_sizes="1,4,16,64", chunk=16, slots=256,
                                  server_flags=args.server_flags)
  info = announce(f"serve host cost, {args.method}, {args.clients} clients")
  server = serve_overhead.Server(run, args.method, out / "compilation_cache", options)
  try:
    def per_client(n: int, seed: int) -> list[list[list[int]]]:
      ids = serve_overhead.prompts(args.clients * n, 512, seed)  # write_run: 512 ids
      return [ids[k * n:(k + 1) * n] for k in range(args.clients)]
    serve_overhead.server_level(server.url, "bench", per_client(16, 0), 32)  # warm
    before, clock = thread_cpu(server.proc.pid), time.perf_counter()
    mine = os.times()
    level = serve_overhead.server_level(
        server.url, "bench", per_client(args.requests, 1), 32)
    wall = time.perf_counter() - clock
    after, mine_after = thread_cpu(server.proc.pid), os.times()
  finally:
    server.stop()
  used = {key: after[key] - before.get(key, 0.0) for key in after}
  xla = sum(v for (_, name), v in used.items() if name.startswith("tf_XLA"))
  loop = sum(v for (tid, _), v in used.items() if tid == server.proc.pid)
  other = sum(used.values()) - xla - loop
  client = (mine_after.user + mine_after.system) - (mine.user + mine.system)
  report = {
      "method": args.method, "clients": args.clients, "requests": level["requests"],
      "keep_alive": args.keep_alive, "server_flags": args.server_flags,
      "tokens_per_s": round(level["server_tokens_per_s"], 1),
      "rows_per_step": level["server_rows_per_step"], "thread_share": level["thread_share"],
      "cores": {"xla_compute": round(xla / wall, 3), "event_loop": round(loop / wall, 3),
                "other_threads": round(other / wall, 3), "clients": round(client / wall, 3)},
      "event_loop_ms_per_request": round(1e3 * loop / level["requests"], 3),
      "machine": info}
  print(json.dumps(report, indent=1))
  serve_overhead.write(args.json, report)


if __name__ == "__main__":
  main()
