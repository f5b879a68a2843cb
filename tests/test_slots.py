"""SlotPool: rows that keep their KV cache across calls give the one-shot decoders' greedy
tokens whenever they are admitted, whatever rows they share calls with, through tier
changes, span changes (the cache grown and cut to the slots a step can reach) and row
reuse."""

import pytest

from cardjax.decoding import ar, mars
from cardjax.errors import CardjaxError
from cardjax.serve.pool.slots import Sampling, SlotPool
from compile_count import compiles
from decoding_helpers import MASK, PROMPTS, tiny_model

N = 9  # tokens per request


def drive(pool, schedule, taus=None, forwards=3, sampling=None, prompts=None):
  """Admit the prompts at the steps `schedule` gives (prompt i at call schedule[i]; those
  due together in one admit_many), step, release finished rows; a prompt waits while every
  row is busy. Returns each prompt's
  tokens and the (tier, span) pairs seen."""
  taus = taus or [1.0] * len(schedule)
  sampling = sampling or [Sampling()] * len(schedule)
  prompts = prompts or [PROMPTS[i % len(PROMPTS)] + [i] for i in range(len(schedule))]
  got, tiers, call, admitted = {}, set(), 0, set()
  while sum(isinstance(k, int) for k in got) < len(schedule):
    due = [i for i, at in enumerate(schedule) if at <= call and i not in admitted]
    due = due[:pool.capacity() - pool.live_rows()]
    pool.admit_many((i, prompts[i], taus[i], N, sampling[i]) for i in due)
    admitted.update(due)
    new, ended, _ = pool.step(forwards)
    tiers.add((pool.tier, pool.span))
    for i, toks in new.items():
      got.setdefault(("t", i), []).extend(toks)
    for i in ended:
      got[i] = got.pop(("t", i))
      pool.release(i)
    call += 1
  return {i: got[i] for i in range(len(schedule))}, tiers


@pytest.mark.parametrize("span_min", [0, 4])
def test_ar_rows_equal_ar_generate_through_admits_releases_and_tiers(span_min):
  model = tiny_model()
  pool = SlotPool(model, "ar", slots=48, batch_sizes=(1, 2, 4), span_min=span_min)
  schedule = [0, 0, 1, 1, 2, 5, 5]  # up to 4 at once, rows reused, tiers up and down
  got, seen = drive(pool, schedule)
  for i in range(len(schedule)):
    want = ar.generate(model, [PROMPTS[i % len(PROMPTS)] + [i]], N).rows()[0]
    assert got[i] == want, i
  assert {1, 2, 4} <= {tier for tier, _ in seen}
  # spans 6, 12, 24, 48: the 16-token prompt buckets and 9 new tokens reach 24 slots only
  assert {span for _, span in seen} == ({24} if span_min else {48})
  assert pool.live_rows() == 0
  pool.step(3)  # the tier the freed rows held is given up at the next launch, not at release
  assert pool.tier == 1


@pytest.mark.parametrize("span_min,window", [(0, "fit"), (8, "fit"), (8, "full")])
def test_mars_rows_equal_mars_generate_with_per_row_tau(span_min, window):
  # "fit" reads the narrowest window holding the pending runs (B = 3: widths 1, 2, 3) and
  # forgets its scratch between passes; "full" always 2B. Both give mars.generate's tokens.
  model = tiny_model()
  pool = SlotPool(model, "mars", slots=64, batch_sizes=(1, 4), block=3, span_min=span_min,
                  window=window)
  taus = [0.5, 1.0, 0.3, 0.8, 0.5]
  got, seen = drive(pool, [0, 0, 0, 2, 3], taus, forwards=2)
  # spans 8, 16, 32, 64: the pool starts at 8 and grows for the prefill and the windows
  assert {span for _, span in seen} == ({32} if span_min else {64})
  for i, tau in enumerate(taus):
    want = mars.generate(model, [PROMPTS[i % len(PROMPTS)] + [i]], N, block=3, tau=tau,
                         mask_id=MASK).rows()[0]
    assert got[i] == want, (i, tau)
  # tau 1 is AR greedy
  assert got[1] == ar.generate(model, [PROMPTS[1] + [1]], N).rows()[0]


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_greedy_and_sampled_rows_share_steps_each_with_its_own_settings(method):
  """Greedy rows beside sampled ones (seeded, various top_p) keep the one-shot greedy
  tokens, and each sampled row gives the same tokens as when it decodes alone: its draws
  are keyed by its seed and position, not by the step or its neighbours."""
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  taus = [0.5, 0.7, 1.0, 0.5, 0.6] if method == "mars" else None
  hot = [Sampling(), Sampling(1.0, 0.9, 7), Sampling(), Sampling(0.8, 1.0, 2**32 - 1),
         Sampling(1.0, 0.5, 7)]
  mixed, _ = drive(SlotPool(model, method, slots=64, batch_sizes=(1, 4), **kw),
                   [0, 0, 0, 1, 2], taus, forwards=2, sampling=hot)
  for i, s in enumerate(hot):
    prompt = [PROMPTS[i % len(PROMPTS)] + [i]]
    alone, _ = drive(SlotPool(model, method, slots=64, batch_sizes=(1,), **kw), [0],
                     [taus[i]] if taus else None, forwards=3, sampling=[s], prompts=prompt)
    assert mixed[i] == alone[0], i
    if s.temperature == 0:
      want = (mars.generate(model, prompt, N, block=3, tau=taus[i], mask_id=MASK)
              if method == "mars" else ar.generate(model, prompt, N))
      assert mixed[i] == want.rows()[0], i
  # Sampling happened: the seeded rows differ from their greedy paths.
  greedy, _ = drive(SlotPool(model, method, slots=64, batch_sizes=(4,), **kw),
                    [0, 0, 0, 1, 2], taus, forwards=2)
  assert mixed[1] != greedy[1] or mixed[3] != greedy[3]


def test_sampling_settings_are_checked():
  pool = SlotPool(tiny_model(), "ar", slots=24, batch_sizes=(1,))
  with pytest.raises(CardjaxError, match="top_p in"):
    pool.admit("x", [1, 2], sampling=Sampling(1.0, 0.0, 1))
  with pytest.raises(CardjaxError, match="seed in"):
    pool.admit("x", [1, 2], sampling=Sampling(1.0, 1.0, -1))


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_span_grows_with_a_long_row_and_shrinks_after_it(method):
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  pool = SlotPool(model, method, slots=96, batch_sizes=(2,), span_min=8, **kw)
  want = {n: (ar.generate(model, [PROMPTS[0]], n).rows()[0] if method == "ar" else
              mars.generate(model, [PROMPTS[0]], n, block=3, tau=0.5, mask_id=MASK).rows()[0])
          for n in (3, 60)}
  pool.admit("long", PROMPTS[0], 0.5, 60)
  got, spans = {"long": []}, []
  for i in range(40):
    if i % 3 == 0:  # short requests come and go beside the long one, and after it
      pool.admit(("short", i), PROMPTS[0], 0.5, 3)
      got[("short", i)] = []
    new, ended, _ = pool.step(2)
    spans.append(pool.span)
    for key, toks in new.items():
      got[key].extend(toks)
    for key in ended:
      assert got[key] == want[60 if key == "long" else 3], key
      pool.release(key)
  assert "long" not in pool.owner  # it ended (and matched) within the 40 steps
  assert max(spans) > spans[0] and spans[-1] < max(spans), spans  # grew, then shrank
  assert max(spans) <= 96 and all(s in (12, 24, 48, 96) for s in spans), spans


def test_batched_admits_split_by_width_and_prefill_rows():
  """Prompts admitted together prefill in batches of prefill_rows per width bucket (a
  16-token and a 32-token bucket here, padding rows in the odd batch) and decode the
  tokens each gets alone."""
  model = tiny_model()
  pool = SlotPool(model, "ar", slots=64, batch_sizes=(1, 2, 8), prefill_rows=2)
  assert pool.prefill_sizes == (1, 2)
  prompts = [PROMPTS[0], PROMPTS[3] * 3, PROMPTS[2], PROMPTS[1] + [5], PROMPTS[0] * 4]
  assert sorted({pool.programs.width(len(p)) for p in prompts}) == [16, 32]
  pool.admit_many((i, p, 1.0, N) for i, p in enumerate(prompts))
  assert pool.tier == 8 and pool.live_rows() == 5
  assert set(pool.programs.used) == {(2, 0, 16), (1, 0, 16), (2, 0, 32)}  # 3 short: 2 + 1; 2 long
  new, ended, _ = pool.step(N)
  for i, p in enumerate(prompts):
    assert new[i] == ar.generate(model, [p], N).rows()[0], i
  with pytest.raises(CardjaxError, match="already owns"):
    pool.admit_many([("a", [1, 2], 1.0, 1), ("a", [3], 1.0, 1)])
  with pytest.raises(CardjaxError, match="rows are busy"):
    pool.admit_many((("b", k), [1, 2], 1.0, 1) for k in range(4))
  # prefill_rows=1: one forward per prompt (the A/B baseline of `serve --prefill-rows 1`)
  pool = SlotPool(model, "ar", slots=64, batch_sizes=(1, 2, 8), prefill_rows=1)
  pool.admit_many((i, p, 1.0, N) for i, p in enumerate(prompts[:3]))
  assert pool.prefill_sizes == (1,) and set(pool.programs.used) == {(1, 0, 16), (1, 0, 32)}
  assert pool.step(N)[0][1] == ar.generate(model, [prompts[1]], N).rows()[0]
  with pytest.raises(CardjaxError, match="prefill_rows=0 must be >= 1"):
    SlotPool(model, "ar", slots=64, prefill_rows=0)


def test_stop_token_budget_and_full_slots_end_a_row():
  model = tiny_model()
  first = ar.generate(model, [PROMPTS[0]], 4).rows()[0]
  pool = SlotPool(model, "ar", slots=32, batch_sizes=(2,), stop_ids=(first[2],))
  pool.admit("a", PROMPTS[0], max_new_tokens=50)
  pool.admit("b", PROMPTS[2], max_new_tokens=2)
  new, ended, _ = pool.step(8)
  assert new["a"] == first[:3] and ended["a"] == "stop"
  assert len(new["b"]) == 2 and ended["b"] == "budget"
  pool.release("a")
  pool.release("b")
  # 16 slots hold the prompt (bucket 16, less its last token) and 16 - 15 = 1 more window
  pool = SlotPool(model, "ar", slots=18, batch_sizes=(1,))
  pool.admit("c", PROMPTS[0], max_new_tokens=50)
  new, ended, _ = pool.step(20)
  assert ended["c"] == "slots" and 1 <= len(new["c"]) < 20


def test_bad_admits():
  pool = SlotPool(tiny_model(), "ar", slots=24, batch_sizes=(1,))
  with pytest.raises(CardjaxError, match="empty prompt"):
    pool.admit("x", [])
  with pytest.raises(CardjaxError, match="leaves no room"):
    pool.admit("x", list(range(1, 40)))
  pool.admit("x", [1, 2])
  with pytest.raises(CardjaxError, match="already owns"):
    pool.admit("x", [1, 2])
  with pytest.raises(CardjaxError, match="rows are busy"):
    pool.admit("y", [1, 2])
  with pytest.raises(CardjaxError, match="decodes"):
    SlotPool(tiny_model(), "card", slots=24)


@pytest.mark.parametrize("overlap", [False, True])
def test_after_compile_steps_and_prefills_serving_compiles_nothing(overlap):
  """What a server's warm-up compiles is every program requests can reach: rows admitted,
  stepped, released and refilled through every tier and several spans afterwards compile
  nothing, with steps read at once or launched before the previous one is read."""
  pool = SlotPool(tiny_model(), "ar", slots=48, batch_sizes=(1, 2, 4), span_min=8)
  assert pool.spans == [12, 24, 48]
  # per (tier, span): step, release, put, gathers to 2 other tiers and 2 other spans
  assert pool.compile_steps(3) == 9 * 7
  assert pool.compile_prefills(32) == 6 == len(pool.programs.used)  # widths 16, 32; 3 sizes
  schedule = [0, 4, 4, 8, 9, 9, 9, 9, 14]
  with compiles() as counted:
    if overlap:
      drive_overlapped(pool, schedule, [1.0] * len(schedule))
    else:
      drive(pool, schedule)
  assert counted["n"] == 0
  with pytest.raises(CardjaxError, match="span_min"):
    SlotPool(tiny_model(), "ar", slots=48, span_min=-1)


def drive_overlapped(pool, schedule, taus, forwards=3):
  """drive() as the server overlaps it: each call launches the next step before reading
  the one launched the call before, then releases what that step ended."""
  prompts = [PROMPTS[i % len(PROMPTS)] + [i] for i in range(len(schedule))]
  got, done, call, admitted, flight = {}, {}, 0, set(), None
  while len(done) < len(schedule):
    due = [i for i, at in enumerate(schedule) if at <= call and i not in admitted]
    due = due[:pool.capacity() - pool.live_rows()]
    pool.admit_many((i, prompts[i], taus[i], N) for i in due)
    admitted.update(due)
    launched = pool.launch(forwards) if pool.busy() else None
    if flight is not None:
      new, ended, _ = pool.collect(flight)
      for i, toks in new.items():
        got.setdefault(i, []).extend(toks)
      for i in ended:
        done[i] = got.pop(i)
        pool.release(i)
    flight, call = launched, call + 1
  return done


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_launching_before_reading_gives_the_same_tokens(method):
  """The server's overlap: a step launched before the previous one is read, rows released
  and admitted between, tiers and spans planned from the host's bounds alone."""
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  pool = SlotPool(model, method, slots=64, batch_sizes=(1, 2, 4), span_min=8, **kw)
  schedule, taus = [0, 0, 1, 1, 2, 5, 5, 9], [0.5, 1.0, 0.3, 0.8, 0.5, 0.7, 1.0, 0.4]
  got = drive_overlapped(pool, schedule, taus)
  for i in range(len(schedule)):
    prompt = [PROMPTS[i % len(PROMPTS)] + [i]]
    want = (ar.generate(model, prompt, N) if method == "ar" else
            mars.generate(model, prompt, N, block=3, tau=taus[i], mask_id=MASK)).rows()[0]
    assert got[i] == want, i


def test_a_row_released_while_its_step_runs_is_left_out_and_refilled():
  """A client that leaves while its row's step is in flight: the row is freed at once, a
  new request takes it before that step is read, and the step's tokens for the old key
  are dropped while the new row decodes its own."""
  model = tiny_model()
  pool = SlotPool(model, "ar", slots=48, batch_sizes=(1,))
  pool.admit("gone", PROMPTS[0], max_new_tokens=N)
  flight = pool.launch(3)
  pool.release("gone")
  pool.admit("new", PROMPTS[1], max_new_tokens=N)
  second = pool.launch(N)
  assert pool.collect(flight) == ({}, {}, {})
  new, ended, _ = pool.collect(second)
  assert new["new"] == ar.generate(model, [PROMPTS[1]], N).rows()[0]
  assert ended == {"new": "budget"}


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_several_forwards_per_loop_test_give_the_same_tokens(method):
  """unroll=3: the step's loop tests whether a row is live every third forward (a host
  round trip each on a GPU); rows that stop in between (budgets 4, 5, 7, 9) commit
  nothing more, and a step of 4 forwards runs 6."""
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  got = {}
  for unroll in (1, 3):
    pool = SlotPool(model, method, slots=64, batch_sizes=(4,), unroll=unroll, **kw)
    assert pool.whole(4) == (4 if unroll == 1 else 6)
    pool.admit_many((i, PROMPTS[i], 0.6, n) for i, n in enumerate((4, 5, 7, 9)))
    tokens = {i: [] for i in range(4)}
    while pool.busy():
      for key, new in pool.step(4)[0].items():
        tokens[key] += new
    got[unroll] = tokens
  assert got[1] == got[3] and [len(t) for t in got[3].values()] == [4, 5, 7, 9]
  with pytest.raises(CardjaxError, match="unroll=0"):
    SlotPool(model, method, slots=64, unroll=0, **kw)
  if method == "mars":  # the default window: fit at unroll 1, full above (its docstring)
    assert pool.mars_window == "full"
    assert SlotPool(model, method, slots=64, **kw).mars_window == "fit"
    with pytest.raises(CardjaxError, match="window='wide'"):
      SlotPool(model, method, slots=64, window="wide", **kw)


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_a_step_stopped_short_at_run_time_decodes_as_a_short_program(method):
  """launch(n, within=m): the program compiled for m forwards, stopped after n. Steps of 2
  in the 6-forward program give the tokens of steps compiled for 2, and no program for 2
  is compiled."""
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  got = {}
  for within in (None, 6):  # span_min 0: one span, so no step compiles for a new one
    pool = SlotPool(model, method, slots=64, batch_sizes=(4,), span_min=0, **kw)
    pool.admit_many((i, PROMPTS[i], 0.6, n) for i, n in enumerate((4, 5, 7, 9)))
    tokens = {i: [] for i in range(4)}
    if within:  # the long program first: every later step reuses it
      for key, new in pool.collect(pool.launch(within))[0].items():
        tokens[key] += new
    with compiles() as seen:
      while pool.busy():
        for key, new in pool.collect(pool.launch(2, within=within))[0].items():
          tokens[key] += new
    got[within] = tokens, seen["n"]
  assert got[6][1] == 0  # the short steps ran the program compiled for 6
  full = {i: [] for i in range(4)}
  pool = SlotPool(model, method, slots=64, batch_sizes=(4,), span_min=0, **kw)
  pool.admit_many((i, PROMPTS[i], 0.6, n) for i, n in enumerate((4, 5, 7, 9)))
  while pool.busy():
    for key, new in pool.step(6)[0].items():
      full[key] += new
  assert got[None][0] == got[6][0] == full
