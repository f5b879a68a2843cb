"""train.lora as a value: which projections carry adapters, their rank, scale and dropout.

jax-free, like cardjax/model/config.py, so the config checks can read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from cardjax.errors import ConfigError

# The projections an adapter may sit on: attention q, k, v, o and the SwiGLU MLP's three.
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """train.lora as the model reads it. alpha 0 means alpha = rank (scale 1)."""

  rank: int
  alpha: float = 0.0
  targets: tuple[str, ...] = TARGETS
  dropout: float = 0.0

  @property
  def scale(self) -> float:
    return (self.alpha or self.rank) / self.rank

  def to_dict(self) -> dict[str, Any]:
    return dict(rank=self.rank, alpha=self.alpha, targets=list(self.targets),
                dropout=self.dropout)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "LoraSpec":
    return cls(rank=int(values["rank"]), alpha=float(values["alpha"]),
               targets=tuple(values["targets"]), dropout=float(values["dropout"]))


def parse_targets(value) -> tuple[str, ...]:
  """train.lora.targets as a tuple: "q,v", ("q", "v"), or "all" (every projection)."""
  if isinstance(value, str):
    names = TARGETS if value.strip() == "all" else [t.strip() for t in value.split(",")]
  else:
    names = [str(t) for t in value]
  names = tuple(t for t in names if t)
  unknown = sorted(set(names) - set(TARGETS))
  if unknown or not names:
    raise ConfigError(f"config train.lora.targets={value!r}: name projections from "
                      f"{', '.join(TARGETS)} (comma separated) or 'all'")
  return tuple(t for t in TARGETS if t in names)  # one order, whatever the config's


def spec_from_config(lora) -> LoraSpec | None:
  """The LoraSpec of a config's train.lora section; None when rank is 0 (full weights)."""
  if lora.rank < 0:
    raise ConfigError(f"config train.lora.rank={lora.rank} must be >= 0 (0 = no LoRA: "
                      "train every weight)")
  if not lora.rank:
    return None
  if lora.alpha < 0:
    raise ConfigError(f"config train.lora.alpha={lora.alpha} must be >= 0 (0 = rank)")
  if not 0.0 <= lora.dropout < 1.0:
    raise ConfigError(f"config train.lora.dropout={lora.dropout} must lie in [0, 1)")
  return LoraSpec(int(lora.rank), float(lora.alpha), parse_targets(lora.targets),
                  float(lora.dropout))
