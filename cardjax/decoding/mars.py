"""MARS threshold decoding: several tokens per forward from one causal model.

Each forward reads [pending | B x MASK] against the KV cache: `pending` are the committed
tokens whose keys are not cached yet (at first the prompt's last token, later the tokens
accepted by the previous forward). Slot 0's distribution is the output at the last
pending token (an exact AR step), slot j's the output at mask j-1. Tokens are accepted
left to right while their confidence >= tau (tau < 1), always at least one; at tau = 1
exactly one, so the output is AR greedy token for token. tau is a runtime value; the
confidence rule (RULES: top prob, normalised entropy, top-2 margin, entropy in nats) is
static.

Window width (`window`): the pending run has 1..B tokens. "full" always reads B pending
slots (padded) + B masks = 2B tokens; "fit" (the default) reads w + B, w the narrowest of
a few compiled widths (1, 2, 4, ..., B) that holds the batch's longest pending run, as the
reference reads its n + B. Each width has its own inner while loop of static shape, which
runs while that width fits; an outer loop cycles through them. Both give the same tokens
and forwards; where a forward costs about its tokens (a CPU) the narrow one is cheaper.

Sampling: at temperature > 0 each slot's token is drawn from softmax(logits / temperature)
within the top-p nucleus (as AR samples); the rules judge the model's own (temperature 1)
distribution, and "prob" the probability of the drawn token, as the reference does.
temperature, top_p and the seed are runtime values; temperature 0 is the greedy decoder.

Cache use: each row has its own write index (KVCache.per_row). A row's window is written
at its index; its pending tokens are real and stay, the rest (padding after a shorter
pending run, the masks) is scratch, overwritten by the row's next window, which starts
right after those pending tokens. So a row's cache grows by exactly the tokens it
committed, the cache needs width + max_new_tokens + 2B slots whatever the batch, and that
is what every forward's attention reads. A narrower next window does not cover all of this
one's scratch, and causal attention decides visibility by position, not slot: with "fit"
the slots past the new index are marked empty before the windows narrow (once per pass
over the widths, not every forward: a window as wide or wider covers the last one's).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding import sampling
from cardjax.decoding.ar import sample_tokens
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation, decode
from cardjax.decoding.reference import causal_logits
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache

# Rules whose confidence lies in [0, 1], accepted while >= tau, tau = 1 greedy AR.
UNIT_RULES = ("prob", "entropy", "margin")
# "entropy_nats": the reference's rule, accepted while H (nats) <= tau, tau = 0 greedy AR.
RULES = UNIT_RULES + ("entropy_nats",)
WINDOWS = ("fit", "full")


def entropy(probs):
  """[..., vocab] probabilities -> [...] entropy in nats (0 log 0 counts as 0)."""
  return -jnp.sum(jax.scipy.special.xlogy(probs, probs), axis=-1)


def confidence(probs, rule: str = "prob", tokens=None):
  """[..., vocab] probabilities -> [...] confidence in [0, 1] under `rule`: "prob" the
  probability of `tokens` (the top token when None, i.e. greedy), "entropy"
  1 - H(p) / log(vocab), "margin" top-1 minus top-2 probability."""
  if rule == "prob":
    if tokens is None:
      return jnp.max(probs, axis=-1)
    return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]
  if rule == "entropy":
    return 1.0 - entropy(probs) / jnp.log(probs.shape[-1])
  if rule == "margin":
    top2 = jax.lax.top_k(probs, 2)[0]
    return top2[..., 0] - top2[..., 1]
  raise CardjaxError(f"rule={rule!r} has no confidence in [0, 1]; use one of {UNIT_RULES}")


def accept_count(probs, tau, rule: str = "prob", tokens=None):
  """Tokens accepted per row from probs [batch, slots, vocab] (`tokens` [batch, slots]: the
  chosen ones, for "prob"; None = the top ones): the leading run of slots that pass, at
  least 1. A [0, 1] rule passes while confidence >= tau, "entropy_nats" while the entropy
  <= tau nats. At a rule's greedy setting exactly 1 is accepted, even where a slot would
  pass (a one-hot row: confidence 1, entropy 0), so it is greedy AR: tau >= 1 for the
  [0, 1] rules, tau <= 0 for entropy_nats."""
  if rule == "entropy_nats":
    ok = (entropy(probs) <= tau) & (tau > 0.0)
  else:
    ok = (confidence(probs, rule, tokens) >= tau) & (tau < 1.0)
  return jnp.maximum(1, jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1))


def pick_tokens(greedy, logits, key, temperature, top_p):
  """`greedy` (the caller's argmax) at temperature 0, else a sample per slot from
  softmax(logits / temperature) within the top-p nucleus. A lax.cond: greedy decoding
  skips the vocab sort and stays exactly the greedy decoder."""
  if temperature is None:  # sampling.greedy_only: the greedy program
    return greedy
  return jax.lax.cond(temperature > 0, lambda: sample_tokens(logits, key, temperature, top_p),
                      lambda: greedy)


def check_args(tau: float, block: int, mask_id: int, rule: str, temperature: float = 0.0,
               top_p: float = 1.0) -> None:
  """The user-facing argument checks shared by the MARS decoders."""
  if rule not in RULES:
    raise CardjaxError(f"rule={rule!r} is not an acceptance rule; use one of {RULES}")
  if rule == "entropy_nats":
    if not 0.0 <= tau < float("inf"):
      raise CardjaxError(f"tau={tau} must be >= 0 for rule entropy_nats (an entropy bound in "
                         "nats; 0 = plain greedy AR)")
  elif not 0.0 <= tau <= 1.0:
    raise CardjaxError(f"tau={tau} must lie in [0, 1] (1 = plain greedy AR)")
  if block < 1:
    raise CardjaxError(f"block={block} must be >= 1")
  if mask_id < 0:
    raise CardjaxError("MARS decoding needs the model's [MASK] id (model.mask_token_id)")
  if not 0.0 <= temperature < float("inf"):
    raise CardjaxError(f"temperature={temperature} must be >= 0 (0 = greedy)")
  if not 0.0 < top_p <= 1.0:
    raise CardjaxError(f"top_p={top_p} must lie in (0, 1] (1 = the whole vocabulary)")


def window_inputs(pending, n_pending, committed, mask_id, w: int, block: int):
  """The forward's inputs for the window [pending[:, :w] | B masks] of each row: ids,
  positions, segment ids (0 on pending slots past the row's n_pending: padding) and
  logits_at, the w + B slots that take a distribution: the last real pending token (for
  mask 0) and masks 0..B-2. The other pending tokens and the last mask need no LM head."""
  b = pending.shape[0]
  slot = jnp.arange(block)[None]
  at = jnp.arange(w)[None]
  valid = at < n_pending[:, None]
  pend_pos = committed[:, None] - n_pending[:, None] + at
  ids = jnp.concatenate([pending[:, :w], jnp.full((b, block), mask_id, jnp.int32)], axis=1)
  pos = jnp.concatenate([jnp.where(valid, pend_pos, 0), committed[:, None] + slot], axis=1)
  seg = jnp.concatenate([valid.astype(jnp.int32), jnp.ones((b, block), jnp.int32)], axis=1)
  # A done row's n_pending may exceed w: clipped, its outputs are not used.
  last = (jnp.minimum(n_pending, w) - 1)[:, None]
  need = jnp.concatenate([last, jnp.broadcast_to(w + slot[:, :-1], (b, block - 1))], 1)
  return ids, pos, seg, need


def judge_window(logits, tau, rule: str, temperature, top_p, u):
  """The window's B guesses (sampling.sample with the uniforms u [rows, B]; temperature and
  top_p broadcast to them) and how many each row accepts (accept_count at its tau)."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  guess = sampling.sample(logits, u, temperature, top_p)
  return guess, accept_count(probs, tau, rule, guess)


def pending_widths(block: int, window: str) -> tuple[int, ...]:
  """The compiled widths of the pending part of a window: (B,) for "full"; for "fit" the
  powers of two below B and B itself: a pending run of n reads fewer than 2n slots, from
  log2(B) + 1 compiled forwards instead of B."""
  if window not in WINDOWS:
    raise CardjaxError(f"window={window!r} is not a window width; use one of {WINDOWS}")
  if window == "full":
    return (block,)
  widths = [1]
  while widths[-1] * 2 < block:
    widths.append(widths[-1] * 2)
  return tuple(sorted(set(widths + [block])))


def width_sweep(widths: tuple[int, ...], running, need, step, block: int):
  """The "fit" window's outer loop body, for a carry whose first item is the KV cache: one
  while loop per width in turn, each running while running(carry) and w is the narrowest
  width holding need(carry), the longest live pending run, with step(w) as its body; then
  the scratch past each row's index is forgotten.

  Loops, not a lax.switch: a conditional copied the whole KV cache every forward (its
  branches cannot update the loop-carried buffers in place), a while loop does not. Stale
  scratch must not stay visible (module docstring). A window starts at or after the last
  one's start and is as wide or wider within a pass, so it overwrites all of that window's
  scratch; only the next pass's narrower windows would leave some of it."""
  def fits(narrower: int, w: int):
    def cond(carry):
      n = need(carry)
      return running(carry) & (n > narrower) & (n <= w)
    return cond

  def sweep(carry):
    for narrower, w in zip((0,) + widths[:-1], widths):
      carry = jax.lax.while_loop(fits(narrower, w), step(w), carry)
    return (carry[0].forget_scratch(2 * block),) + carry[1:]
  return sweep


@decode_loop("block", "max_new_tokens", "rule", "window")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, tau, temperature, top_p, rng, block: int, max_new_tokens: int,
              rule: str, window: str):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  steps_max = max_new_tokens  # at least one token per forward
  # A row's index starts after the prompt less its last token and advances by the tokens
  # it commits (at most max_new + 1 with that token), then its window writes <= 2B slots.
  cache = KVCache.create(model.cfg, b, width + max_new_tokens + 2 * block)
  _, cache = model.forward_cached(tokens[:, :-1], cache, positions=positions[:, :-1],
                                  segment_ids=segments[:, :-1])
  cache = cache.per_row()
  pending = jnp.full((b, block), pad_id, jnp.int32).at[:, 0].set(tokens[:, -1])
  n_pending = jnp.ones((b,), jnp.int32)
  committed = lengths  # tokens of each row so far (prompt + generated)
  out = jnp.full((b, max_new_tokens + block), pad_id, jnp.int32)
  count = jnp.zeros((b,), jnp.int32)
  done = jnp.zeros((b,), bool)
  slot = jnp.arange(block)
  widths = pending_widths(block, window)

  def live(carry):
    return ~jnp.all(carry[5]) & (jnp.max(carry[7]) < steps_max)

  def step(w: int):
    """The loop body with the window [pending[:, :w] | B masks] (w + B tokens)."""
    def body(carry):
      cache, pending, n_pending, committed, out, done, count, forwards, rng = carry
      forwards = forwards + (~done).astype(jnp.int32)  # per row: the forwards it was live in
      ids, pos, seg, need = window_inputs(pending, n_pending, committed, mask_id, w, block)
      start = cache.index
      slot_logits, cache = model.forward_cached(ids, cache, positions=pos, segment_ids=seg,
                                                logits_at=need)
      # Keep the real pending keys: the next window starts after them (a done row stays).
      cache = dataclasses.replace(cache, index=start + jnp.where(done, 0, n_pending))
      u = None
      if temperature is not None:  # None: the greedy program draws nothing
        rng, key = jax.random.split(rng)
        u = jax.random.uniform(key, slot_logits.shape[:-1])
      guess, k = judge_window(slot_logits, tau, rule, temperature, top_p, u)
      # Stop at the first stop token and at the token budget.
      is_stop = jnp.isin(guess, stop_ids) & (slot[None] < k[:, None])
      first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, block)
      k = jnp.minimum(jnp.minimum(k, first_stop), max_new_tokens - count)
      k = jnp.where(done, 0, k)
      take = slot[None] < k[:, None]
      idx = jnp.where(take, count[:, None] + slot[None], max_new_tokens + block - 1)
      out = out.at[jnp.arange(b)[:, None], idx].set(jnp.where(take, guess, pad_id))
      done = done | jnp.any(is_stop & take, axis=1) | (count + k >= max_new_tokens)
      return (cache, jnp.where(take, guess, pad_id), jnp.maximum(k, 1), committed + k, out,
              done, count + k, forwards, rng)
    return body

  def need(carry):  # the longest pending run of a live row
    return jnp.max(jnp.where(carry[5], 1, carry[2]))

  carry = (cache, pending, n_pending, committed, out, done, count, jnp.zeros((b,), jnp.int32),
           rng)
  if len(widths) == 1:
    carry = jax.lax.while_loop(live, step(widths[0]), carry)
  else:
    carry = jax.lax.while_loop(live, width_sweep(widths, live, need, step, block), carry)
  return carry[4][:, :max_new_tokens], carry[6], carry[7]


def generate(model, prompts, max_new_tokens: int, block: int, tau: float, mask_id: int,
             stop_ids=(), pad_id: int = 0, rule: str = "prob", window: str = "fit",
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             bucket: int | None = None) -> Generation:
  """MARS decoding of a batch of token-id prompts; `forwards` counts window forwards.
  `rule` picks the confidence compared with tau (see `accept_count`), `window` the window
  widths ("fit" or "full": the same tokens); temperature > 0 samples (top_p, seed).
  `bucket`: the prompt width bucket (default prompts.BUCKET)."""
  check_args(tau, block, mask_id, rule, temperature, top_p)
  pending_widths(block, window)
  return decode(_generate, model, prompts, max_new_tokens + block, stop_ids, pad_id,
                np.int32(mask_id), np.float32(tau), sampling.greedy_only(temperature),
                np.float32(top_p),
                jax.random.key(seed), bucket=bucket, block=block, max_new_tokens=max_new_tokens,
                rule=rule, window=window)


def mars_by_recompute(model, prompt, max_new_tokens: int, block: int, tau: float,
                      mask_id: int, stop_ids=(), rule: str = "prob",
                      runs: list | None = None) -> tuple[list[int], int]:
  """The reference: one full causal forward over [committed | B masks] per step, no cache.
  Returns (tokens, forwards); `runs`, if given, gets each forward's accepted count before
  the stop and budget clips (the next window's pending run: tests check which window widths
  a schedule used)."""
  seq, out, forwards = list(prompt), [], 0
  width = len(prompt) + max_new_tokens + block
  while len(out) < max_new_tokens:
    logits = causal_logits(model, seq + [mask_id] * block, width)[len(seq) - 1:-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    forwards += 1
    k = int(accept_count(probs[None], tau, rule)[0])
    if runs is not None:
      runs.append(k)
    for token in np.asarray(jnp.argmax(probs, axis=-1))[:k].tolist():
      out.append(token)
      seq.append(token)
      if token in stop_ids or len(out) == max_new_tokens:
        return out, forwards
  return out, forwards
