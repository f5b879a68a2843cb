"""Training objectives: each turns a clean batch + rng into model inputs, and logits into a
loss with per-term metrics. See cardjax/objectives/base.py for the contract."""

from cardjax.objectives.ar import AR
from cardjax.objectives.base import ModelInputs, Objective
from cardjax.objectives.bd3lm import BD3LM
from cardjax.objectives.card import CARD
from cardjax.objectives.mars import MARS
from cardjax.objectives.mdlm import MDLM

OBJECTIVES = {"ar": AR, "card": CARD, "mars": MARS, "mdlm": MDLM, "bd3lm": BD3LM}


def make_objective(cfg, model_cfg) -> Objective:
  """The objective named by cfg.name (the config's `objective` section)."""
  from cardjax.errors import ConfigError

  if cfg.name not in OBJECTIVES:
    raise ConfigError(f"objective.name={cfg.name!r} is unknown; choose one of "
                      f"{sorted(OBJECTIVES)}")
  return OBJECTIVES[cfg.name](cfg, model_cfg)


__all__ = ["OBJECTIVES", "make_objective", "ModelInputs", "Objective", "AR", "CARD", "MARS",
           "MDLM", "BD3LM"]
