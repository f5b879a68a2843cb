"""The Flax NNX decoder of the Qwen2 / Qwen2.5 / Llama family."""

from cardjax.model.config import ModelConfig
from cardjax.model.create import abstract_model, cast_params, create_model, param_count
from cardjax.model.decoder import Block, Decoder

__all__ = ["ModelConfig", "Decoder", "Block", "create_model", "abstract_model", "param_count",
           "cast_params"]
