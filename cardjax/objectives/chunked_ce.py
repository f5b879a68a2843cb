"""Cross-entropy through the LM head a chunk of positions at a time.

The plain loss materialises logits [batch, seq, vocab] for the whole batch (in float32 for
the softmax): at 16 rows x 2048 tokens x a 151k vocabulary that is ~9 GiB per chip for the
logits alone, kept for the backward pass. `HeadInputs` stands in for those logits: the
final-normed features and the head matrix. `token_ce` of a HeadInputs computes, for each
chunk of `chunk` positions, the logits and their cross-entropy under `jax.checkpoint`, so
the forward keeps only one chunk's logits at a time and the backward recomputes each
chunk's from the features. Loss and gradients equal the plain path's (the same products,
summed in the same order per position).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class HeadInputs:
  """Logits not computed yet: features [batch, seq, embed] x head [vocab, embed]."""

  features: jax.Array
  head: jax.Array
  chunk: int  # positions per chunk of the loss

  def __getitem__(self, index) -> "HeadInputs":
    """Slices the batch and sequence dimensions (objectives take logits[:, :L])."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > 2 or Ellipsis in index:
      raise IndexError("HeadInputs slices only [batch, seq]")
    return HeadInputs(self.features[index], self.head, self.chunk)

  @property
  def shape(self) -> tuple[int, ...]:
    return self.features.shape[:-1] + (self.head.shape[0],)


def chunked_ce(inputs: HeadInputs, targets: jax.Array) -> jax.Array:
  """Per-position cross-entropy [batch, seq] in float32, `inputs.chunk` positions at a time."""
  from cardjax.model.decoder import head_logits  # the model's own head (sharding included)

  b, t, d = inputs.features.shape
  c = min(inputs.chunk, t)
  n = -(-t // c)
  pad = n * c - t
  features = jnp.pad(inputs.features, ((0, 0), (0, pad), (0, 0)))
  labels = jnp.pad(targets, ((0, 0), (0, pad)))  # padded positions are cut off below
  features = features.reshape(b, n, c, d).swapaxes(0, 1)
  labels = labels.reshape(b, n, c).swapaxes(0, 1)

  @jax.checkpoint
  def one(chunk):
    f, y = chunk
    logits = head_logits(f, inputs.head)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)

  ce = jax.lax.map(one, (features, labels))  # [n, batch, c]
  return ce.swapaxes(0, 1).reshape(b, n * c)[:, :t]
