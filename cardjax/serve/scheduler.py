"""Continuous batching on one decode thread.

Every unfinished request sits in one list, in groups of requests that can share a decode
call. Each round the thread serves the group it served longest ago (the oldest request's
group among those never served), so groups take turns: none waits behind another's whole
life. For AR and MARS (engine.continuous) a group is one SlotPool, keyed by what a step
compiles (method, block, rule, ignore_eos): every request keeps its own tau, temperature,
top_p and seed in its row, so greedy and sampled, seeded or not, decode in the same step.
The pool admits its waiting requests into free rows (one prefill forward per prompt width)
and runs one step of up to `chunk` forwards for all its rows; a row keeps its KV cache from
step to step, so it is prefilled once, and a request that ends (stop token, stop string,
max_tokens, context, or a client that went away) frees its row in that step.

Overlap (the default): the device never waits for the host's bookkeeping. A round admits,
then launches step k+1 (SlotPool.launch returns at once; the device runs it after step k),
and only then reads step k's packed results, delivers them and frees the rows that ended;
so delivery, stop strings and the next round's admission run while the device computes.
The host plans step k+1 without step k's results: the pool's host mirror of each row's
index and budget bounds what both steps can write. A row that ended in step k is known
free only after step k+1 was launched, so it would rejoin at step k+2; hence a round
whose step in flight may end a row by its token budget (its forwards can commit that many
tokens: AR one a forward, MARS up to B) reads that step first and launches the next one
round later, with the freed rows refilled. Overlap thus runs in the middle of requests,
and a request that ends at a stop token costs its row a step. A client that leaves while
its row's step is in flight gets its row freed at once and that step's tokens for it are
dropped. Without overlap (--no-overlap) a round launches and reads its own step; a
request gets the same tokens either way.

After a round that freed rows while others decode on, the thread waits a little
(`admit_wait` of a step's time) for new requests to fill them, since closed-loop clients
come straight back, unless another group has work waiting. With a step in flight that wait
costs the device nothing.

Refill steps (off by default): a step is the unit of admission, so a request that arrives
just after a launch waits the whole step for a row. With `refill_step` > 0, while rows
freed by recent reads stand empty (their clients' next requests not yet admitted), the
next steps run `refill_step` forwards instead of `chunk` (at most REFILL_TRIES of them in a
row, in case those clients do not return), so the returning requests join after a
fraction of the wait; once the rows are refilled, or the pool is full, steps run `chunk`
again. One compiled program serves both lengths (SlotPool.launch's `within`). On a CPU
they fill more rows but cost their per-step work (docs/serving.md has the measurement).

Other methods decode in chunks: between decode chunks (engine.py: at most `chunk` new
tokens per row per call) the thread takes the oldest requests of the group, up to the
largest compiled batch size, and decodes one chunk for them. Requests with other settings
wait for a later chunk (they never share a call: a decode call has one tau, temperature,
top_p and seed); a request sampling with its own seed decodes alone, so its tokens do not
depend on its batch. A row is freed after
the chunk in which its request hit a stop token or stop string, reached max_tokens or the
context, or its client went away (the chunk it is in still finishes); the next chunk's
batch refills it from the pool. Nothing is cached between chunks, so any request can join
any chunk.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import threading
import time
import traceback
from typing import Callable

from cardjax.errors import CardjaxError
from cardjax.serve.engine import Engine, Settings
from cardjax.serve.metrics import Metrics
from cardjax.serve.tau import TauControl
from cardjax.serve.text import TextStream

_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Job:
  """One prompt being served. `sink(event)` is called on the decode thread with
  {"type": "delta", "text"}, then one {"type": "done", ...} or {"type": "error", ...}."""
  prompt: list[int]
  settings: Settings
  max_tokens: int
  text: TextStream
  sink: Callable[[dict], None]
  arrived: float = dataclasses.field(default_factory=time.monotonic)
  id: int = dataclasses.field(default_factory=lambda: next(_ids))
  tokens: list = dataclasses.field(default_factory=list)
  forwards: int = 0
  taus: list = dataclasses.field(default_factory=list)
  first_token: float | None = None
  cancelled: bool = False  # set by the client's handler on disconnect
  admitted: bool = False  # holds a SlotPool row
  row_tau: float | None = None  # the tau its row decodes with (continuous MARS)

  def group(self, continuous: bool = False) -> tuple:
    s = self.settings
    if continuous:  # one pool step serves every tau and sampling setting
      return ("slots",) + s.pool_key()
    return s.group() + ((s.seed, self.id) if s.seed is not None else ())

  def sampling(self, fresh: int):
    """Its row's sampling settings; `fresh`: the seed of a sampled request without one."""
    from cardjax.serve.pool.slots import Sampling

    s = self.settings
    if s.temperature == 0:
      return Sampling()
    return Sampling(s.temperature, s.top_p, (fresh if s.seed is None else s.seed) % 2**32)


# The admission wait, a fraction of a step's time (module docstring).
ADMIT_WAIT = 0.1
# Refill steps in a row while vacated rows wait for their clients (module docstring).
REFILL_TRIES = 2


def check_refill_step(value: int, chunk: int) -> int:
  """The refill step's forwards; 0 (the default) turns refill steps off."""
  if not 0 <= value <= chunk:
    raise CardjaxError(f"--refill-step={value} must lie in [0, --chunk={chunk}] (forwards of "
                       "a step run while freed rows wait for new requests; 0: every step "
                       "runs --chunk)")
  return value


def check_admit_wait(value: float) -> float:
  if not value >= 0:
    raise CardjaxError(f"--admit-wait={value} must be >= 0 (a fraction of a step's time; 0: "
                       "never wait)")
  return value


class Scheduler:
  def __init__(self, engine: Engine, metrics: Metrics, tau: TauControl,
               admit_wait: float = ADMIT_WAIT, overlap: bool = True,
               refill_step: int = 0):
    self.engine, self.metrics, self.tau = engine, metrics, tau
    self.admit_wait = check_admit_wait(admit_wait)
    self.overlap = overlap
    self.refill_step = check_refill_step(refill_step, engine.chunk)
    self._vacant: dict[tuple, int] = {}  # pool key -> freed rows not yet refilled
    self._tries: dict[tuple, int] = {}  # pool key -> refill steps left for them
    self.flights: dict[tuple, object] = {}  # pool key -> its launched, unread step
    self._last_read: dict[tuple, float | None] = {}  # pool key -> when its last step was read
    self.max_batch = max(engine.batch_sizes)
    self.pool: list[Job] = []
    self.cond = threading.Condition()
    self.stopping = False
    self.running = 0
    self._seeds = itertools.count(1)
    # Unseeded sampled rows: seeds that differ between requests and between server runs.
    self._fresh = random.Random(int.from_bytes(os.urandom(8), "little"))
    self._served: dict[tuple, int] = {}  # group -> the round it was last served
    self._round = 0
    # Called once a round's events are out (serve/handoff.py): before the admission wait,
    # so the clients that just got their answers can send the next request during it.
    self.handoffs: list = []
    self.thread = threading.Thread(target=self._loop, name="cardjax-decode", daemon=True)
    metrics.tau.set(tau.tau)

  def start(self) -> None:
    self.thread.start()

  def submit(self, job: Job) -> None:
    with self.cond:
      self.pool.append(job)
      self._publish()
      self.cond.notify()

  def waiting(self) -> int:
    """Requests that hold no row yet (a chunked request counts until it finishes)."""
    with self.cond:
      return sum(not j.admitted for j in self.pool)

  def _publish(self) -> None:
    """The running and queue gauges from the pool (self.cond held): running counts the
    round's batch and every request holding a pool row (between rounds too); the queue,
    the rest of the live requests. One rule for every caller, so that a request cancelled
    wherever the decode thread meets it leaves both gauges."""
    live = [j for j in self.pool if not j.cancelled]
    running = min(len(live), max(self.running, sum(j.admitted for j in live)))
    self.metrics.running.set(running)
    self.metrics.queue.set(len(live) - running)

  def cancel(self, job: Job) -> None:
    """The client went away: the job leaves the pool before the next chunk."""
    with self.cond:
      job.cancelled = True
      self.cond.notify()

  def stop(self) -> None:
    """Finish every request in the pool, then end the thread (the SIGTERM drain)."""
    with self.cond:
      self.stopping = True
      self.cond.notify()
    self.thread.join()

  def _group(self, job: Job) -> tuple:
    return job.group(self.engine.continuous(job.settings))

  def _take(self) -> tuple[list[Job], int, bool] | None:
    """The next group to serve (module docstring): (its requests, oldest first; up to the
    largest batch when chunked, all of them when continuous), requests waiting outside
    it, continuous."""
    with self.cond:
      while True:
        for job in [j for j in self.pool if j.cancelled]:
          self.pool.remove(job)
          if job.admitted:  # the decode thread owns the pools: this is that thread
            self.engine.release(job.settings, job.id)
          self.metrics.requests.labels("cancelled").inc()
          self._publish()
        if self.pool or self.stopping:
          break
        self.cond.wait()
      if not self.pool:
        return None
      groups: dict[tuple, list[Job]] = {}
      for job in sorted(self.pool, key=lambda j: j.arrived):
        groups.setdefault(self._group(job), []).append(job)
      # Turns: the group served longest ago; among the never served, the oldest request's.
      self._served = {k: v for k, v in self._served.items() if k in groups}
      for key in [k for k in self.flights if ("slots",) + k not in groups]:
        # Every request of that pool left while its step ran: nothing to read any more.
        self.flights.pop(key)
        self._last_read.pop(key, None)
      key = min(groups, key=lambda k: (self._served.get(k, -1), groups[k][0].arrived))
      self._served[key], self._round = self._round, self._round + 1
      batch = groups[key]
      continuous = self.engine.continuous(batch[0].settings)
      running = min(len(batch), self.max_batch)
      if not continuous:
        batch = batch[:self.max_batch]
      waiting = len(self.pool) - running
      self.running = running
      self._publish()
      return batch, waiting, continuous

  def _hand_off(self) -> None:
    for flush in self.handoffs:
      flush()

  def _loop(self) -> None:
    while True:
      taken = self._take()
      if taken is None:
        return
      batch, waiting, continuous = taken
      try:
        if continuous:
          self._step(batch, waiting)
        else:
          self._chunk(batch, waiting)
      except Exception as e:  # a bug or a device failure: fail this batch, keep serving
        traceback.print_exc()
        if continuous:  # its rows' state may be gone (donated buffers): a fresh pool
          self.engine.drop_pool(batch[0].settings)
          self.flights.pop(batch[0].settings.pool_key(), None)
          batch = [j for j in batch if j.admitted]
        for job in batch:
          self._finish(job, {"type": "error", "message": f"decoding failed: {e}"}, "error")
      finally:
        # Whatever the round sent, an error included; after a read's own hand-off (made
        # before it waits for arrivals) it finds nothing and costs a lock.
        self._hand_off()

  def _step(self, jobs: list[Job], waiting: int) -> None:
    """One round of a SlotPool: admit the group's waiting requests into free rows, launch
    a step for every live row, then read and deliver the step launched the round before
    (with overlap; without it, this round's own step). When a row ends in the step in
    flight, the round only reads that step (the next round admits and launches)."""
    s = jobs[0].settings
    key = s.pool_key()
    pool = self.engine.pool(s)
    started = time.monotonic()
    previous = self.flights.pop(key, None)
    if previous is not None and pool.may_end_in_flight():
      # A row may end in the step in flight: read it before launching the next, so that
      # the requests waiting for rows (its client's next among them) join that next step.
      return self._read(jobs, pool, previous, None, started)
    admits = [j for j in jobs if not j.admitted][:pool.capacity() - pool.live_rows()]
    taus = []
    for job in admits:
      tau = 1.0
      if s.method == "mars":
        tau = job.settings.tau if job.settings.tau is not None else self.tau.update(waiting)
        self.metrics.tau.set(self.tau.tau)
      taus.append(tau)
    # One prefill forward for all of them (per prompt width): see SlotPool.admit_many.
    clock = time.monotonic()
    cached = pool.admit_many((job.id, job.prompt + job.tokens, tau,
                              job.max_tokens - len(job.tokens),
                              job.sampling(self._fresh.getrandbits(32)))
                             for job, tau in zip(admits, taus))
    self.metrics.prefills.inc(len(admits))
    self.metrics.prefix_tokens.inc(cached)
    for job, tau in zip(admits, taus):
      job.admitted, job.row_tau = True, tau if s.method == "mars" else None
    started = time.monotonic()
    self.metrics.thread_seconds.labels("prefill").inc(started - clock)
    # Only while a row may still decode: one whose budget the step in flight covers has
    # ended, though the host reads that only at its collect.
    flight = (pool.launch(self._forwards(key, pool, len(admits)), within=self.engine.chunk)
              if pool.busy() else None)
    if not self.overlap:
      previous, flight = flight, None
    if flight is not None:
      self.flights[key] = flight
    if previous is not None:  # else the first step after an idle spell: read next round
      self._read(jobs, pool, previous, flight, started)

  def _forwards(self, key: tuple, pool, admitted: int) -> int:
    """The next step's forwards: a refill step while rows freed by recent reads stand
    empty (module docstring), else a whole chunk."""
    vacant = max(0, self._vacant.get(key, 0) - admitted)
    short = (self.refill_step and vacant and self._tries.get(key, 0) > 0
             and pool.live_rows() < pool.capacity())
    if short:
      self._tries[key] -= 1
    self._vacant[key] = vacant if short else 0
    self.metrics.steps.labels("refill" if short else "chunk").inc()
    return self.refill_step if short else self.engine.chunk

  def _read(self, jobs: list[Job], pool, previous, flight, started: float) -> None:
    """Read a launched step (`previous`), deliver its tokens, free the rows that ended and
    wait a little for new requests (`flight`: the step launched since, or None)."""
    s = jobs[0].settings
    key = s.pool_key()
    new, ended, forwards = pool.collect(previous)
    now = time.monotonic()
    self.metrics.thread_seconds.labels("step").inc(now - started)
    # The device's time per step: between two reads while steps queue back to back.
    last = self._last_read.get(key)
    step_s = now - last if last is not None else now - started
    self._last_read[key] = now if flight is not None else None
    stop_ids = set() if s.ignore_eos else set(self.engine.tokenizer.stop_ids)
    # Before any delivery: a client that reads /metrics after its answer sees this step.
    if new:  # a step whose rows had all ended before it (a stop token) ran no forward
      self.metrics.batch_rows.observe(len(new))
    made = freed = 0
    for job in jobs:
      if job.id not in new:
        continue
      if job.cancelled:  # its client left during the step: free the row now
        with self.cond:
          self.pool.remove(job)
        self.engine.release(s, job.id)
        freed += 1
        self.metrics.requests.labels("cancelled").inc()
        continue
      made += len(new[job.id])
      forced = {"stop": "stop", "budget": "length", "slots": "length"}.get(ended.get(job.id))
      if self._deliver(job, new[job.id], forwards[job.id], job.row_tau, now, stop_ids,
                       forced):
        self.engine.release(s, job.id)
        freed += 1
    self.metrics.generated(made, sum(forwards.values()))
    if freed:
      self._vacant[key] = self._vacant.get(key, 0) + freed
      self._tries[key] = REFILL_TRIES
    with self.cond:
      self.running = 0
      self._publish()
    self._hand_off()
    clock = time.monotonic()
    self.metrics.thread_seconds.labels("deliver").inc(clock - now)
    # With a step in flight the wait costs the device nothing while it is shorter than
    # that step: the answered clients' next requests then join the step after it.
    if freed and (flight is not None or pool.live_rows()):
      self._await_arrivals(jobs[0], freed, self.admit_wait * step_s - (clock - now))
      self.metrics.thread_seconds.labels("admit_wait").inc(time.monotonic() - clock)

  def _await_arrivals(self, like: Job, want: int, seconds: float) -> None:
    """Wait up to `seconds` for `want` new requests of `like`'s group to queue. A client
    that got its answer usually sends its next request within milliseconds, but the next
    step (`chunk` forwards for the rows still decoding) would start before it arrives and
    leave its row empty for a whole step; waiting a small fraction of a step fills it."""
    key = self._group(like)
    deadline = time.monotonic() + seconds
    with self.cond:
      while not self.stopping:
        if any(self._group(j) != key for j in self.pool):
          return  # another group's turn comes next: nothing to wait for
        queued = sum(not j.admitted and not j.cancelled for j in self.pool)
        left = deadline - time.monotonic()
        if queued >= want or left <= 0:
          return
        self.cond.wait(left)

  def _chunk(self, batch: list[Job], waiting: int) -> None:
    s = batch[0].settings
    tau = None
    if s.method == "mars" and not s.verify:
      tau = s.tau if s.tau is not None else self.tau.update(waiting)
      self.metrics.tau.set(self.tau.tau)
    if s.seed is not None:  # reproducible: the seed and the chunk's index
      seed = (s.seed * 1_000_003 + len(batch[0].taus)) % 2**31
    else:
      seed = next(self._seeds)
    started = time.monotonic()
    out = self.engine.decode(s, [j.prompt + j.tokens for j in batch], tau, seed)
    self.metrics.prefills.inc(len(batch))
    now = time.monotonic()
    self.metrics.thread_seconds.labels("chunk").inc(now - started)
    stop_ids = set() if s.ignore_eos else set(self.engine.tokenizer.stop_ids)
    self.metrics.batch_rows.observe(len(batch))  # before delivery, as in _step
    made = 0
    for job, row in zip(batch, out.rows()):
      if job.cancelled:  # its client left during the chunk: free the row now
        with self.cond:
          self.pool.remove(job)
        self.metrics.requests.labels("cancelled").inc()
        continue
      row = row[:job.max_tokens - len(job.tokens)]
      made += len(row)
      self._deliver(job, row, out.forwards, tau, now, stop_ids)
    self.metrics.generated(made, out.forwards * len(batch))
    with self.cond:
      self.running = 0
      self._publish()
    self.metrics.thread_seconds.labels("deliver").inc(time.monotonic() - now)

  def _deliver(self, job: Job, row: list[int], forwards: int, tau, now: float, stop_ids,
               forced: str | None = None) -> bool:
    """Append a call's tokens to a job, stream their text, finish it where it ends (a stop
    token or string, max_tokens, the context, or `forced`, the SlotPool's reason).
    Returns whether it finished."""
    job.tokens += row
    job.forwards += forwards
    job.taus.append(tau)
    if row and job.first_token is None:
      job.first_token = now
      self.metrics.ttft.observe(now - job.arrived)
    reason = None
    if row and row[-1] in stop_ids:
      reason = "stop"
    elif (len(job.tokens) >= job.max_tokens or
          len(job.prompt) + len(job.tokens) > self.engine.prompt_limit(job.settings)):
      reason = "length"
    reason = reason or forced
    delta, hit = job.text.update(job.tokens, final=reason is not None)
    reason = "stop" if hit else reason
    if delta:
      job.sink({"type": "delta", "text": delta})
    if reason:
      self._finish(job, self._done(job, reason), "ok")
    return reason is not None

  def _done(self, job: Job, reason: str) -> dict:
    s = job.settings
    taus = [t for t in job.taus if t is not None]
    extension = {"method": s.method, "forwards": job.forwards,
                 "tokens_per_forward": round(len(job.tokens) / max(job.forwards, 1), 4),
                 "chunks": len(job.taus)}
    if s.method == "mars":
      extension.update(block=s.block, verify=s.verify)
      if taus:
        extension.update(tau=taus[-1], tau_mean=round(sum(taus) / len(taus), 6),
                         rule=s.rule)
    return {"type": "done", "finish_reason": reason, "text": job.text.text,
            "prompt_tokens": len(job.prompt), "completion_tokens": len(job.tokens),
            "cardjax": extension}

  def _finish(self, job: Job, event: dict, status: str) -> None:
    with self.cond:
      if job in self.pool:
        self.pool.remove(job)
        self.running = max(0, self.running - 1)
        self._publish()
    latency = time.monotonic() - job.arrived
    if status == "ok":
      self.metrics.latency.observe(latency)
      self.tau.finished(latency)
    self.metrics.requests.labels(status).inc()
    job.sink(event)
