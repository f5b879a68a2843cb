"""The model a server serves: continuous batching over rows that keep their KV cache, and
chunked decode calls for the methods that cannot.

Continuous (AR and MARS threshold decoding, greedy or sampled, seeded or not): one
`SlotPool` (cardjax/serve/pool/slots.py) per (method, block, rule, stop ids), each row
holding one request's KV cache for its whole life, `slots` slots long (--slots: the longest
prompt + completion a request can reach). A request is prefilled once, when it is admitted,
and then decodes in every step of its pool until it ends; rows join and leave between
steps. Each request keeps its own tau, temperature, top_p and seed in its row.

Chunked (CARD, DUS, EB/CB, MDLM, self-verified MARS, --slots 0, or a device mesh): the
jitted decoders run a batch to completion and keep no state between calls, so the
server decodes in chunks: each call writes at most `chunk` new tokens per row, from the
row's prompt plus what it has generated so far. A row's KV cache is rebuilt by each
chunk's prefill (one batched forward over the context, cheap next to the chunk's decode
forwards for short contexts); in exchange a batch can be re-formed between chunks, so a
finished or disconnected request frees its row for a waiting one. Every call has a static
shape from a small set: the batch is padded to one of `batch_sizes` and the prompts to a
multiple of `width_bucket` (passed to the decoders and pools), so nothing compiles per
request.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import sys

from cardjax.errors import CardjaxError


# The thread that compiles in the background (its compiles are not a request's).
COMPILE_THREAD = "cardjax-compile"
# The default warm-up's longest prompt for methods decoded in chunks (Engine.warmup).
CHUNKED_WARMUP = 256


@dataclasses.dataclass(frozen=True)
class Settings:
  """A request's decoder settings. A chunked decode call has one value of each for its
  batch (Settings.group); a SlotPool step only one method, block, rule (pool_key)."""
  method: str
  temperature: float = 0.0
  top_p: float = 1.0
  tau: float | None = None  # None: the server's tau (load-aware with --target-latency-ms)
  block: int = 4
  verify: bool = False
  rule: str = "prob"
  seed: int | None = None  # with temperature > 0: the request decodes alone, reproducibly
  ignore_eos: bool = False  # decode to max_tokens through stop tokens (load tests)

  def group(self) -> tuple:
    """The batching key of a chunked decode call (the seed is left to the scheduler: see
    Job.group)."""
    return (self.method, self.temperature, self.top_p, self.tau, self.block, self.verify,
            self.rule, self.ignore_eos)

  def pool_key(self) -> tuple:
    """What a SlotPool's step compiles for: requests that share it share a pool (their
    tau, temperature, top_p and seed are per-row values)."""
    return (self.method, self.block, self.rule, self.ignore_eos)


class Engine:
  """A restored checkpoint, its tokenizer and run settings, and a chunked decode call."""

  def __init__(self, model, tokenizer, objective: str | None, run_config, name: str,
               method: str = "ar", tau: float = 0.95, block: int = 0, verify: bool = False,
               rule: str = "prob", chunk: int = 16, batch_sizes=(1, 4, 16),
               width_bucket: int = 32, max_tokens: int = 64, mesh=None, slots: int = 512,
               span_min: int = 64, prefill_rows: int | None = None,
               prefix_page: int | None = None, unroll: int = 1):
    from cardjax.decoding.cli import resolve_block
    from cardjax.decoding.frozen import freeze
    from cardjax.serve.pool.prefixes import PAGE
    from cardjax.serve.pool.slots import PREFILL_ROWS, check_pool_options

    # None: the pool's own defaults (slots.PREFILL_ROWS, prefixes.PAGE).
    prefill_rows = PREFILL_ROWS if prefill_rows is None else prefill_rows
    prefix_page = PAGE if prefix_page is None else prefix_page

    if unroll < 1:
      raise CardjaxError(f"--forwards-per-check={unroll} must be >= 1")
    self.unroll = unroll
    if chunk < 1:
      raise CardjaxError(f"--chunk={chunk} must be >= 1 (new tokens per row per decode call)")
    if not batch_sizes or min(batch_sizes) < 1:
      raise CardjaxError(f"--batch-sizes={batch_sizes} must be positive integers, e.g. 1,4,16")
    if max_tokens < 1:
      raise CardjaxError(f"--max-tokens={max_tokens} must be >= 1 (a request's default)")
    if width_bucket < 1:
      raise CardjaxError(f"--width-bucket={width_bucket} must be >= 1")
    if slots < 0:
      raise CardjaxError(f"--slots={slots} must be >= 0 (0: chunked decoding only)")
    check_pool_options(span_min, prefill_rows, prefix_page, flags=True)
    self.slots, self.span_min, self.prefill_rows = slots, span_min, prefill_rows
    self.prefix_page, self._prefixes = prefix_page, None
    self.pools: dict = {}
    # Compiles a request could wait for (a learned prefix's programs) run here instead.
    self.compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=COMPILE_THREAD)
    self.model = freeze(model)
    self.cfg = model.cfg
    self.tokenizer = tokenizer
    self.objective = objective
    self.run_config = run_config
    self.name = name
    self.chunk = chunk
    self.max_tokens = max_tokens  # a request's max_tokens when it gives none
    self.batch_sizes = tuple(sorted(set(batch_sizes)))
    self.mesh = mesh
    self.width_bucket = width_bucket  # prompts are padded to a multiple of it (every path)
    self._resolve_block = resolve_block
    self.tau = tau  # the server's MARS tau (Settings.tau None); tau.py may move it
    self.default = self._build(method, None, block, verify, rule,
                               log=lambda line: print(line, file=sys.stderr))

  @classmethod
  def load(cls, checkpoint: str, tokenizer: str = "", objective: str = "", name: str = "",
           mesh=None, dtype: str = "", scan_layers: bool | None = None,
           **kwargs) -> "Engine":
    """Restore as `cardjax generate` does (cardjax.restore.load_run): the run's objective
    decides the methods; the model's name is the run folder's. `dtype`: serve in it
    (weights and compute; "" as saved); `scan_layers`: serve with the layers scanned (True)
    or unrolled (False), whatever layout was saved (None: as saved)."""
    from cardjax.restore import load_run

    run = load_run(checkpoint, mesh=mesh, tokenizer=tokenizer, objective=objective,
                   dtype=dtype)
    model = run.model
    if scan_layers is not None and model.cfg.scan_layers != scan_layers:
      from cardjax.model.layout import with_layout

      model = with_layout(model, scan_layers)  # compile one block, not one per layer
    root = run.root
    name = name or (root.parent.name if root.name == "checkpoints" else root.name)
    return cls(model, run.tokenizer, run.objective, run.run_config, name, mesh=mesh,
               **kwargs)

  def settings(self, ext: dict, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None) -> Settings:
    """A request's settings: its extension keys (method, tau, block, verify, rule,
    ignore_eos) over the server's defaults. Checked here, so a bad value fails its
    request, not a batch."""
    d = self.default
    method = ext.get("method") or d.method
    same = method == d.method
    s = self._build(method, ext.get("tau"), ext.get("block") or (d.block if same else 0),
                    ext.get("verify", d.verify if same else False),
                    ext.get("rule") or d.rule, temperature, top_p, seed)
    return dataclasses.replace(s, ignore_eos=bool(ext.get("ignore_eos", False)))

  def _build(self, method: str, tau, block: int, verify: bool, rule: str,
             temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
             log=None) -> Settings:
    from cardjax.decoding import mars
    from cardjax.decoding.methods import check_method

    check_method(method, self.objective, where=f"model {self.name!r}")
    block = self._resolve_block(method, block, self.run_config, log or (lambda line: None))
    if method != "ar" and self.cfg.mask_token_id < 0:
      raise CardjaxError(f"method {method} needs the model's [MASK] id and model "
                         f"{self.name!r} has none; use method ar")
    if verify and method != "mars":
      raise CardjaxError(f"verify applies to method mars only, not {method}")
    if method == "mars":
      mars.check_args(self.tau if tau is None else tau, block, self.cfg.mask_token_id, rule,
                      temperature, top_p)
      if verify and temperature > 0:
        raise CardjaxError(f"verify decodes exactly AR greedy and cannot sample "
                           f"(temperature={temperature}): drop verify or set temperature 0")
    elif method != "ar":
      if temperature > 0:
        raise CardjaxError(f"method {method} does not sample (temperature={temperature}): "
                           "set temperature 0, or use method ar or mars")
      if tau is not None and not 0.0 <= tau <= 1.0:
        raise CardjaxError(f"tau={tau} must lie in [0, 1]")
    if method == "ar" or verify:  # settings these decoders do not read
      tau, rule = None, "prob"
    if method == "ar":
      block = 0
    # The seed and top_p matter only when sampling: greedy requests are one group.
    seed = seed if temperature > 0 else None
    top_p = top_p if temperature > 0 else 1.0
    return Settings(method, float(temperature), float(top_p),
                    None if tau is None else float(tau), int(block), bool(verify), rule, seed)

  def row_methods(self) -> list[Settings]:
    """The default settings and, where the model serves it and it decodes in rows too, the
    other of AR and MARS with the server's defaults."""
    out = [self.default]
    other = {"ar": "mars", "mars": "ar"}.get(self.default.method)
    try:
      s = self._build(other, None, 0, False, "prob") if other else None
    except CardjaxError:  # e.g. MARS on a model with no [MASK] or an AR-only run
      s = None
    if s is not None and self.continuous(s) and self.continuous(self.default):
      out.append(s)
    return out

  def continuous(self, s: Settings) -> bool:
    """Whether requests with these settings decode in a SlotPool (module docstring)."""
    # A SlotPool lives on one device: a server over a device mesh decodes in chunks.
    return (self.slots > 0 and self.mesh is None and s.method in ("ar", "mars")
            and not s.verify)

  def context(self, s: Settings) -> int:
    """Positions a request's prompt and completion share."""
    limit = self.cfg.max_position_embeddings
    return min(limit, self.slots) if self.continuous(s) else limit

  def room(self, s: Settings) -> int:
    """Context positions a call needs after its prompt (the decoders' windows)."""
    if self.continuous(s):
      return 1 if s.method == "ar" else 2 * s.block
    return self.chunk if s.method == "ar" else self.chunk + 3 * s.block

  def prompt_limit(self, s: Settings) -> int:
    """The longest context (prompt + generated) a row can decode another call from."""
    return self.context(s) - self.room(s)

  def pool(self, s: Settings):
    """The SlotPool of these (continuous) settings, built on first use."""
    from cardjax.serve.pool.slots import SlotPool

    key = s.pool_key()
    if key not in self.pools:
      stop_ids = self.tokenizer.stop_ids
      if s.ignore_eos:  # ids no token has, as many: the same compiled programs
        stop_ids = (-1,) * len(stop_ids)
      self.pools[key] = SlotPool(self.model, s.method, slots=self.context(s),
                                 batch_sizes=self.batch_sizes, block=s.block or 4,
                                 rule=s.rule, stop_ids=stop_ids, pad_id=self.tokenizer.pad_id,
                                 bucket=self.width_bucket, span_min=self.span_min,
                                 prefill_rows=self.prefill_rows, prefixes=self.prefixes(),
                                 background=self.compiler, unroll=self.unroll)
    return self.pools[key]

  def prefixes(self):
    """The PrefixStore every pool shares (a prefix's KV does not depend on the method),
    holding the chat template's opening from the start."""
    from cardjax.serve.pool.prefixes import PrefixStore

    if self._prefixes is None:
      self._prefixes = PrefixStore(self.model, self.prefix_page, background=self.compiler)
      prefix = self.chat_prefix()
      if self.prefix_page and len(prefix) >= self.prefix_page:
        self._prefixes.add(prefix)
    return self._prefixes

  def chat_prefix(self) -> list[int]:
    """The tokens every chat prompt of one user message starts with, whatever it says:
    the chat template's opening (its default system turn). The pools store its KV from
    the start (pool/prefixes.py), at its exact length rather than in pages."""
    from cardjax.serve.pool.prefixes import common_length

    t = self.tokenizer
    try:
      renders = [t.encode(t.render_chat([{"role": "user", "content": text}],
                                        add_generation_prompt=True))
                 for text in ("a", "What", " 1", "\n", "<")]
    except Exception:  # a template that wants more than one user turn: learn prefixes only
      return []
    return renders[0][:min(common_length(renders[0], r) for r in renders[1:])]

  def release(self, s: Settings, key) -> None:
    """Free `key`'s row in its pool, if the pool still holds it."""
    pool = self.pools.get(s.pool_key())
    if pool is not None and key in pool.owner:
      pool.release(key)

  def drop_pool(self, s: Settings) -> None:
    """Forget a pool whose state a failed step may have consumed (donated buffers)."""
    self.pools.pop(s.pool_key(), None)

  def batch_size(self, rows: int) -> int:
    """The compiled batch size that holds `rows` (rows <= max(batch_sizes))."""
    return next(b for b in self.batch_sizes if b >= rows)

  def decode(self, s: Settings, prompts: list[list[int]], tau: float | None, seed: int):
    """One chunk: a Generation for `prompts` padded with one-token rows to a compiled
    batch size (those rows are dropped from the result)."""
    import contextlib

    import jax

    from cardjax.decoding.methods import Options, make_decoder

    rows = len(prompts)
    padded = list(prompts) + [[self.tokenizer.pad_id]] * (self.batch_size(rows) - rows)
    stop_ids = self.tokenizer.stop_ids
    if s.ignore_eos:  # ids no token has, as many: the same compiled program
      stop_ids = (-1,) * len(stop_ids)
    options = Options(max_new_tokens=self.chunk, stop_ids=stop_ids,
                      pad_id=self.tokenizer.pad_id, temperature=s.temperature, top_p=s.top_p,
                      seed=seed, tau=self.tau if tau is None else tau, block=s.block or 4,
                      rule=s.rule, verify=s.verify, bucket=self.width_bucket)
    decoder = make_decoder(s.method, self.model, self.objective, options)
    with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
      out = decoder(padded)
    out.tokens, out.lengths = out.tokens[:rows], out.lengths[:rows]
    return out

  def warmup(self, max_width: int | None = None, log=None) -> int:
    """Compile the default settings' programs before serving, so that no request waits for
    a compile: every batch size and prompt width up to `max_width` tokens (None: the
    longest prompt a request may send). Returns the number of programs."""
    say = log and (lambda line: log(f"cardjax serve: warm-up: {line}"))
    if self.continuous(self.default):
      # Per pool of rows: the prefill of every prefill batch, width and stored prefix the
      # server starts with (the chat template's: chat prompts prefill what follows it);
      # the step, row puts, row release and the gathers between tiers and spans for every
      # tier and span. The default method's pool and, when the model serves it, the other
      # of AR and MARS (a request may ask for either).
      shapes = 0
      for s in self.row_methods():
        pool = self.pool(s)
        prefixes = sorted({0} | {len(p) for p in pool.prefixes.entries})
        tag = say and (lambda line, m=s.method: say(f"{m} {line}"))
        shapes += (pool.compile_prefills(max_width, prefixes, log=tag) +
                   pool.compile_steps(self.chunk, tag))
      return shapes
    bucket = self.width_bucket
    # Decoded in chunks, every bucket is a program of the whole decoder: by default the
    # widths up to CHUNKED_WARMUP tokens.
    longest = min(CHUNKED_WARMUP if max_width is None else max_width,
                  self.prompt_limit(self.default))
    shapes = 0
    for b in self.batch_sizes:
      for w in range(bucket, longest + bucket, bucket):
        if say:
          say(f"batch {b}, width {w}")
        self.decode(self.default, [[self.tokenizer.pad_id] * w] * b, None, 0)
        shapes += 1
    return shapes
