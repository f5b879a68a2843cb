"""Batches of prompts of different lengths, left-padded so all rows write the KV cache at
the same slot: padding has segment 0 (invisible to every real token) and the real tokens
of each row have positions 0..n-1. The padded width is rounded up to a multiple of `bucket`,
so a stream of batches with slightly different prompt lengths reuses a few compiled
programs instead of compiling one per length (the extra padding is invisible)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError


BUCKET = 16


def padded_width(prompts: Sequence[Sequence[int]], bucket: int = BUCKET) -> int:
  """The width left_pad gives these prompts: the longest, rounded up to `bucket`."""
  return -(-max(len(p) for p in prompts) // bucket) * bucket


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, max_context: int | None = None,
             bucket: int = BUCKET):
  """(tokens, positions, segment_ids, lengths) as int32 numpy arrays [batch, width]."""
  if not prompts:
    raise CardjaxError("no prompts given")
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  if (lengths == 0).any():
    raise CardjaxError(f"prompt {int(np.argmin(lengths))} is empty; every prompt needs at "
                       "least one token")
  width = int(lengths.max())
  if max_context is not None and width > max_context:
    raise CardjaxError(f"a prompt has {width} tokens, more than the model's context of "
                       f"{max_context} (model.max_position_embeddings)")
  width = padded_width(prompts, bucket)
  b = len(prompts)
  tokens = np.full((b, width), pad_id, np.int32)
  positions = np.zeros((b, width), np.int32)
  segments = np.zeros((b, width), np.int32)
  for r, prompt in enumerate(prompts):
    n = len(prompt)
    tokens[r, width - n:] = prompt
    positions[r, width - n:] = np.arange(n)
    segments[r, width - n:] = 1
  return tokens, positions, segments, lengths
