"""arith_sft: generated arithmetic word problems (cardjax.data.arith) as an SFT dataset.

Splits "train" and "test"; features {"messages": JSON [user prompt, assistant response],
"answer": the final number}. The test split is drawn first, from its own index range
(TEST_OFFSET), and train excludes its questions: so the test set depends only on
(seed, test_size) and stays comparable across train sizes, and no question is in both.
"""

from __future__ import annotations

import dataclasses
import json


from cardjax.data import arith
from cardjax.data.builders.common import LOG, ConversationBuilder, OptionsConfig
from cardjax.errors import CardjaxError, ConfigError

TEST_OFFSET = 1_000_000_000  # far past any train index, so the two draws never overlap


@dataclasses.dataclass(eq=False)
class ArithSftConfig(OptionsConfig):
  train_size: int = 20000
  test_size: int = 500
  seed: int = 0
  level: str = "easy"  # easy | hard (cardjax.data.arith.LEVELS: 4-6 steps, larger numbers)

  def label(self) -> str:
    label = f"train{self.train_size}_test{self.test_size}_seed{self.seed}".replace("-", "m")
    return label if self.level == "easy" else f"{label}_{self.level}"

  def identity(self) -> dict:
    # The easy level is what every build had before levels existed: its builds keep their
    # names (and their folders) by leaving the option out of the hash.
    identity = super().identity()
    if identity["level"] == "easy":
      del identity["level"]
    return identity

  def validate(self) -> None:
    if self.train_size < 1 or self.test_size < 1:
      raise ConfigError(
          f"train_size and test_size must be >= 1, got {self.train_size} and {self.test_size}")
    if self.level not in arith.LEVELS:
      raise ConfigError(f"level must be one of {', '.join(arith.LEVELS)}, got {self.level!r}")


def messages(p: dict) -> str:
  return json.dumps([{"role": "user", "content": p["prompt"]},
                     {"role": "assistant", "content": p["response"]}])


class ArithSft(ConversationBuilder):
  """Generated arithmetic word problems ({"messages": JSON, "answer"})."""

  CONFIG_CLS = ArithSftConfig

  def _split_generators(self, dl_manager):
    del dl_manager
    cfg = self.builder_config
    try:
      test = arith.split(cfg.seed, cfg.test_size, offset=TEST_OFFSET, level=cfg.level)
      train = arith.split(cfg.seed, cfg.train_size, exclude={p["prompt"] for p in test},
                          level=cfg.level)
    except ValueError as e:  # arith cannot draw that many distinct problems
      raise CardjaxError(f"dataset arith_sft: {e}") from None
    LOG.info("arith_sft: %d train, %d test %s problems (seed %d)", len(train), len(test),
             cfg.level, cfg.seed)
    return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

  def _generate_examples(self, problems):
    for i, p in enumerate(problems):
      yield i, {"messages": messages(p), "answer": p["answer"]}
