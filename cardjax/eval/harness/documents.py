"""The documents of the shipped tasks (tasks/*.yaml name these as `custom_dataset`), made
on this machine: no hub, no download, no path relative to the working directory.

- arith_sft: the arith_sft dataset's test split as its default build draws and stores it
  (cardjax/data/builders/arith_sft.py: seed 0, 500 problems from TEST_OFFSET, in the
  build's order), and the first FEWSHOT problems of its train split for --num-fewshot.
  Problems are a pure function of (seed, index) (cardjax/data/arith.py) and tfds orders a
  split by its keys' hashes, so these are exactly the built dataset's, without a build.
- arith_mc: tasks/arith_mc.jsonl, shipped beside the YAML (write_arith_mc made it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TASKS = Path(__file__).parent / "tasks"
FEWSHOT = 100


def _doc(p: dict) -> dict:
  return {"question": p["prompt"], "response": p["response"], "answer": p["answer"]}


def arith_sft(**metadata):
  """{'test': the 500 test problems, 'train': the first FEWSHOT train problems}, each
  {'question', 'response' (worked, ends "The answer is N."), 'answer' (N)}. `metadata`
  (lm-eval passes the task's metadata and dataset_kwargs) may set `seed` and `test_size`
  of the build to match a run trained on another one."""
  import datasets

  from cardjax.data import arith
  from cardjax.data.builders.arith_sft import TEST_OFFSET, ArithSftConfig

  defaults = ArithSftConfig()
  seed = int(metadata.get("seed", defaults.seed))
  test = arith.split(seed, int(metadata.get("test_size", defaults.test_size)),
                     offset=TEST_OFFSET)
  train = arith.split(seed, FEWSHOT, exclude={p["prompt"] for p in test})
  return datasets.DatasetDict({
      "test": datasets.Dataset.from_list([_doc(p) for p in built_order(test, "test")]),
      "train": datasets.Dataset.from_list([_doc(p) for p in train])})


def built_order(examples: list, split: str) -> list:
  """`examples` (yielded with keys 0, 1, ...) in the order a tfds build of `split` stores
  them: tfds writes a split sorted by a salted hash of each example's key (the salt is the
  split's name), so `cardjax eval --task arith`'s first N problems, read from the build, are
  these first N."""
  from tensorflow_datasets.core import hashing

  hasher = hashing.Hasher(split)
  return [examples[i] for i in sorted(range(len(examples)), key=hasher.hash_key)]


def arith_mc(**metadata):
  """{'test': tasks/arith_mc.jsonl}: {'question', 'choices', 'gold'} a line."""
  import datasets

  del metadata
  lines = (TASKS / "arith_mc.jsonl").read_text().splitlines()
  return datasets.DatasetDict({"test": datasets.Dataset.from_list(
      [json.loads(line) for line in lines if line.strip()])})


def write_arith_mc(path: Path, n: int = 40, seed: int = 1) -> Path:
  """arith_mc.jsonl: n arith problems (their own seed, not arith_sft's test or train),
  each with its answer and three wrong ones near it, in a seeded order."""
  from cardjax.data import arith

  rng = random.Random(f"arith_mc:{seed}")
  out = []
  for p in arith.split(seed, n):
    right = int(p["answer"])
    wrong = set()
    while len(wrong) < 3:
      w = right + rng.choice((-1, 1)) * rng.randint(1, 10)
      if w != right and w >= 0:
        wrong.add(w)
    choices = [str(c) for c in [right, *sorted(wrong)]]
    rng.shuffle(choices)
    out.append({"question": p["prompt"], "choices": [" " + c for c in choices],
                "gold": choices.index(str(right))})
  path.write_text("".join(json.dumps(d) + "\n" for d in out))
  return path
