"""Rewards: the built-in ones on known completions, a user's function by name, and one
clear error for a reward that raises, returns NaN or cannot be found."""

import sys

import numpy as np
import pytest

from cardjax.errors import CardjaxError
from cardjax.rl.rewards import make_reward, score


def test_built_in_rewards():
  arith = make_reward("arith")
  assert arith("q", "3 + 4 = 7. The answer is 7.", "7") == 1.0
  assert arith("q", "The answer is 8.", "7") == 0.0
  jsonl = make_reward("jsonl")
  assert jsonl("q", "so 70 + 2 = 72\n#### 72", "... #### 72") == 1.0
  assert jsonl("q", "it costs $1,000.", "1000") == 1.0
  assert jsonl("q", "no number here", "5") == 0.0
  regex = make_reward(r"regex:answer: (\w+)")
  assert regex("q", "answer: Paris", "paris") == 1.0
  assert regex("q", "Paris", "paris") == 0.0
  np.testing.assert_array_equal(
      score(arith, ["a", "b"], ["The answer is 1.", "The answer is 3."], ["1", "2"]), [1, 0])


def test_a_users_function_by_name(tmp_path, monkeypatch):
  (tmp_path / "my_rewards.py").write_text(
      "def length_bonus(prompt, completion, answer):\n"
      "  return len(completion) / 10\n"
      "def broken(prompt, completion, answer):\n"
      "  raise KeyError('score')\n"
      "def nan(prompt, completion, answer):\n"
      "  return float('nan')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  sys.modules.pop("my_rewards", None)
  reward = make_reward("my_rewards:length_bonus")
  np.testing.assert_allclose(score(reward, ["p"], ["abcde"], ["x"]), [0.5])
  with pytest.raises(CardjaxError, match=r"broken raised KeyError.*on prompt 'what is 2\+2\?'"):
    score(make_reward("my_rewards:broken"), ["what is 2+2?"], ["4"], ["4"])
  with pytest.raises(CardjaxError, match="nan returned nan on prompt 'p'.*finite number"):
    score(make_reward("my_rewards:nan"), ["p"], ["c"], ["a"])


@pytest.mark.parametrize("spec,message", [
    ("nope", "MODULE:FUNCTION"), ("no_such_module_xyz:f", "cannot import"),
    ("json:no_such_function", "has no 'no_such_function'"), ("regex:(", "not a valid regular")])
def test_bad_reward_specs_are_one_clear_error(spec, message):
  with pytest.raises(CardjaxError, match=message):
    make_reward(spec)
