"""Generated arithmetic word problems: an SFT corpus whose answers can be graded exactly.

Each problem is a short story of 2-4 steps (+, -, x) over small numbers; the response works
the steps out and ends with "The answer is N." Generation is a pure function of (seed,
index), so a split is reproducible anywhere, and the test split is disjoint from train by
construction (no question text appears in both).
"""

from __future__ import annotations

import dataclasses
import random
import re

NAMES = ("Ava", "Ben", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Max", "Ana", "Tom")
ITEMS = ("apples", "books", "coins", "marbles", "pens", "shells", "stamps", "cards")
ANSWER = re.compile(r"The answer is (-?\d+)\.")
STEP = re.compile(r"(-?\d+) ([-+*]) (-?\d+) = (-?\d+)\.")


@dataclasses.dataclass(frozen=True)
class Level:
  """How a level's problems are drawn (the draws are made in the same order for every
  level, so the easy level's problems are those of before levels existed)."""
  key: str  # the random stream's name
  start: tuple[int, int]  # the first amount
  steps: tuple[int, int]
  add: tuple[int, int]  # what "gets N more" adds
  times: tuple[int, int]  # what a multiplication multiplies by
  mul_below: int  # multiply only amounts below this
  doubles: bool  # a multiplication's words: "double"/"triple", else "grow N times as many"

  def grows(self, item: str, n: int) -> str:
    if self.doubles:
      return f"Then the {item} {'double' if n == 2 else 'triple'}."
    return f"Then the {item} grow {n} times as many."


EASY = Level("arith", (2, 30), (2, 4), (1, 20), (2, 3), 60, doubles=True)
# For RL to have room: 4-6 steps over two-digit numbers, multiplying by 2 to 5.
HARD = Level("arith-hard", (10, 99), (4, 6), (10, 99), (2, 5), 200, doubles=False)


def problem(seed: int, index: int, level: Level = EASY) -> dict:
  """One problem: {'prompt', 'response', 'answer'} (answer is the final number as text)."""
  rng = random.Random(f"{level.key}:{seed}:{index}")
  name, item = rng.choice(NAMES), rng.choice(ITEMS)
  value = rng.randint(*level.start)
  story = [f"{name} has {value} {item}."]
  work = [f"{name} starts with {value} {item}."]
  for _ in range(rng.randint(*level.steps)):
    op = rng.choice(("add", "sub", "mul") if value < level.mul_below else ("add", "sub"))
    if op == "add":
      n = rng.randint(*level.add)
      story.append(f"Then {name} gets {n} more.")
      work.append(f"{value} + {n} = {value + n}.")
      value += n
    elif op == "sub" and value > 1:
      n = rng.randint(1, value - 1)
      story.append(f"Then {name} gives away {n}.")
      work.append(f"{value} - {n} = {value - n}.")
      value -= n
    else:
      n = rng.randint(*level.times)
      story.append(level.grows(item, n))
      work.append(f"{value} * {n} = {value * n}.")
      value *= n
  question = " ".join(story) + f" How many {item} does {name} have now?"
  response = " ".join(work) + f" The answer is {value}."
  return {"prompt": question, "response": response, "answer": str(value)}


LEVELS = {"easy": EASY, "hard": HARD}


def split(seed: int, size: int, exclude: set[str] | None = None, offset: int = 0,
          level: str = "easy") -> list[dict]:
  """`size` distinct problems of `level` (a name in LEVELS); questions in `exclude`
  (another split's) are skipped."""
  drawn = LEVELS[level]
  seen = set(exclude or ())
  out, index = [], offset
  while len(out) < size:
    p = problem(seed, index, drawn)
    index += 1
    if p["prompt"] not in seen:
      seen.add(p["prompt"])
      out.append(p)
    if index - offset > 50 * size + 1000:
      raise ValueError(f"could not draw {size} distinct problems; lower the size")
  return out


def grade(generated: str, answer: str) -> bool:
  """Exact match of the final number ("The answer is N.") against the reference."""
  found = ANSWER.findall(generated)
  return bool(found) and found[-1] == answer


def step_accuracy(generated: str) -> tuple[int, int]:
  """(correct, written) worked steps "a op b = c." in a response: the arithmetic alone.
  Exact match also needs the right operands from the story and every step present, which
  this does not check, so it tells arithmetic errors apart from reading errors."""
  ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  steps = STEP.findall(generated)
  return sum(ops[op](int(a), int(b)) == int(c) for a, op, b, c in steps), len(steps)
