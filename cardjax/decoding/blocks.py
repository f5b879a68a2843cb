"""The shared front of the block decoders (CARD blocks, MDLM): check the request, left-pad
the prompts with room for whole blocks, and call the decoder's jitted loop."""

from __future__ import annotations

import numpy as np

from cardjax.decoding import planners
from cardjax.decoding.prompts import Generation, decode


def run(loop, model, prompts, max_new_tokens: int, block: int, planner: str, tau: float,
        gamma: float, remask: float, spacing: bool, base: int, g0: int, steps: int | None,
        mask_id: int | None, stop_ids, pad_id: int, bucket: int | None = None,
        **static) -> Generation:
  """loop(model, tokens, positions, segments, lengths, stop_ids, pad_id, mask_id, knobs,
  steps, planner=, max_new_tokens=, **static) -> (out, count, forwards), a DecodeLoop;
  model: an NNX module or a Frozen one. bucket: the prompt width bucket (default
  prompts.BUCKET)."""
  plan = planners.Planner(planner, block, base, spacing)
  knobs = planners.make_knobs(tau, gamma, remask, g0)
  steps = planners.check_steps(steps, block)
  if mask_id is None:
    mask_id = model.cfg.mask_token_id
  mask_id = planners.check_request(mask_id, model.cfg.vocab_size, max_new_tokens)
  generated = -(-max_new_tokens // block) * block
  return decode(loop, model, prompts, generated, stop_ids, pad_id, np.int32(mask_id), knobs,
                np.int32(steps), bucket=bucket, planner=plan, max_new_tokens=max_new_tokens,
                **static)
