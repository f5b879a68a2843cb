"""Which decoding method a checkpoint can serve, decided by the objective it was trained with.

A method only makes sense for the model family it was designed for: MARS windows need a
MARS-trained causal model, CARD blocks a CARD model, the DUS/EB/CB planners a masked
diffusion model (bidirectional MDLM, or CARD's causal blocks), and AR any causal model.
Checking this up front turns a silent quality collapse into one clear error.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

from cardjax.decoding.frozen import freeze
from cardjax.decoding.prompts import BUCKET
from cardjax.errors import CardjaxError

METHODS = ("ar", "mars", "card", "dus", "eb", "cb")

# objective -> methods it serves. None: a checkpoint without a training run (imported from
# Hugging Face), which is a causal LM whatever fine-tuning it had.
SERVES = {
    "ar": ("ar",),
    "mars": ("ar", "mars"),
    "card": ("ar", "card", "dus", "eb", "cb"),
    "mdlm": ("dus", "eb", "cb"),
    "bd3lm": (),
    None: ("ar", "mars", "card", "dus", "eb", "cb"),
}


def check_method(method: str, objective: str | None, where: str = "the checkpoint") -> None:
  """A CardjaxError naming the methods that fit, unless `objective` serves `method`."""
  if method not in METHODS:
    raise CardjaxError(f"unknown decoding method {method!r}; choose one of {METHODS}")
  if objective not in SERVES:
    raise CardjaxError(f"{where} was trained with objective {objective!r}, which cardjax "
                       f"cannot decode; known objectives: {sorted(k for k in SERVES if k)}")
  served = SERVES[objective]
  if method not in served:
    fits = ", ".join(served) if served else "none of cardjax's decoders yet"
    raise CardjaxError(f"{where} was trained with objective {objective!r}, which cannot "
                       f"serve --method {method}; methods that fit: {fits}")


def diffusion_family(objective: str | None) -> str:
  """'mdlm' for bidirectional masked diffusion checkpoints, else 'card' (causal blocks)."""
  return "mdlm" if objective == "mdlm" else "card"


@dataclasses.dataclass
class Options:
  """Every decoder knob in one place (the CLI flags, the benchmark's sweeps)."""
  max_new_tokens: int = 64
  stop_ids: Sequence[int] = ()
  pad_id: int = 0
  temperature: float = 0.0  # ar, mars (not verify): 0 = greedy
  top_p: float = 1.0  # ar, mars: nucleus of the sampling
  seed: int = 0  # ar, mars: sampling seed
  tau: float = 0.95  # mars acceptance (entropy_nats: nats), card / cb confidence threshold
  block: int = 4  # mars: training B (tokens drafted); card / dus / eb / cb: block length
  rule: str = "prob"  # mars acceptance: prob | entropy | margin | entropy_nats
  cache_block: int = 0  # mars: block-level KV cache of this many slots (0: window cache)
  verify: bool = False  # mars: self-verified, lossless
  window: str = "fit"  # mars window cache / verify: fit (pending-sized) | full (2B wide)
  accept: str = "block"  # mars block cache: accept up to B (block) | the cache block's end
  order: str = "confidence"  # card: fill order inside a block (confidence | dus)
  steps: int = 0  # card / dus / eb / cb: forwards per block before filling the rest (0: B)
  gamma: float = 1.0  # eb: entropy budget
  remask: float = 0.0  # dus: re-mask new tokens under this probability (0: off)
  spacing: bool = False  # eb / cb: the dilation spacing filter
  g0: int = 8  # spacing: gap = max(2, M_rem * g0 // B); 8 is the DUS code's, for B = 32
  base: int = 2  # dus: dilation base a
  shift: bool = False  # mdlm checkpoints: output q predicts q + 1 (Dream style)
  planner: str = ""  # card / dus / eb / cb: override the method's planner (e.g. "topk")
  bucket: int = BUCKET  # every method: prompts are left-padded to a multiple of this width


def make_decoder(method: str, model, objective: str | None, opt: Options) -> Callable:
  """decode(prompts) -> Generation for `method` on `model`, after check_method. The model
  is frozen (split once, see frozen.py): later updates to the module are not seen.
  `decode.bucket` is opt.bucket, the prompt width bucket (eval.measure.warm_up compiles
  one chunk per padded width)."""
  decode = _decoder(method, model, objective, opt)
  decode.bucket = opt.bucket
  return decode


def _decoder(method: str, model, objective: str | None, opt: Options) -> Callable:
  check_method(method, objective)
  model = freeze(model)
  mask_id = model.cfg.mask_token_id
  common = dict(max_new_tokens=opt.max_new_tokens, stop_ids=tuple(opt.stop_ids),
                pad_id=opt.pad_id, bucket=opt.bucket)
  if method == "ar":
    from cardjax.decoding import ar
    return functools.partial(ar.generate, model, temperature=opt.temperature,
                             top_p=opt.top_p, seed=opt.seed, **common)
  if method != "ar" and mask_id < 0:
    raise CardjaxError(f"--method {method} needs the model's [MASK] id, and this checkpoint "
                       "has none: set model.mask_token_id (import-hf --mask-token-id)")
  if method == "mars":
    from cardjax.decoding import mars, mars_block, mars_verify
    if opt.verify:
      if opt.temperature > 0:
        raise CardjaxError(f"--verify decodes exactly AR greedy and cannot sample "
                           f"(temperature={opt.temperature}): drop --verify to sample with "
                           "MARS, or set --temperature 0")
      return functools.partial(mars_verify.generate, model, block=opt.block, mask_id=mask_id,
                               window=opt.window, **common)
    sampling = dict(temperature=opt.temperature, top_p=opt.top_p, seed=opt.seed)
    if opt.cache_block:
      return functools.partial(mars_block.generate, model, block=opt.block,
                               cache_block=opt.cache_block, tau=opt.tau, mask_id=mask_id,
                               rule=opt.rule, accept=opt.accept, **sampling, **common)
    return functools.partial(mars.generate, model, block=opt.block, tau=opt.tau,
                             mask_id=mask_id, rule=opt.rule, window=opt.window, **sampling,
                             **common)
  planner = opt.planner or {"card": opt.order, "dus": "dus", "eb": "eb", "cb": "cb"}[method]
  knobs = dict(block=opt.block, planner=planner, tau=opt.tau, gamma=opt.gamma,
               remask=opt.remask, spacing=opt.spacing, base=opt.base, g0=opt.g0,
               steps=opt.steps or None, mask_id=mask_id, **common)
  if diffusion_family(objective) == "mdlm":
    from cardjax.decoding import mdlm
    return functools.partial(mdlm.generate, model, shift=opt.shift, **knobs)
  from cardjax.decoding import card
  return functools.partial(card.generate, model, **knobs)
