"""MARS: Mask AutoRegression fine-tuning (METHODS.md section 2).

The model reads 2L tokens [clean x | noisy x~]: the same position and segment ids in both
halves, streams [0]*L + [1]*L. The noisy stream replaces EVERY response token (loss_mask 1)
by [MASK]; prompt tokens stay. No randomness: rng is unused.

Attention MaskSpec("dual_stream", B) compares position ids, so block beta(i) = position // B
and packed documents (positions restarting at 0) each have their own blocks.

In each stream the output at q predicts the clean x_{q+1}, counted where x_{q+1} is a
response token of the same document (base.next_token_targets).
Loss = CE_noisy + alpha * CE_clean; each term is per row sum over the row's response targets /
their number, then the mean over rows that have any.

noisy_fraction < 1 (the compact noisy stream): most of the noisy copy is wasted work. A noisy
output carries loss only where its target is a response token, and a noisy query reads noisy
keys of its own block only (the rest are clean keys), so a noisy block none of whose outputs
carries loss is read by no query that matters: the prompt's blocks, except the block of
each response's first target (the last prompt token predicts the first response token, and
its block's earlier prompt tokens are its noisy keys). The compact stream keeps exactly the
blocks that carry loss, whole and in order, after the clean stream: [clean x (L) | those
blocks, then filler (N)], N = ceil(noisy_fraction * L / B) * B. Every kept token has the
position, segment, target and weight it has in the full copy, so the loss and its gradients
are the full stream's (tests/test_mars_compact.py). Filler slots have segment 0 and
position 0 (each sees itself, so its softmax is defined; no real query sees it) and no
weight. A batch with a row that needs more than N slots cannot be trained exactly: its loss
is NaN (the trainer stops, naming the last good checkpoint and the share the row needed,
`mars/noisy_needed`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec
from cardjax.errors import ConfigError
from cardjax.objectives.base import (ModelInputs, Objective, next_token_targets, per_row_mean,
                                     token_ce)
from cardjax.objectives.mdlm import require_block_size, require_mask_id


def loss_blocks(positions, segment_ids, weights, block: int) -> jax.Array:
  """One row ([L] arrays; weights: the output weights of base.next_token_targets): True on
  every token of a (document, block) that holds a loss-carrying output, what the compact
  noisy stream keeps."""
  # Runs of equal (segment, block): a document's positions rise by 1, so each block of each
  # packed document is one run of the row.
  p, g = positions // block, segment_ids
  starts = jnp.concatenate([jnp.ones((1,), bool), (g[1:] != g[:-1]) | (p[1:] != p[:-1])])
  run = jnp.cumsum(starts) - 1
  carries = jax.ops.segment_max(weights, run, num_segments=g.shape[0]) > 0
  return carries[run] & (g > 0)


class MARS(Objective):
  name = "mars"
  stream_factor = 2

  def __init__(self, cfg, model_cfg):
    super().__init__(cfg, model_cfg)
    self.block_size = require_block_size(cfg, self.name)
    self.alpha = float(cfg.alpha)
    if self.alpha < 0:
      raise ConfigError(f"objective.alpha={cfg.alpha!r}: the clean-stream weight must be >= 0")
    self.mask_id = require_mask_id(model_cfg, self.name)
    self.noisy_fraction = float(cfg.get("noisy_fraction", 1.0))
    if not 0 < self.noisy_fraction <= 1:
      raise ConfigError(f"objective.noisy_fraction={self.noisy_fraction} must be in (0, 1]")
    self.compact = self.noisy_fraction < 1
    # Model tokens per data token (throughput and MFU): the noisy stream's share on top.
    self.stream_factor = 1 + self.noisy_fraction

  def noisy_len(self, seq_len: int) -> int:
    """N: the compact noisy stream's slots for rows of seq_len tokens (whole blocks)."""
    if not self.compact:
      return seq_len
    b = self.block_size
    return min(seq_len, math.ceil(self.noisy_fraction * seq_len / b) * b)

  def corrupt(self, batch, rng):
    del rng  # MARS masks every response token: nothing random
    tokens, pos, seg, loss_mask = (batch["tokens"], batch["positions"], batch["segment_ids"],
                                   batch["loss_mask"])
    response = (loss_mask > 0) & (seg > 0)
    noisy = jnp.where(response, self.mask_id, tokens).astype(tokens.dtype)
    targets, valid = next_token_targets(tokens, seg, loss_mask)
    w = valid.astype(jnp.float32)
    if self.compact:
      return self._compact(tokens, noisy, pos, seg, targets, w)
    zeros = jnp.zeros_like(tokens)
    return ModelInputs(
        tokens=jnp.concatenate([tokens, noisy], axis=1),
        positions=jnp.concatenate([pos, pos], axis=1),
        segment_ids=jnp.concatenate([seg, seg], axis=1),
        streams=jnp.concatenate([zeros, zeros + 1], axis=1),
        targets=jnp.concatenate([targets, targets], axis=1),
        weights=jnp.concatenate([w, w], axis=1),
        mask=MaskSpec("dual_stream", self.block_size))

  def _compact(self, tokens, noisy, pos, seg, targets, w) -> ModelInputs:
    """[clean | the blocks that carry loss, then filler], row by row."""
    length = tokens.shape[1]
    slots = self.noisy_len(length)

    def row(noisy, p, g, targets, w):
      keep = loss_blocks(p, g, w, self.block_size)
      needed = jnp.sum(keep)
      slot = jnp.where(keep, jnp.cumsum(keep) - 1, slots)  # slots: past the end, dropped
      source = jnp.full((slots,), length, jnp.int32).at[slot].set(
          jnp.arange(length, dtype=jnp.int32), mode="drop")
      filled = source < length
      at = jnp.minimum(source, length - 1)

      def pick(values, fill):
        return jnp.where(filled, values[at], fill).astype(values.dtype)

      return (pick(noisy, self.mask_id), pick(p, 0), pick(g, 0), pick(targets, 0), pick(w, 0.0),
              needed / length, (needed > slots).astype(jnp.float32))

    n_tok, n_pos, n_seg, n_tgt, n_w, needed, overflow = jax.vmap(row)(noisy, pos, seg,
                                                                     targets, w)
    return ModelInputs(
        tokens=jnp.concatenate([tokens, n_tok], axis=1),
        positions=jnp.concatenate([pos, n_pos], axis=1),
        segment_ids=jnp.concatenate([seg, n_seg], axis=1),
        streams=jnp.concatenate([jnp.zeros_like(tokens), jnp.ones_like(n_tok)], axis=1),
        targets=jnp.concatenate([targets, n_tgt], axis=1),
        weights=jnp.concatenate([w, n_w], axis=1),
        aux={"noisy_needed": needed, "noisy_overflow": overflow},
        mask=MaskSpec("dual_stream", self.block_size, noisy_len=slots))

  def nonfinite_hint(self, metrics: dict) -> tuple[str, str] | None:
    overflow = metrics.get("mars/noisy_overflow")
    if overflow is None or float(overflow) <= 0:
      return None
    share = float(metrics["mars/noisy_needed"])
    return (f"a row's loss-carrying blocks needed {share:.3f} of the row, more than "
            "objective.noisy_fraction gives",
            f"raise --config.objective.noisy_fraction above {share:.3f}, or 1.0 for the full "
            "noisy copy")

  def loss(self, logits, inputs):
    ce = token_ce(logits, inputs.targets)
    clean_w = jnp.where(inputs.streams == 0, inputs.weights, 0.0)
    noisy_w = jnp.where(inputs.streams == 1, inputs.weights, 0.0)
    clean = per_row_mean(ce, clean_w)
    noisy = per_row_mean(ce, noisy_w)
    loss = noisy + self.alpha * clean
    metrics = {"mars/noisy": noisy, "mars/clean": clean, "tokens/targets": jnp.sum(clean_w)}
    if "noisy_needed" in inputs.aux:
      overflow = jnp.max(inputs.aux["noisy_overflow"])
      # A row whose kept blocks did not fit cannot give the full stream's loss: NaN (the
      # trainer stops and names the share it needed), never a silently different objective.
      loss = jnp.where(overflow > 0, jnp.nan, loss)
      metrics["mars/noisy_needed"] = jnp.max(inputs.aux["noisy_needed"])
      metrics["mars/noisy_overflow"] = overflow
    metrics["loss/mars"] = loss
    return loss, metrics
