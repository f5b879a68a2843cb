"""Rewards of RL rollouts: each a function (prompt, completion, answer) -> float.

  arith            1 when the completion's last "The answer is N." gives the answer
                   (cardjax.data.arith.grade), else 0
  jsonl            1 when the GSM8K-style extracted answer equals the reference, compared
                   as `cardjax eval --task jsonl --normalize` compares them
                   (cardjax.eval.answers), else 0
  regex:PATTERN    1 when PATTERN's last match (group 1 if it has groups) equals the answer,
                   normalised the same way, else 0
  MODULE:FUNCTION  a user's callable, imported by name, called as FUNCTION(prompt,
                   completion, answer) and returning a number

A reward that raises or returns something that is not a finite number stops the run with
one error that names the function and the prompt (`score`).
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import numpy as np

from cardjax.errors import CardjaxError

Reward = Callable[[str, str, str], float]
BUILT_IN = ("arith", "jsonl", "regex:PATTERN")


def _arith(prompt: str, completion: str, answer: str) -> float:
  from cardjax.data.arith import grade
  return float(grade(completion, answer))


def _jsonl(prompt: str, completion: str, answer: str) -> float:
  from cardjax.eval.answers import correct
  return float(correct(completion, answer, normalise=True)[0])


def _regex(pattern: str) -> Reward:
  from cardjax.eval.answers import compile_pattern, correct
  compiled = compile_pattern(pattern)

  def reward(prompt: str, completion: str, answer: str) -> float:
    return float(correct(completion, answer, compiled, normalise=True)[0])
  reward.__name__ = f"regex:{pattern}"
  return reward


def make_reward(spec: str) -> Reward:
  """The reward `spec` names (see the module docstring), or one clear error."""
  spec = spec.strip()
  if spec == "arith":
    return _arith
  if spec == "jsonl":
    return _jsonl
  if spec.startswith("regex:"):
    return _regex(spec[len("regex:"):])
  module, _, name = spec.rpartition(":")
  if not module or not name:
    raise CardjaxError(f"rl.reward={spec!r}: use one of {', '.join(BUILT_IN)} or a "
                       "function of yours as MODULE:FUNCTION (e.g. my_rewards:score)")
  try:
    found = getattr(importlib.import_module(module), name)
  except ImportError as e:
    raise CardjaxError(f"rl.reward={spec!r}: cannot import {module!r} ({e}); put its folder "
                       "on PYTHONPATH") from None
  except AttributeError:
    raise CardjaxError(f"rl.reward={spec!r}: module {module!r} has no {name!r}") from None
  if not callable(found):
    raise CardjaxError(f"rl.reward={spec!r}: {module}.{name} is not a function")
  return found


def score(reward: Reward, prompts: list[str], completions: list[str],
          answers: list[str]) -> np.ndarray:
  """[len(completions)] float32 rewards; prompts and answers are per completion."""
  name = getattr(reward, "__qualname__", getattr(reward, "__name__", repr(reward)))
  out = np.empty(len(completions), np.float32)
  for i, (prompt, completion, answer) in enumerate(zip(prompts, completions, answers)):
    shown = prompt if len(prompt) <= 120 else prompt[:117] + "..."
    try:
      value = reward(prompt, completion, answer)
    except Exception as e:
      raise CardjaxError(f"the reward {name} raised {type(e).__name__}: {e} on prompt "
                         f"{shown!r}; fix the function (it is called as f(prompt, "
                         "completion, answer))") from e
    try:
      value = float(value)
    except (TypeError, ValueError):
      value = math.nan
    if not math.isfinite(value):
      raise CardjaxError(f"the reward {name} returned {value!r} on prompt {shown!r}; a reward "
                         "must be a finite number")
    out[i] = value
  return out
