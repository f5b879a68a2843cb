"""Which masked slots of a block to reveal in one forward (METHODS.md sections 1, 3, 4).

A planner reads per-slot statistics of one forward (top probability, entropy in bits) and
the still-masked slots [batch, B] and returns the slots to reveal this round. The kind and
the block are static (a `Planner`); the thresholds are runtime values (`Knobs`), so a sweep
over tau / gamma / remask never recompiles.

  confidence, cb  Fast-dLLM: every masked slot with top prob >= tau, plus the most confident.
  topk            the k most confident masked slots, k = the DUS round sizes (the
                  "confidence planner at the same number of forwards" baseline).
  dus             the dilated rounds of `dus_levels`; the last round reveals all that is left.
  eb              entropy-bounded: masked slots sorted by entropy, the largest prefix with
                  sum(H) - max(H) <= gamma.
  left_to_right   the leftmost masked slot (one token per forward: AR order).

Every planner reveals at least one slot of a row that still has masks (so a block always
fills in at most B forwards) and none of a row without masks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.errors import CardjaxError

KINDS = ("confidence", "cb", "topk", "dus", "eb", "left_to_right")
SPACED = ("confidence", "cb", "eb")  # the adaptive planners the spacing filter applies to


def dus_levels(block: int, base: int = 2) -> list[list[int]]:
  """The DUS rounds of a block: lists of slot indices, coarse to fine.

  stride s = block // base, then s //= base each round while s >= 1; a round takes the
  not yet revealed k with k % s == 0; what is left forms a last round, merged into the one
  before when it is smaller. B = 8: [0, 4], [2, 6], [1, 3, 5, 7]; B = 5: [0, 2, 4], [1, 3].
  For B a power of the base there are exactly log_base(B) rounds, otherwise at most
  ceil(log_base B)."""
  if block < 1:
    raise CardjaxError(f"block={block} must be >= 1")
  if base < 2:
    raise CardjaxError(f"base={base} must be >= 2 (the stride shrinks by this factor a round)")
  levels, seen = [], set()
  stride = block // base
  while stride >= 1:
    level = [k for k in range(block) if k % stride == 0 and k not in seen]
    if level:
      levels.append(level)
      seen.update(level)
    stride //= base
  rest = [k for k in range(block) if k not in seen]
  if rest and levels and len(rest) < len(levels[-1]):
    levels[-1] = sorted(levels[-1] + rest)  # only the leftovers merge, never a stride round
  elif rest:
    levels.append(rest)
  return levels


@dataclasses.dataclass(frozen=True)
class Planner:
  """The static part of a planner (hashable: a jit static argument)."""

  kind: str
  block: int
  base: int = 2
  spacing: bool = False

  def __post_init__(self):
    if self.kind not in KINDS:
      raise CardjaxError(f"planner={self.kind!r} is unknown; choose one of {KINDS}")
    if not isinstance(self.block, int) or self.block < 1:
      raise CardjaxError(f"block={self.block!r} must be an int >= 1")
    if self.spacing and self.kind not in SPACED:
      raise CardjaxError(f"spacing=True applies to the adaptive planners {SPACED}, not "
                         f"{self.kind!r}")
    dus_levels(self.block, self.base)  # checks the base

  @property
  def levels(self) -> list[list[int]]:
    return dus_levels(self.block, self.base)

  @property
  def rounds(self) -> int:
    """Forwards per block of dus / topk (without a step limit)."""
    return len(self.levels)


class Knobs(NamedTuple):
  """Runtime thresholds (jnp scalars): see `make_knobs`."""

  tau: jax.Array
  gamma: jax.Array
  remask: jax.Array
  g0: jax.Array


def make_knobs(tau: float = 0.9, gamma: float = 1.0, remask: float = 0.0,
               g0: int = 8) -> Knobs:
  """Check and wrap the thresholds.

  tau: confidence threshold of confidence/cb, in [0, 1]. gamma: entropy budget of eb in
  bits (as the EB-Sampler), >= 0. remask: dus only, a token placed in a non-final round
  with top prob < remask goes back to [MASK] (0 = off; the DUS paper's option is 0.3).
  g0: the spacing filter's initial gap: gap = max(2, floor(M_rem * g0 / B)) with M_rem the
  masks left in the block. Default 8, the DUS code's start_stride (a full block of 32
  starts with gap 8, relaxing to 2 as it fills); with g0 < 2 * B / M_rem the gap is 2."""
  if not 0.0 <= tau <= 1.0:
    raise CardjaxError(f"tau={tau} must lie in [0, 1]")
  if not gamma >= 0.0:
    raise CardjaxError(f"gamma={gamma} must be >= 0 (an entropy budget in bits)")
  if not 0.0 <= remask <= 1.0:
    raise CardjaxError(f"remask={remask} must lie in [0, 1] (0 = never re-mask)")
  if int(g0) != g0 or g0 < 0:
    raise CardjaxError(f"g0={g0} must be an int >= 0 (the spacing filter's initial gap)")
  return Knobs(jnp.float32(tau), jnp.float32(gamma), jnp.float32(remask), jnp.int32(g0))


def check_steps(steps, block: int) -> int:
  """The per-block forward limit as an int; None means none (B forwards always suffice)."""
  if steps is None:
    return block
  if int(steps) != steps or steps < 1:
    raise CardjaxError(f"steps={steps} must be None or an int >= 1 (forwards per block)")
  return int(steps)


def slot_stats(logits):
  """(argmax token int32, top prob, entropy in bits) of slot logits [b, B, vocab].

  From one pass of e = exp(l - max l) and its sum Z: the top prob is 1 / Z and the entropy
  log Z - sum(e (l - max l)) / Z, so no log-probabilities over the vocabulary are written
  and exponentiated again (a planner runs this every forward; XLA drops the entropy's pass
  when the planner does not read it)."""
  x = logits.astype(jnp.float32)
  shifted = x - jnp.max(x, axis=-1, keepdims=True)
  e = jnp.exp(shifted)
  total = jnp.sum(e, axis=-1)
  spread = jnp.sum(jnp.where(e > 0, e * shifted, 0.0), axis=-1)  # 0 x -inf counts 0
  entropy = (jnp.log(total) - spread / total) / math.log(2.0)
  return jnp.argmax(x, axis=-1).astype(jnp.int32), 1.0 / total, entropy


def _best(score, allowed):
  """One-hot [b, B] of the highest score among allowed slots (the lowest index on ties)."""
  idx = jnp.argmax(jnp.where(allowed, score, -jnp.inf), axis=1)
  hot = jnp.arange(score.shape[1])[None] == idx[:, None]
  return hot & jnp.any(allowed, axis=1, keepdims=True)


def _rank(score, allowed):
  """Rank of each allowed slot by descending score (0 = best; ties by index)."""
  order = jnp.argsort(jnp.where(allowed, -score, jnp.inf), axis=1, stable=True)
  return jnp.argsort(order, axis=1, stable=True)


def confidence_set(conf, masked, tau):
  """CB / Fast-dLLM: masked slots with conf >= tau, plus the single most confident."""
  return masked & ((conf >= tau) | _best(conf, masked))


def eb_set(entropy, masked, gamma):
  """EB: by ascending entropy, the largest k >= 1 with sum_{i<=k} H_i - max_{i<=k} H_i <=
  gamma (sorted ascending, the max is H_k, so the test is on the sum of the first k-1)."""
  rank = _rank(-entropy, masked)
  sorted_h = jnp.sort(jnp.where(masked, entropy, jnp.inf), axis=1)
  finite = jnp.isfinite(sorted_h)
  before = jnp.cumsum(jnp.where(finite, sorted_h, 0.0), axis=1) - jnp.where(finite, sorted_h, 0.0)
  k = jnp.maximum(1, jnp.sum(finite & (before <= gamma), axis=1))
  return masked & (rank < k[:, None])


def left_to_right_set(masked):
  """The leftmost masked slot."""
  return masked & (jnp.cumsum(masked.astype(jnp.int32), axis=1) == 1)


def dus_set(planner: Planner, conf, masked, rnd, remask):
  """The slots due by round `rnd`: level <= rnd (for B a power of the base exactly the
  still-masked k with k % s == 0), so slots re-masked earlier come back in a later round;
  the last round takes all. In a non-final round, due slots with conf < remask stay masked."""
  level = np.zeros((planner.block,), np.int32)
  for r, slots in enumerate(planner.levels):
    level[slots] = r
  final = rnd >= planner.rounds - 1
  due = masked & ((level[None] <= rnd) | final)
  return due & ((conf >= remask) | final)


def topk_set(planner: Planner, conf, masked, rnd):
  """The k most confident masked slots, k = the size of DUS round `rnd`; the last takes all."""
  sizes = jnp.asarray([len(slots) for slots in planner.levels], jnp.int32)
  k = sizes[jnp.minimum(rnd, planner.rounds - 1)]
  final = rnd >= planner.rounds - 1
  return masked & ((_rank(conf, masked) < k) | final)


def spacing_filter(candidates, score, gap):
  """Keep candidates in descending score order, each only if it is >= gap[row] slots away
  from every kept one; the first is always kept. candidates/score [b, B], gap [b] int."""
  b, width = candidates.shape
  order = jnp.argsort(jnp.where(candidates, -score, jnp.inf), axis=1, stable=True)
  slot = jnp.arange(width)[None]

  def visit(i, kept):
    c = order[:, i][:, None]  # the i-th best slot of each row
    is_cand = jnp.take_along_axis(candidates, c, axis=1)[:, 0]
    far = jnp.all(~kept | (jnp.abs(slot - c) >= gap[:, None]), axis=1)
    return kept | ((is_cand & far)[:, None] & (slot == c))

  return jax.lax.fori_loop(0, width, visit, jnp.zeros((b, width), bool))


def reveal(planner: Planner, conf, entropy, masked, rnd, knobs: Knobs, last=False):
  """The boolean reveal set [b, B] of round `rnd` (0-based, per block).

  conf, entropy: [b, B] top prob and entropy (bits) of each slot; masked: [b, B] bool.
  last: the block's step limit is reached, so every masked slot is revealed."""
  kind = planner.kind
  if kind in ("confidence", "cb"):
    out, score = confidence_set(conf, masked, knobs.tau), conf
  elif kind == "eb":
    out, score = eb_set(entropy, masked, knobs.gamma), -entropy
  elif kind == "topk":
    out = topk_set(planner, conf, masked, rnd)
  elif kind == "dus":
    out = dus_set(planner, conf, masked, rnd, knobs.remask)
  else:
    out = left_to_right_set(masked)
  if planner.spacing:
    m_rem = jnp.sum(masked, axis=1)
    gap = jnp.maximum(2, (m_rem * knobs.g0) // planner.block)
    out = spacing_filter(out, score, gap)
  # Progress: a row with masks and nothing revealed (dus after re-masking, or a round with
  # no due slot in a block cut by the token budget) takes its most confident due slot, else
  # its most confident masked one.
  empty = ~jnp.any(out, axis=1, keepdims=True)
  if kind == "dus":
    due = dus_set(planner, conf, masked, rnd, jnp.float32(0.0))
    pool = jnp.where(jnp.any(due, axis=1, keepdims=True), due, masked)
  else:
    pool = masked
  out = out | (empty & _best(conf, pool))
  return jnp.where(last, masked, out)


@functools.partial(jax.jit, static_argnums=0)
def plan_step(planner: Planner, slot_logits, masked, rnd, knobs: Knobs, last):
  """One decoding step from slot logits [b, B, vocab]: (argmax tokens, reveal set).

  Jitted so the plain-Python references compile it once per planner (eager dispatch
  would retrace the spacing filter's loop at every step)."""
  guess, conf, entropy = slot_stats(slot_logits)
  return guess, reveal(planner, conf, entropy, masked, rnd, knobs, last)


def check_request(mask_id, vocab_size: int, max_new_tokens: int) -> int:
  """The block decoders' shared checks; returns the [MASK] id as an int."""
  if mask_id is None or int(mask_id) < 0:
    raise CardjaxError("block decoding needs the model's [MASK] id: pass mask_id or set "
                       "model.mask_token_id")
  if int(mask_id) >= vocab_size:
    raise CardjaxError(f"mask_id={mask_id} lies outside the vocabulary (vocab_size="
                       f"{vocab_size})")
  if max_new_tokens < 1:
    raise CardjaxError(f"max_new_tokens={max_new_tokens} must be >= 1")
  return int(mask_id)


def cut_at_stop(out, done, stop_ids, pad_id):
  """(tokens, lengths) of a finished block decode: a done row ends at its first stop token
  (pad after it), the others keep all of `out` [b, n]."""
  n = out.shape[1]
  is_stop = jnp.isin(out, stop_ids)
  first = jnp.where(done & jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, n)
  tokens = jnp.where(jnp.arange(n)[None] < first[:, None], out, pad_id)
  return tokens, first.astype(jnp.int32)
