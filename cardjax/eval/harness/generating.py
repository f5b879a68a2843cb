"""lm-eval's generate_until requests, decoded by the checkpoint's decoder (make_decoder).

Requests with the same generation settings are decoded together, shortest prompt first,
in batches of batch_size rows; the last batch is filled with copies of its first prompt
(their rows are dropped) so every batch has one shape, and a decoder compiles once per
padded prompt width. The first batch of each new shape is decoded once untimed, as the
decode benchmark does, so tokens/s counts no compile.

Text is cut as lm-eval's hf model cuts it: the generated tokens decoded without special
tokens, up to the first of the request's `until` strings. The decoders stop at the
tokenizer's stop ids (end of text and <|im_end|>), which lm-eval's stop sequences of chat
tasks name too; they do not stop at `until` strings, which are cut afterwards.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from cardjax.errors import CardjaxError


def check_greedy(kwargs: dict, task: str) -> None:
  """Only greedy decoding: lm-eval's sampled tasks would need its seeds and repeats."""
  sample = kwargs.get("do_sample")
  temperature = float(kwargs.get("temperature") or 0.0)
  if sample or (sample is None and temperature > 0):
    raise CardjaxError(f"task {task} asks for sampling (do_sample={sample}, temperature="
                       f"{temperature}); the cardjax harness model decodes greedily only: "
                       "pass --gen-kwargs do_sample=false,temperature=0 or pick a greedy task")


def until_of(kwargs: dict) -> list[str]:
  until = kwargs.get("until") or []
  if isinstance(until, str):
    until = [until]
  if not isinstance(until, (list, tuple)) or not all(isinstance(u, str) for u in until):
    raise CardjaxError(f"generation_kwargs until={until!r} must be a string or a list of "
                       "strings")
  return list(until)


def cut(text: str, until: Sequence[str]) -> str:
  """`text` up to the first stop string it contains."""
  ends = [text.find(u) for u in until if u and u in text]
  return text[:min(ends)] if ends else text


def decode_group(decode, prompts: Sequence[Sequence[int]], batch_size: int, counts,
                 warm: set, key) -> list[list[int]]:
  """The generated ids of each prompt (in order), decoded in batches of batch_size;
  `counts` (a metrics.Generated) gets the tokens, forwards and seconds. `warm` holds the
  shapes already decoded once (compiled): `key` plus the padded width names one."""
  from cardjax.decoding.prompts import padded_width

  order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
  out: list = [None] * len(prompts)
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    chunk = [prompts[i] for i in rows]
    chunk += [chunk[0]] * (batch_size - len(chunk))
    shape = (key, padded_width(chunk, decode.bucket))
    if shape not in warm:
      begin = time.perf_counter()
      decode(chunk)
      counts.warmup_seconds += time.perf_counter() - begin
      warm.add(shape)
    begin = time.perf_counter()
    got = decode(chunk)
    counts.seconds += time.perf_counter() - begin
    generated = got.rows()[:len(rows)]
    counts.forwards += got.forwards
    counts.row_forwards += int(got.row_forwards[:len(rows)].sum())
    counts.tokens += sum(len(g) for g in generated)
    for i, g in zip(rows, generated):
      out[i] = g
  counts.requests += len(prompts)
  return out


def options_for(base, max_new_tokens: int):
  return dataclasses.replace(base, max_new_tokens=max_new_tokens)
