"""`cardjax serve`: load a checkpoint and serve it over HTTP with uvicorn."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time

from cardjax.errors import CardjaxError
from cardjax.serve import limits
from cardjax.serve.scheduler import ADMIT_WAIT


def is_loopback(host: str) -> bool:
  """localhost, 127.0.0.0/8 or ::1; a name is resolved."""
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    try:
      return all(ipaddress.ip_address(info[4][0]).is_loopback
                 for info in socket.getaddrinfo(host, None))
    except OSError:
      return False


def parse_sizes(text: str) -> tuple[int, ...]:
  try:
    sizes = tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    sizes = ()
  if not sizes or min(sizes) < 1:
    raise CardjaxError(f"--batch-sizes={text!r} must be positive integers separated by "
                       "commas, e.g. 1,4,16")
  return sizes


def add_arguments(p) -> None:
  """The flags of `cardjax serve`."""
  p.add_argument("--checkpoint", required=True,
                 help="a run folder or its checkpoints/ (local, gs:// or s3://)")
  p.add_argument("--method", default="ar",
                 help="default decoding method: ar | mars | card | dus | eb | cb (a request "
                      "may pick another that the checkpoint serves)")
  p.add_argument("--objective", default="",
                 help="the checkpoint's objective when it has no run config (an import)")
  p.add_argument("--tokenizer", default="", help="HF tokenizer folder (default: the run's)")
  p.add_argument("--model-name", default="",
                 help="the model id clients send (default: the run folder's name)")
  p.add_argument("--tau", type=float, default=0.95,
                 help="mars / card: default threshold (a request's tau overrides it)")
  p.add_argument("--block", type=int, default=0,
                 help="mars: tokens drafted per forward (0: the run's block size); card / "
                      "dus / eb / cb: block length (0: 4)")
  p.add_argument("--rule", default="prob", help="mars: prob | entropy | margin | entropy_nats")
  p.add_argument("--verify", action="store_true", help="mars: self-verified, lossless")
  p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--allow-remote", action="store_true",
                 help="allow binding a non-loopback --host (needs --api-key)")
  p.add_argument("--api-key", default=os.environ.get("CARDJAX_API_KEY", ""),
                 help="clients must send 'Authorization: Bearer KEY' to /v1 (401 otherwise); "
                      "default: $CARDJAX_API_KEY; required with --allow-remote")
  p.add_argument("--max-body-bytes", type=int, default=limits.MAX_BODY_BYTES,
                 help="a larger request body is refused with 413 before it is read whole")
  p.add_argument("--max-queue", type=int, default=limits.MAX_QUEUE,
                 help="the most requests that wait for a row; past it 429 with Retry-After")
  p.add_argument("--batch-sizes", default="1,4,16",
                 help="compiled batch sizes; a batch is padded to the smallest that fits")
  p.add_argument("--chunk", type=int, default=16,
                 help="forwards per decode step (AR, MARS) or new tokens per row per call "
                      "(other methods); requests join and leave between them")
  p.add_argument("--slots", type=int, default=512,
                 help="AR and MARS: KV-cache slots per row, kept for a request's whole life "
                      "(its longest prompt + completion); 0: decode every method in chunks, "
                      "re-prefilling each call")
  p.add_argument("--span-min", type=int, default=64,
                 help="AR and MARS: the smallest cache span; a step's attention reads only "
                      "the span (span buckets double from this up to --slots) that its rows "
                      "can reach, not all the slots (0: every step reads all --slots)")
  p.add_argument("--prefill-rows", type=int, default=16,
                 help="AR and MARS: the most prompts one prefill forward admits together "
                      "(padded to a --batch-sizes entry); 1: one forward per request")
  p.add_argument("--prefix-page", type=int, default=16,
                 help="AR and MARS: keep the KV of prompt prefixes that requests share (the "
                      "chat template's system turn from the start; others learned in "
                      "multiples of this many tokens) and prefill only what follows; 0: off")
  p.add_argument("--admit-wait", type=float, default=ADMIT_WAIT,
                 help="AR and MARS: when a step frees rows while others decode on, wait up "
                      "to this fraction of the step's time for new requests to fill them "
                      "before the next step (a client that got its answer often sends the "
                      "next at once); 0: never wait")
  p.add_argument("--refill-step", type=int, default=0,
                 help="AR and MARS: forwards of the steps run while rows that ended stand "
                      "empty and their clients' next requests may be on the way, so that "
                      "those join sooner (a step is the unit of admission), e.g. a quarter "
                      "of --chunk; 0 (the default): every step runs --chunk")
  p.add_argument("--no-overlap", dest="overlap", action="store_false",
                 help="AR and MARS: read each decode step's tokens before launching the next "
                      "(by default the next step is launched first, so the device computes "
                      "while the server delivers)")
  p.add_argument("--width-bucket", type=int, default=32,
                 help="prompts are left-padded to a multiple of this (compiled widths)")
  p.add_argument("--warmup-width", type=int, default=-1,
                 help="before serving, compile the default method's programs for every "
                      "batch size and prompt width up to this many tokens (-1, the default: "
                      "up to the longest prompt a request may send, or 256 tokens for the "
                      "methods decoded in chunks; 0: compile on first use, so early "
                      "requests wait for compiles)")
  p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                 help="the weights' and activations' dtype: auto is bfloat16 on a GPU or TPU "
                      "(a decoding forward reads half the bytes) and float32 on a CPU")
  p.add_argument("--forwards-per-check", default="auto",
                 help="AR and MARS: forwards a step runs between two tests of whether any "
                      "row is still live (each test is a round trip to the host on a GPU); "
                      "a row that stops sooner idles through the rest. auto: 4 on a GPU or "
                      "TPU, 1 on a CPU")
  p.add_argument("--scan-layers", default="auto", choices=("auto", "on", "off"),
                 help="serve with the layers in one scanned block (on) or unrolled (off), "
                      "whatever the checkpoint's layout: scanned, each program compiles one "
                      "block instead of one per layer; auto is on on a GPU or TPU, where a "
                      "warm-up compiles hundreds of slow programs, and off on a CPU")
  p.add_argument("--compilation-cache", default=default_compilation_cache(),
                 help="keep compiled programs in this folder, so a restart on this machine "
                      "loads them instead of compiling again (default: "
                      "$JAX_COMPILATION_CACHE_DIR, else ~/.cache/cardjax/xla); '' turns it off")
  p.add_argument("--max-tokens", type=int, default=64,
                 help="a request's max_tokens when it sends none (less where the prompt "
                      "leaves less room in the context)")
  p.add_argument("--target-latency-ms", type=float, default=0.0,
                 help="mars: lower the server's tau (down to --tau-min) while requests "
                      "queue and latency exceeds this; raise it (up to --tau-max) when idle")
  p.add_argument("--tau-min", type=float, default=0.5)
  p.add_argument("--tau-max", type=float, default=0.95)
  p.add_argument("--log-level", default="warning", help="uvicorn's log level")


def default_compilation_cache() -> str:
  """$JAX_COMPILATION_CACHE_DIR (the variable jax itself reads), else the user's cache
  folder ($XDG_CACHE_HOME or ~/.cache) /cardjax/xla."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "cardjax", "xla")


def use_compilation_cache(path: str) -> None:
  """Before the first compile. A served model's programs are many and small (each batch
  size, prompt width and cache span), so every one is kept, not only the slow ones; the
  pools also keep theirs whole, loaded on a restart without tracing (serve/pool/stored.py)."""
  import jax

  from cardjax.serve.pool import stored

  stored.use(path)
  if not path:
    return
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def on_accelerator(backend: str) -> bool:
  """Whether jax's default backend is a GPU or TPU (the `auto` defaults below differ)."""
  return backend in ("gpu", "tpu", "cuda", "rocm")


def served_dtype(choice: str, backend: str) -> str:
  """--dtype: auto serves in bfloat16 on accelerators and float32 on a CPU, whose bf16
  matmuls are no faster and round differently from the trained fp32 model."""
  if choice != "auto":
    return choice
  return "bfloat16" if on_accelerator(backend) else "float32"


def forwards_per_check(choice: str, backend: str) -> int:
  """--forwards-per-check: auto is 4 on accelerators, where testing the step loop's
  condition reads a flag back to the host, and 1 on a CPU, where it costs nothing and
  every extra forward of a stopped row is paid in full."""
  if choice == "auto":
    return 4 if on_accelerator(backend) else 1
  if not choice.isdigit() or int(choice) < 1:
    raise CardjaxError(f"--forwards-per-check={choice} must be auto or a positive integer")
  return int(choice)


def served_scan(choice: str, backend: str) -> bool:
  """--scan-layers: auto scans on accelerators, where each of a warm-up's programs compiles
  slowly, and unrolls on a CPU (docs/serving.md has the measured costs)."""
  if choice != "auto":
    return choice == "on"
  return on_accelerator(backend)


def run(args) -> None:
  import jax
  import uvicorn

  from cardjax.parallel import make_mesh
  from cardjax.serve.app import create_app
  from cardjax.serve.engine import Engine
  from cardjax.serve.pool import stored
  from cardjax.serve.scheduler import check_admit_wait, check_refill_step
  from cardjax.serve.tau import TauControl

  if not is_loopback(args.host):
    if not args.allow_remote:
      raise CardjaxError(f"--host {args.host} is not a loopback address: pass --allow-remote "
                         "and --api-key KEY to bind it")
    if not args.api_key:
      raise CardjaxError(f"--host {args.host} with --allow-remote needs --api-key KEY (or "
                         "$CARDJAX_API_KEY): without one anyone who reaches the port could "
                         "use the server")
  check_admit_wait(args.admit_wait)  # before the model loads
  check_refill_step(args.refill_step, args.chunk)
  if args.warmup_width < -1:
    raise CardjaxError(f"--warmup-width={args.warmup_width} must be -1 (every width), 0 (no "
                       "warm-up) or a prompt length")
  use_compilation_cache(args.compilation_cache)
  bounds = limits.Limits(args.max_body_bytes, args.max_queue, args.api_key)
  sizes = parse_sizes(args.batch_sizes)
  tau = TauControl(args.tau, args.target_latency_ms, args.tau_min, args.tau_max)
  mesh = make_mesh(1, -1, 1) if jax.device_count() > 1 else None
  dtype = served_dtype(args.dtype, jax.default_backend())
  scan = served_scan(args.scan_layers, jax.default_backend())
  unroll = forwards_per_check(args.forwards_per_check, jax.default_backend())
  engine = Engine.load(args.checkpoint, tokenizer=args.tokenizer, objective=args.objective,
                       dtype=dtype, scan_layers=scan,
                       name=args.model_name, mesh=mesh, method=args.method, tau=tau.tau,
                       block=args.block, verify=args.verify, rule=args.rule,
                       chunk=args.chunk, batch_sizes=sizes, width_bucket=args.width_bucket,
                       max_tokens=args.max_tokens, slots=args.slots, span_min=args.span_min,
                       prefill_rows=args.prefill_rows, prefix_page=args.prefix_page,
                       unroll=unroll)
  if args.warmup_width != 0:
    start = time.perf_counter()
    shapes = engine.warmup(None if args.warmup_width < 0 else args.warmup_width,
                           log=lambda line: print(line, file=sys.stderr))
    store = stored.default()
    kept = (f"; programs: {store.loaded} loaded from {store.folder}, {store.compiled} compiled"
            if store else "")
    print(f"cardjax serve: warm-up: {shapes} shapes ready in "
          f"{time.perf_counter() - start:.0f}s{kept}", file=sys.stderr)
  app = create_app(engine, tau, args.admit_wait, bounds, overlap=args.overlap,
                   refill_step=args.refill_step)
  d = engine.default
  print(f"cardjax serve: model {engine.name!r} (objective {engine.objective or 'unknown'}), "
        f"method {d.method}" + (f" B={d.block}" if d.method != "ar" else "") +
        f", {dtype}, batch sizes {engine.batch_sizes}, chunk {engine.chunk}, "
        + (f"{engine.slots} slots a row" if engine.continuous(d) else "chunked") + "; "
        + (f"compiled programs kept in {args.compilation_cache}; " if args.compilation_cache
           else "")
        + f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
  # uvicorn's SIGTERM / Ctrl-C: stop accepting, finish in-flight requests, then exit.
  uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
              timeout_graceful_shutdown=None)
