"""A decoder's front and back: token-id prompts in, a `Generation` out.

Batches of prompts of different lengths are left-padded so all rows write the KV cache at
the same slot: padding has segment 0 (invisible to every real token) and the real tokens
of each row have positions 0..n-1. The padded width is rounded up to a multiple of `bucket`,
so a stream of batches with slightly different prompt lengths reuses a few compiled
programs instead of compiling one per length (the extra padding is invisible)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError

# The default bucket. Callers that want another pass `bucket` (the server its
# --width-bucket; a benchmark of a deep model, where each compile takes tens of seconds, a
# larger one so a whole prompt set shares one width); nothing assigns this constant.
BUCKET = 16


@dataclasses.dataclass
class Generation:
  tokens: np.ndarray  # [batch, max_new_tokens], pad after the stop token
  lengths: np.ndarray  # [batch] generated tokens, the stop token included
  forwards: int  # model calls that produced tokens (the AR prefill among them)
  # [batch] the forwards each row was live in (not yet stopped): a batched call runs
  # `forwards`, and a row that stopped early rides the rest without writing
  row_forwards: np.ndarray

  def rows(self) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def padded_width(prompts: Sequence[Sequence[int]], bucket: int | None = None) -> int:
  """The width left_pad gives these prompts: the longest, rounded up to `bucket`
  (default BUCKET)."""
  bucket = bucket or BUCKET
  return -(-max(len(p) for p in prompts) // bucket) * bucket


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, max_context: int | None = None,
             bucket: int | None = None):
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


def decode(loop, model, prompts: Sequence[Sequence[int]], room: int, stop_ids, pad_id: int,
           *args, bucket: int | None = None, **static) -> Generation:
  """Left-pad `prompts` (to a multiple of `bucket`, default BUCKET) leaving `room`
  positions of the model's context for what the decoder writes after them, then run the
  jitted loop loop(model, tokens, positions, segments, lengths, stop_ids, pad_id, *args,
  **static) -> (out, count, forwards). `max_new_tokens` is one of `static`, checked here
  for all."""
  if static["max_new_tokens"] < 1:
    raise CardjaxError(f"max_new_tokens={static['max_new_tokens']} must be >= 1")
  tokens, positions, segments, lengths = left_pad(
      prompts, pad_id, model.cfg.max_position_embeddings - room, bucket)
  stop = np.asarray(list(stop_ids) or [-1], np.int32)  # -1: no stop id matches
  out, count, forwards = loop(model, tokens, positions, segments, lengths, stop,
                              np.int32(pad_id), *args, **static)
  # Rows stop, never restart: a live row has been live in every forward so far, so the
  # batch's forwards are the most any row was live in.
  per_row = np.asarray(forwards)
  return Generation(np.asarray(out), np.asarray(count), int(per_row.max()), per_row)
