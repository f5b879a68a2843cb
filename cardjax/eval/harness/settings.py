"""lm-eval's model_args (`checkpoint=RUN,method=mars,tau=0.9,verify=true,...`) as the
settings of `cardjax generate`: the same keys as its flags (--cache-block is
`cache_block`), the same defaults and one parser (decoding/cli.py), so a harness run and a
`cardjax generate` run with the same settings decode the same tokens.
"""

from __future__ import annotations

import argparse
import dataclasses

from cardjax.errors import CardjaxError

# model_args that are the LM's own, not decoding flags (value: default).
OWN = {"checkpoint": "", "tokenizer": "", "batch_size": 8, "max_length": 0,
       "max_gen_toks": 256, "elbo_draws": 32}
# What lm-eval passes to every model whatever the user wrote (simple_evaluate's
# additional_config); None values are dropped by lm-eval before they reach us.
IGNORED = ("max_batch_size", "device")


@dataclasses.dataclass
class Settings:
  checkpoint: str
  tokenizer: str
  batch_size: int
  max_length: int  # 0: the model's context (max_position_embeddings)
  max_gen_toks: int  # when a request names none (lm-eval's default, 256)
  elbo_draws: int  # MDLM / BD3LM: Monte Carlo mask draws per scored request (elbo.py)
  decoding: argparse.Namespace  # add_decoding_arguments' flags, parsed


def decoding_parser() -> argparse.ArgumentParser:
  from cardjax.decoding.cli import add_decoding_arguments
  p = argparse.ArgumentParser(add_help=False)
  add_decoding_arguments(p)
  return p


def parse(model_args: dict) -> Settings:
  """Settings of lm-eval's model_args (already split into a dict); one CardjaxError per
  unknown key or mistyped value, naming the keys that exist."""
  args = dict(model_args)
  for key in IGNORED:
    args.pop(key, None)
  decoding = decoding_parser().parse_args([])
  known = sorted(set(OWN) | set(vars(decoding)))
  own = dict(OWN)
  for key, value in args.items():
    if key in OWN:
      own[key] = _typed(key, value, OWN[key])
    elif key in vars(decoding):
      setattr(decoding, key, _typed(key, value, getattr(decoding, key)))
    else:
      raise CardjaxError(f"unknown cardjax model argument {key!r}; known: {', '.join(known)}")
  if own["batch_size"] == "auto":
    own["batch_size"] = OWN["batch_size"]
  if not own["checkpoint"]:
    raise CardjaxError("the cardjax model needs checkpoint=RUN (a run folder or its "
                       "checkpoints/), e.g. --model_args checkpoint=runs/mars,method=mars")
  if min(own["batch_size"], own["max_gen_toks"], own["elbo_draws"]) < 1 or \
     own["max_length"] < 0:
    raise CardjaxError(f"batch_size={own['batch_size']}, max_gen_toks={own['max_gen_toks']} "
                       f"and elbo_draws={own['elbo_draws']} must be >= 1, max_length >= 0")
  return Settings(decoding=decoding, **own)


def _typed(key: str, value, default):
  """`value` (a string from the command line, or already typed by lm-eval) as the type of
  the flag's default."""
  if key == "batch_size" and str(value).startswith("auto"):
    return "auto"  # lm-eval's batch-size search ("auto", "auto:N"): cardjax's default
  kind = type(default)
  if kind is bool:
    if isinstance(value, bool):
      return value
    if str(value).lower() in ("true", "1", "yes"):
      return True
    if str(value).lower() in ("false", "0", "no"):
      return False
  else:
    try:
      return kind(value)
    except (TypeError, ValueError):
      pass
  raise CardjaxError(f"model argument {key}={value!r} must be a {kind.__name__}")
