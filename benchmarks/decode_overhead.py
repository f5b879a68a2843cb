"""What each decoder's loop costs on top of its forwards: the decoder's time per forward
against a bare cached forward of the same width, and the fixed cost of one call.

  python -m benchmarks.decode_overhead [--json OUT] [--batches 1,4,16] [--lengths 32,96]
      [--settings ar,mars-fit,...] [--repeats 3] [--rounds 5] [--bare-forwards 30] [--quick]
      [--toy]

Settings (--settings): ar (KV cache); mars-fit and mars-full (the window decoder, window
"fit" and "full", B = 4, tau 0.6); mars-block (the block-level cache, cache_block 16);
mars-verify (self-verified MARS, window "fit"); card (CARD blocks, confidence planner,
tau 0.7, B = 8) and card-dus (DUS planner) on a "card" objective; mdlm (DUS, B = 8, on an
"mdlm" objective). Each is built with `methods.make_decoder` on the 128 x 4 layer model of
benchmarks/decode_forward.py (list layers, fp32) with initializer_range 1.0, frozen once:
peaked random logits, so the thresholds accept runs of tokens as a trained model does (at
the default 0.02 every confidence is about 1/vocab and every adaptive decoder is AR).
16 random prompts of 24 tokens (left-padded to W = 32); batch b decodes the first b.

Per forward: one decoder is timed at two generation lengths N1 < N2 (--lengths) with no
stop ids, so every row writes all its tokens and the schedule is the decoder's own; F1, F2
are the Generation's `forwards`. A timing is the best of --repeats calls after a compile
call, the two lengths timed in turn (a slow spell of a shared machine hits both).
decoder_ms_per_forward = (T2 - T1) / (F2 - F1).

Rounds: a ratio of two differences of timings moves by 0.1-0.3 from run to run on a shared
2-core machine, more than the gaps it is meant to show. So a row is --rounds rounds, each
timing the decoder (both lengths) and then its bare forwards afresh (their loops compile
once); the row's figures are the median round's (by overhead_ratio), with
overhead_ratio_range [min, max] and overhead_ratio_rounds beside them.

Width: the new tokens per row that one loop forward feeds to `forward_cached`.
  ar           1.
  mars-full    2B: B pending slots (padded) + B masks.
  mars-fit     n + B, n the narrowest compiled pending width (1, 2, 4, ..., B) that holds
               the batch's longest pending run, so it changes from forward to forward.
  mars-verify  1 + B when no live row has drafts, else 1 + 2B ("fit"). A forward without
               drafts makes B of them, so at least every other forward is the wide one.
  mars-block   cache_block: every fill and extension forward reads the whole cache block.
  card         2B on a block's first forward ([previous block | block]), B on the others;
               with no stops each of the ceil(N / B) blocks opens once (confidence and DUS).
  mdlm         no KV cache: every forward is a full bidirectional forward over the whole
               sequence [prompt | G masks], W + G tokens, G = N rounded up to a multiple of B.
mars-fit and mars-verify have no fixed schedule, so their widths are counted: a copy of
the model whose `forward_cached` reports each call's width through a jax.debug.callback
decodes the same prompts (untimed, its own compile; the prefill, the call at cache index
0, is left out) and must give the same tokens and forwards. The others' widths follow
from their schedule and `forwards`. A row's `width` is the mean over the loop forwards at
N2; `widths` gives the counts of each width at N1 and N2.

Bare: forward_cost.forward_loop, a jitted fori_loop of --bare-forwards cached forwards of
the same batch and width against a cache of the decoder's own slot count (its
KVCache.create: attention reads every slot, and the cache grows with N), the best of 5.
Its forwards move: each starts at a cache index and positions computed at run time, as a
decoder's do, so XLA cannot fold the rotary factors, the cache write offset and the
validity mask into constants (a loop whose forwards all sit at one constant position pays
none of that; its figures are kept as bare_still_ms_per_forward and overhead_ratio_still,
the yardstick of the figures published up to the morning of 2026-12-07).
mdlm's bare forward is the same loop of full bidirectional forwards of W + G tokens without
a cache. The bare forwards go through the same two-length difference as the decoder:
bare(N) = the sum of the bare times of the loop forwards at N, and bare_ms_per_forward =
(bare(N2) - bare(N1)) / (F2 - F1), so the cache's growth from N1 to N2 (and mdlm's longer
sequence) weighs the same on both sides. overhead_ratio = decoder_ms_per_forward /
bare_ms_per_forward: 1 is a loop that costs nothing but its forwards. Its sources: the
decoder's bookkeeping around each forward (acceptance, planners, scatters into the
output), per-row cache indices (a scatter where the bare loop writes a slice), the while
loops' conditions, and branches: CARD's lax.cond between its two window widths copies the
whole KV cache in both branches of XLA:CPU's optimized HLO (the copy mars.py's one while
loop per width avoids), a cost that grows with batch and slots.

Fixed cost: call_fixed_ms = T1 - overhead_ratio * bare(N1), what a call pays whatever its
forwards (padding the prompts, dispatch, the prefill, copying the result to the host).
Where a forward costs the same at both lengths this is T1 - F1 * decoder_ms_per_forward
(kept as call_fixed_ms_flat); but the forwards at N2 read a larger cache, so that slope
prices N1's forwards too high and the flat figure comes out negative at batch 16 and for
mdlm, whose forwards at N2 are twice as wide. Both are differences of timings: on a noisy
machine a small fixed cost can dip below 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import announce, arg_parser
from cardjax.eval.forward_cost import best_seconds

PROMPTS, PROMPT_LEN = 16, 24
MARS_B, CARD_B, CACHE_BLOCK = 4, 8, 16
MARS_TAU, CARD_TAU = 0.6, 0.7
LENGTHS, QUICK_LENGTHS = (32, 96), (8, 40)
BARE_FORWARDS, QUICK_BARE_FORWARDS = 30, 10
ROUNDS = 5  # the overhead's median and range over this many rounds
BARE_REPEATS = 5  # a bare timing is short and cheap: more tries than the decoders get
COLUMNS = [("method", "method", ""), ("setting", "setting", ""), ("batch", "batch", "d"),
           ("width", "width", ".1f"), ("tokens_per_forward", "tokens / forward / row", ".2f"),
           ("decoder_ms_per_forward", "decoder ms / forward", ".3f"),
           ("bare_ms_per_forward", "bare ms / forward", ".3f"),
           ("overhead_ratio", "overhead", ".2f"), ("overhead_ratio_range", "rounds' range", ""),
           ("overhead_ratio_still", "vs still bare", ".2f"),
           ("call_fixed_ms", "fixed ms / call", ".2f")]


class Setting(NamedTuple):
  key: str  # --settings name
  method: str  # the row's method
  setting: str  # the row's setting
  decoder: str  # make_decoder's method
  objective: str
  options: dict  # Options fields besides max_new_tokens


SETTINGS = (
    Setting("ar", "ar", "kv cache", "ar", "ar", {}),
    Setting("mars-fit", "mars", f"window fit tau={MARS_TAU} B={MARS_B}", "mars", "mars",
            dict(block=MARS_B, tau=MARS_TAU)),
    Setting("mars-full", "mars", f"window full tau={MARS_TAU} B={MARS_B}", "mars", "mars",
            dict(block=MARS_B, tau=MARS_TAU, window="full")),
    Setting("mars-block", "mars", f"cache_block={CACHE_BLOCK} tau={MARS_TAU} B={MARS_B}",
            "mars", "mars", dict(block=MARS_B, tau=MARS_TAU, cache_block=CACHE_BLOCK)),
    Setting("mars-verify", "mars", f"verify window fit B={MARS_B}", "mars", "mars",
            dict(block=MARS_B, verify=True)),
    Setting("card", "card", f"confidence tau={CARD_TAU} B={CARD_B}", "card", "card",
            dict(block=CARD_B, tau=CARD_TAU)),
    Setting("card-dus", "card", f"dus B={CARD_B}", "dus", "card", dict(block=CARD_B)),
    Setting("mdlm", "mdlm", f"dus B={CARD_B}", "dus", "mdlm", dict(block=CARD_B)),
)
COUNTED = ("mars-fit", "mars-verify")  # no fixed schedule: widths counted by a callback


def cache_slots(key: str, opt, width: int, n: int) -> int:
  """The slots of the decoder's KV cache at max_new_tokens n (as its KVCache.create)."""
  if key == "ar":
    return width + n
  if key == "mars-block":
    return width + opt.cache_block * -(-n // opt.cache_block)
  if key.startswith("mars"):
    return width + n + 2 * opt.block
  return width + (-(-n // opt.block) + 1) * opt.block  # card: the blocks + the padding block


def loop_forwards(key: str, forwards: int) -> int:
  """The Generation's forwards less the prefill: AR and the block cache count it (it yields
  their first token), the others do not."""
  return forwards - 1 if key in ("ar", "mars-block") else forwards


def schedule(key: str, opt, width: int, n: int, forwards: int) -> dict[int, int]:
  """Loop forwards by width (new tokens per row) of a decoder with a fixed schedule."""
  b, loops = opt.block, loop_forwards(key, forwards)
  if key == "ar":
    return {1: loops}
  if key == "mars-full":
    return {2 * b: loops}
  if key == "mars-block":
    return {opt.cache_block: loops}
  if key == "mdlm":
    return {width + -(-n // b) * b: loops}
  blocks = -(-n // b)  # card: one opening forward per block, the rest read the block alone
  return {2 * b: blocks, b: loops - blocks}


def counting_model(module):
  """(copy, seen): a copy of `module` whose `forward_cached` appends each loop call's width
  (its new tokens per row) to `seen` as it runs; a subclass, so the real model and its
  compiled loops are untouched. The prefill (written at cache index 0) is not counted."""
  import jax
  import numpy as np
  from flax import nnx

  seen: list[int] = []

  class Counting(type(module)):
    def forward_cached(self, tokens, cache, *args, **kwargs):
      width = tokens.shape[1]  # static: the callback reports a Python int per call

      def record(index):
        if np.any(index):
          seen.append(width)

      jax.debug.callback(record, cache.index)
      return super().forward_cached(tokens, cache, *args, **kwargs)

  copy = Counting(module.cfg, rngs=nnx.Rngs(0))
  nnx.update(copy, nnx.state(module))
  return copy, seen


def full_forward_loop(graphdef, state, batch: int, width: int, forwards: int):
  """A call that runs a jitted loop of `forwards` full bidirectional forwards of `width`
  tokens (no cache, MDLM's forward)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.attention import BIDIRECTIONAL

  @jax.jit
  def loop(state):
    model = nnx.merge(graphdef, state)
    pos = jnp.broadcast_to(jnp.arange(width), (batch, width))
    seg = jnp.ones((batch, width), jnp.int32)

    def body(i, acc):
      tok = jnp.full((batch, width), 7, jnp.int32) + i % 3
      logits = model(tok, positions=pos, segment_ids=seg, mask=BIDIRECTIONAL)
      # A block's slice at a moving offset, as the decoder reads: the whole head is kept.
      part = jax.lax.dynamic_slice_in_dim(logits, i % (width - 7), 8, axis=1)
      return acc + part[:, :, 0].sum()

    return jax.lax.fori_loop(0, forwards, body, jnp.float32(0))

  return lambda: loop(state)


class Bench:
  """One model, its prompts and a memo of bare forward timings shared by the settings."""

  def __init__(self, cfg, lengths: tuple[int, int], repeats: int, bare_forwards: int,
               rounds: int = 1):
    import numpy as np
    from flax import nnx

    from cardjax.decoding.frozen import freeze
    from cardjax.decoding.prompts import padded_width
    from cardjax.model import create_model

    self.module = create_model(cfg, seed=0)
    self.frozen = freeze(self.module)
    self.graphdef, self.state = nnx.split(self.module)
    rng = np.random.default_rng(0)
    self.prompts = [rng.integers(4, cfg.vocab_size, PROMPT_LEN).tolist()
                    for _ in range(PROMPTS)]
    self.width = padded_width(self.prompts)
    self.lengths, self.repeats, self.bare_forwards = lengths, repeats, bare_forwards
    self.rounds = rounds
    self._bare: dict = {}  # (kind, batch, width, slots) -> its compiled bare loop
    self._counting = None  # (frozen counting copy, its list of widths), built on first use

  def bare_ms(self, key: str, batch: int, width: int, slots: int, moving: bool) -> float:
    """ms per bare forward, timed afresh (a round's figure); its loop compiled once.
    moving: the cached forwards' positions and cache index change at run time (mdlm's full
    forwards have no cache index and always read the same positions)."""
    from cardjax.eval.forward_cost import forward_loop

    moving = moving and key != "mdlm"
    memo = ("full" if key == "mdlm" else "cached", batch, width, slots, moving)
    if memo not in self._bare:
      if key == "mdlm":
        self._bare[memo] = full_forward_loop(self.graphdef, self.state, batch, width,
                                             self.bare_forwards)
      else:
        self._bare[memo] = forward_loop(self.graphdef, self.state, batch, width, slots,
                                        self.width, self.bare_forwards, moving=moving)
    return best_seconds(self._bare[memo], BARE_REPEATS) / self.bare_forwards * 1e3

  def row(self, s: Setting, batch: int) -> dict:
    from cardjax.decoding.methods import Options, make_decoder

    prompts = self.prompts[:batch]
    opts = {n: Options(max_new_tokens=n, **s.options) for n in self.lengths}
    decoders = {n: make_decoder(s.decoder, self.frozen, s.objective, opts[n])
                for n in self.lengths}
    gens = {n: decoders[n](prompts) for n in self.lengths}  # the compile calls
    for n, gen in gens.items():
      assert (gen.lengths == n).all(), (s.key, n, gen.lengths)  # no stop: every token
    (n1, n2), f = self.lengths, {n: gens[n].forwards for n in self.lengths}
    widths = {n: self.widths(s, opts[n], gens[n], prompts) for n in self.lengths}
    extra = f[n2] - f[n1]
    assert extra > 0, (s.key, f)
    rounds = []
    for _ in range(self.rounds):  # each round times the decoder, then its bare forwards
      best = dict.fromkeys(self.lengths, float("inf"))
      for _ in range(self.repeats):
        for n in self.lengths:
          start = time.perf_counter()
          decoders[n](prompts)
          best[n] = min(best[n], time.perf_counter() - start)
      bare, still = ({n: sum(count * self.bare_ms(s.key, batch, w, cache_slots(
          s.key, opts[n], self.width, n), moving) for w, count in widths[n].items() if count)
                      for n in self.lengths} for moving in (True, False))
      per_forward = (best[n2] - best[n1]) * 1e3 / extra
      bare_per_forward = (bare[n2] - bare[n1]) / extra
      still_per_forward = (still[n2] - still[n1]) / extra
      ratio = per_forward / bare_per_forward
      rounds.append({"decoder_ms_per_forward": per_forward,
                     "bare_ms_per_forward": bare_per_forward, "overhead_ratio": ratio,
                     "bare_still_ms_per_forward": still_per_forward,
                     "overhead_ratio_still": per_forward / still_per_forward,
                     "call_fixed_ms": best[n1] * 1e3 - ratio * bare[n1],
                     "call_fixed_ms_flat": best[n1] * 1e3 - f[n1] * per_forward,
                     "decoder_ms": [best[n1] * 1e3, best[n2] * 1e3],
                     "bare_ms": [bare[n1], bare[n2]], "bare_still_ms": [still[n1], still[n2]]})
    ratios = [r["overhead_ratio"] for r in rounds]
    median = sorted(rounds, key=lambda r: r["overhead_ratio"])[(len(rounds) - 1) // 2]
    width = sum(w * c for w, c in widths[n2].items()) / sum(widths[n2].values())
    return {"method": s.method, "setting": s.setting, "batch": batch, "width": width,
            **median, "overhead_ratio_range": [min(ratios), max(ratios)],
            "overhead_ratio_rounds": ratios,
            "tokens_per_forward": n2 / f[n2],
            "forwards": [f[n1], f[n2]], "max_new_tokens": [n1, n2],
            "widths": {str(n): {str(w): c for w, c in sorted(widths[n].items())}
                       for n in self.lengths}}

  def widths(self, s: Setting, opt, gen, prompts) -> dict[int, int]:
    """Loop forwards by width: from the schedule, or counted (see counting_model)."""
    if s.key not in COUNTED:
      return schedule(s.key, opt, self.width, opt.max_new_tokens, gen.forwards)
    import jax
    import numpy as np

    from cardjax.decoding.frozen import freeze
    from cardjax.decoding.methods import make_decoder

    if self._counting is None:
      model, seen = counting_model(self.module)
      self._counting = freeze(model), seen
    model, seen = self._counting
    seen.clear()
    counted = make_decoder(s.decoder, model, s.objective, opt)(prompts)
    jax.effects_barrier()
    assert np.array_equal(counted.tokens, gen.tokens) and counted.forwards == gen.forwards, (
        s.key, counted.forwards, gen.forwards)
    assert len(seen) == loop_forwards(s.key, gen.forwards), (s.key, len(seen), gen.forwards)
    return {w: seen.count(w) for w in sorted(set(seen))}


def table_line(row: dict) -> str:
  def cell(key: str, spec: str) -> str:
    if key == "overhead_ratio_range":
      return "{:.2f}-{:.2f}".format(*row[key])
    return format(row[key], spec)
  return "| " + " | ".join(cell(k, f) for k, _, f in COLUMNS) + " |"


def main(argv: list[str] | None = None) -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--lengths", default=None,
                      help=f"N1,N2: the two max_new_tokens (default {LENGTHS[0]},{LENGTHS[1]})")
  parser.add_argument("--settings", default=",".join(s.key for s in SETTINGS))
  parser.add_argument("--repeats", type=int, default=None,
                      help="decoder timings, the best kept (default 3)")
  parser.add_argument("--rounds", type=int, default=None,
                      help=f"rounds of decoder and bare timings; the median round is kept "
                      f"(default {ROUNDS})")
  parser.add_argument("--bare-forwards", type=int, default=None,
                      help=f"forwards per timed bare loop (default {BARE_FORWARDS})")
  parser.add_argument("--quick", action="store_true",
                      help=f"the first batch only, lengths {QUICK_LENGTHS}, 1 repeat and "
                      f"{QUICK_BARE_FORWARDS} bare forwards, unless given")
  parser.add_argument("--toy", action="store_true",
                      help="a 64 x 2 layer model instead of 128 x 4 (a check of the output)")
  parser.add_argument("--json", default=None, help="write the machine and rows here")
  args = parser.parse_args(argv)
  batches = [int(b) for b in args.batches.split(",")]
  if args.quick:
    batches = batches[:1]
  lengths = (tuple(int(n) for n in args.lengths.split(",")) if args.lengths else
             QUICK_LENGTHS if args.quick else LENGTHS)
  repeats = args.repeats or (1 if args.quick else 3)
  rounds = args.rounds or (1 if args.quick else ROUNDS)
  bare_forwards = args.bare_forwards or (QUICK_BARE_FORWARDS if args.quick else BARE_FORWARDS)
  if len(lengths) != 2 or not 0 < lengths[0] < lengths[1]:
    parser.error(f"--lengths needs two lengths N1 < N2, got {args.lengths}")
  by_key = {s.key: s for s in SETTINGS}
  unknown = [k for k in args.settings.split(",") if k not in by_key]
  if unknown:
    parser.error(f"unknown settings {unknown}; choose from {list(by_key)}")
  settings = [by_key[k] for k in args.settings.split(",")]

  from benchmarks.decode_forward import CONFIG

  cfg = dataclasses.replace(CONFIG, initializer_range=1.0)
  if args.toy:
    cfg = dataclasses.replace(cfg, hidden_size=64, intermediate_size=128, num_layers=2,
                              num_heads=2, num_kv_heads=1)
  info = announce(f"decoder loop overhead, {cfg.hidden_size} x {cfg.num_layers} layers, "
                  f"max_new_tokens {lengths[0]} and {lengths[1]}, best of {repeats}, "
                  f"median of {rounds} rounds")
  bench = Bench(cfg, lengths, repeats, bare_forwards, rounds)
  sizes = {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
           "initializer_range": cfg.initializer_range, "prompts": PROMPTS,
           "prompt_len": PROMPT_LEN, "padded_width": bench.width, "lengths": list(lengths),
           "repeats": repeats, "rounds": rounds, "bare_forwards": bare_forwards,
           "bare_repeats": BARE_REPEATS}
  print("| " + " | ".join(title for _, title, _ in COLUMNS) + " |")
  print("|" + "---|" * len(COLUMNS), flush=True)
  rows = []
  start = time.perf_counter()
  for batch in batches:
    for s in settings:
      rows.append(bench.row(s, batch))
      print(table_line(rows[-1]), flush=True)
      if args.json:  # after every row: a run cut short keeps what it measured
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": info, "sizes": sizes, "rows": rows}, indent=1)
                        + "\n")
  print(f"({time.perf_counter() - start:.0f} s)")
  bad = [r for r in rows if not all(math.isfinite(r[k]) for k in
                                    ("decoder_ms_per_forward", "bare_ms_per_forward"))]
  assert not bad, bad


if __name__ == "__main__":
  main()
