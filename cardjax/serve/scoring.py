"""Log-probabilities of token sequences under the served model, in AR order: what
`logprobs` and `echo` on /v1/completions report.

One causal forward over the whole sequence (no KV cache), log_softmax in float32, the
log-probability of each token given the tokens before it and the TOP best alternatives
at each position. Generated tokens are scored the same way after decoding, over prompt +
completion, whatever method produced them: a MARS or CARD completion reports the model's
AR-order probabilities of the tokens it wrote, not the decoder's draft confidences.

Rows are padded on the right (a causal forward: no real token sees the padding) to a
multiple of the server's width bucket and the batch to a compiled batch size, so one
program compiles per (rows, width), whatever `logprobs` a request asks for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from typing import Sequence

import numpy as np

# OpenAI's legacy limit on `logprobs` (top alternatives per position); the forward always
# returns this many, so no request compiles its own program.
TOP = 5


@dataclasses.dataclass
class Scores:
  """One sequence's AR-order scores; entry i is about token i given tokens 0..i-1, so
  entry 0 (no context) is None in every list."""
  logprobs: list  # [n]: float | None
  top_ids: list  # [n]: list of TOP ids, best first | None
  top_logprobs: list  # [n]: list of TOP floats | None


def _score_fn(graphdef, state, tokens):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  logits = nnx.merge(graphdef, state)(tokens)[:, :-1]
  # float32 whatever the compute dtype: what a client sums over hundreds of tokens.
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  chosen = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  top_values, top_ids = jax.lax.top_k(logp, TOP)
  return chosen, top_values, top_ids


@functools.cache
def _loop():
  """The scoring program as a DecodeLoop, so the engine's Frozen model compiles it once
  with its graphdef closed over (decoding/frozen.py)."""
  from cardjax.decoding.frozen import DecodeLoop
  return DecodeLoop(_score_fn, ())


def width(n: int, bucket: int, context: int) -> int:
  """The compiled width for an n-token sequence: n rounded up to the bucket, but not past
  the model's context when n fits in it (positions past it mean nothing to the model)."""
  return min(-(-n // bucket) * bucket, max(n, context))


def score(engine, sequences: Sequence[Sequence[int]]) -> list[Scores]:
  """AR-order scores of each sequence under `engine.model` (module docstring). Runs on
  any thread: the parameters are read only, never donated."""
  import jax

  out: list[Scores] = []
  most = max(engine.batch_sizes)
  for start in range(0, len(sequences), most):
    group = [list(s) for s in sequences[start:start + most]]
    w = width(max(len(s) for s in group), engine.width_bucket,
              engine.cfg.max_position_embeddings)
    tokens = np.full((engine.batch_size(len(group)), w), engine.tokenizer.pad_id, np.int32)
    for r, s in enumerate(group):
      tokens[r, :len(s)] = s
    mesh = engine.mesh
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
      chosen, values, ids = engine.model.compiled(_loop())(tokens)
    chosen, values, ids = np.asarray(chosen), np.asarray(values), np.asarray(ids)
    for r, s in enumerate(group):
      n = len(s) - 1  # scored positions: tokens 1..len-1
      out.append(Scores([None] + chosen[r, :n].tolist(),
                        [None] + ids[r, :n].tolist(),
                        [None] + values[r, :n].tolist()))
  return out


def echo_done(prompt: Sequence[int], settings) -> dict:
  """The done event of a prompt scored without decoding (`max_tokens: 0` with `echo`)."""
  return {"type": "done", "finish_reason": "length", "text": "", "prompt_tokens": len(prompt),
          "completion_tokens": 0, "cardjax": {"method": settings.method, "forwards": 0,
                                              "tokens_per_forward": 0.0, "chunks": 0}}


def annotate(engine, parsed, completions: Sequence[Sequence[int]], dones: list[dict]) -> list:
  """`dones` with OpenAI's legacy `logprobs` object (None unless asked for) and, with
  echo, the prompt's text before the completion's. `completions`: each choice's generated
  ids. Blocking (one forward per batch of choices): run it off the event loop."""
  tok = engine.tokenizer
  kept = [_covering(tok, list(c), d["text"]) for c, d in zip(completions, dones)]
  scores = [None] * len(kept)  # echo alone needs no forward
  if parsed.logprobs is not None:
    scores = score(engine, [list(p) + c for p, c in zip(parsed.prompts, kept)])
  out = []
  for i, (done, gen, s) in enumerate(zip(dones, kept, scores)):
    prompt = parsed.prompts[i]
    source = parsed.sources[i] if i < len(parsed.sources) else prompt
    prompt_text = source if isinstance(source, str) else tok.decode(prompt)
    done = dict(done)
    first = 0 if parsed.echo else len(prompt)
    if parsed.echo:
      done["text"] = prompt_text + done["text"]
    done["logprobs"] = None if parsed.logprobs is None else _legacy(
        tok, list(prompt) + gen, s, first, parsed.logprobs, len(prompt), len(prompt_text))
    out.append(done)
  return out


def _covering(tok, tokens: list[int], text: str) -> list[int]:
  """The generated tokens the answer's text shows: all of them (a final stop token
  included), or, when a stop string cut the text, those up to the one reaching the cut."""
  if tok.decode(tokens, skip_special=True) == text:
    return tokens
  for n in range(len(tokens) + 1):
    if len(tok.decode(tokens[:n], skip_special=True)) >= len(text):
      return tokens[:n]
  return tokens


def _legacy(tok, seq: list[int], s: Scores, first: int, top: int, prompt_len: int,
            prompt_chars: int) -> dict:
  """OpenAI's legacy completions `logprobs` for positions first.. of `seq` (the first
  prompt_len are the prompt's). text_offset counts characters from the prompt's start,
  echoed or not, as OpenAI's does."""
  offsets = (_offsets(tok, seq[:prompt_len], 0) +
             _offsets(tok, seq[prompt_len:], prompt_chars))[first:]
  tops = []
  for i in range(first, len(seq)):
    alternatives = None
    if s.top_ids[i] is not None:
      alternatives = {}
      for t, v in zip(s.top_ids[i][:top], s.top_logprobs[i][:top]):
        alternatives.setdefault(token_string(tok, t), v)  # best first; alike: the likelier
    tops.append(alternatives)
  return {"tokens": [token_string(tok, t) for t in seq[first:]],
          "token_logprobs": s.logprobs[first:], "top_logprobs": tops, "text_offset": offsets}


def _offsets(tok, ids: list[int], start: int) -> list[int]:
  """start + len(decode(ids[:i])) for each i, decoding only since the last token that
  ended a whole character (a character's bytes may be split over tokens)."""
  out, anchor = [], 0
  for i in range(len(ids)):
    out.append(start + len(tok.decode(ids[anchor:i])))
    piece = tok.decode(ids[anchor:i + 1])
    if not piece.endswith("\ufffd"):
      start, anchor = start + len(piece), i + 1
  return out


def token_string(tok, t: int) -> str:
  """A token as OpenAI's legacy logprobs print it: its text, or "bytes:\\xNN..." for a
  piece of a UTF-8 character (those would all print as U+FFFD and collide)."""
  text = tok.decode([t])
  if "\ufffd" not in text:
    return text
  raw = _token_bytes(tok, t)
  if raw is None:
    return text
  try:
    raw.decode("utf-8")
    return text  # whole characters: a real U+FFFD among them
  except UnicodeDecodeError:
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _token_bytes(tok, t: int) -> bytes | None:
  """A token's bytes: byte-level BPE (GPT-2's byte alphabet) or a SentencePiece byte
  fallback (<0xNN>); None for anything else."""
  from tokenizers import decoders

  piece = tok.tok.id_to_token(int(t)) or ""
  fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
  if fallback:
    return bytes([int(fallback.group(1), 16)])
  alphabet = _byte_alphabet()
  if isinstance(tok.tok.decoder, decoders.ByteLevel) and all(c in alphabet for c in piece):
    return bytes(alphabet[c] for c in piece)
  return None


@functools.cache
def _byte_alphabet() -> dict[str, int]:
  """GPT-2's bytes_to_unicode, inverted: the printable character standing for each byte."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
               *range(ord("\xae"), ord("\xff") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars
