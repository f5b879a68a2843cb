"""The hard arithmetic level: each worked step and the answer are right, problems have 4-6
steps over larger numbers, train and test are disjoint, and the easy level is unchanged."""

import hashlib
import json

from cardjax.data import arith


def test_hard_problems_are_worked_correctly_and_harder():
  problems = arith.split(0, 200, level="hard")
  for p in problems:
    steps = arith.STEP.findall(p["response"])
    assert 4 <= len(steps) <= 6
    for a, op, b, result in steps:
      assert eval(f"{a} {op} {b}") == int(result)  # noqa: S307 (digits and an operator)
    assert steps[-1][3] == p["answer"] and arith.grade(p["response"], p["answer"])
  easy = arith.split(0, 200)
  mean = lambda ps: sum(len(arith.STEP.findall(p["response"])) for p in ps) / len(ps)
  assert mean(problems) > mean(easy) + 1.5


def test_hard_test_and_train_are_disjoint():
  test = arith.split(1, 100, offset=1_000_000, level="hard")
  train = arith.split(1, 500, exclude={p["prompt"] for p in test}, level="hard")
  assert not {p["prompt"] for p in test} & {p["prompt"] for p in train}


def test_the_easy_level_is_unchanged():
  # The digest of split(0, 50) before the hard level existed: the SFT data, the kept models'
  # test sets and every figure measured on them stay as they were.
  digest = hashlib.sha256(json.dumps(arith.split(0, 50)).encode()).hexdigest()[:16]
  assert digest == "65925bde2fef0d7c"
