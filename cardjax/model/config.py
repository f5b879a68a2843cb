"""The model's hyper-parameters: one frozen dataclass, built from a config section."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from cardjax.errors import ConfigError

MODEL_TYPES = ("qwen2", "llama", "qwen3")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ROPE_TYPES = ("default", "linear", "llama3")
# = cardjax.attention.select.IMPLEMENTATIONS (not imported: the config stays jax-free)
ATTENTION_IMPLS = ("auto", "xla", "splash", "pallas_gpu", "pallas_mgpu", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder of the Qwen2 / Qwen2.5 / Qwen3 / Llama family.

  `qkv_bias`/`o_bias` cover the families: Qwen2 has biases on q, k, v only; Llama's and
  Qwen3's `attention_bias` puts them on all four projections. `qk_norm` is Qwen3's RMSNorm
  of each q and k head (one [head_dim] weight each for q and k, shared by the heads).
  """

  model_type: str = "qwen2"
  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 192
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 0  # 0 = hidden_size // num_heads
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_type: str = "default"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  max_position_embeddings: int = 2048
  qkv_bias: bool = True
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False  # RMSNorm per q/k head before rope (Qwen3)
  tie_word_embeddings: bool = True
  bos_token_id: int = -1  # -1 = none
  eos_token_id: int = -1
  pad_token_id: int = -1
  mask_token_id: int = -1  # the [MASK] id used by the diffusion objectives
  dtype: str = "float32"  # compute dtype of activations
  param_dtype: str = "float32"  # storage dtype of parameters (the master weights)
  scan_layers: bool = False
  remat: str = "none"
  attention_impl: str = "xla"  # auto | xla | splash | pallas_gpu | cudnn (docs/attention.md)
  initializer_range: float = 0.02

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.hidden_size // self.num_heads

  def validate(self) -> "ModelConfig":
    def bad(key, why):
      raise ConfigError(f"model.{key}={getattr(self, key)!r}: {why}")

    if self.model_type not in MODEL_TYPES:
      bad("model_type", f"unsupported; cardjax implements {MODEL_TYPES}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "max_position_embeddings"):
      if int(getattr(self, key)) <= 0:
        bad(key, "must be a positive integer")
    if self.head_dim < 0:
      bad("head_dim", "must be >= 0 (0 means hidden_size // num_heads)")
    if not self.head_dim and self.hidden_size % self.num_heads:
      bad("hidden_size", f"is not divisible by num_heads={self.num_heads}; set model.head_dim")
    if self.resolved_head_dim % 2:
      bad("head_dim", "must be even for rotary embeddings")
    if self.model_type == "qwen3" and not self.qk_norm:
      bad("qk_norm", "model_type qwen3 normalises every q and k head (q_norm/k_norm); set "
          "model.qk_norm=true")
    if self.num_heads % self.num_kv_heads:
      bad("num_kv_heads", f"must divide num_heads={self.num_heads} (grouped-query attention)")
    if self.rms_norm_eps <= 0:
      bad("rms_norm_eps", "must be > 0")
    if self.rope_theta <= 0:
      bad("rope_theta", "must be > 0")
    if self.rope_type not in ROPE_TYPES:
      bad("rope_type", f"must be one of {ROPE_TYPES}")
    if self.dtype not in DTYPES:
      bad("dtype", f"must be one of {DTYPES}")
    if self.param_dtype not in DTYPES:
      bad("param_dtype", f"must be one of {DTYPES}")
    if self.remat not in REMAT_POLICIES:
      bad("remat", f"must be one of {REMAT_POLICIES}")
    if self.attention_impl not in ATTENTION_IMPLS:
      bad("attention_impl", f"must be one of {ATTENTION_IMPLS} (docs/attention.md: auto picks "
          "by backend and mask; xla runs everywhere)")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
      value = getattr(self, key)
      if value < -1 or value >= self.vocab_size:
        bad(key, f"must be -1 (none) or an id in [0, vocab_size={self.vocab_size})")
    return self

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ConfigError(f"unknown model config keys {unknown}; known keys: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
      default = known[name].default
      if isinstance(default, bool):
        if not isinstance(value, bool):
          raise ConfigError(f"model.{name}={value!r}: expected true/false")
      elif isinstance(default, int):
        if isinstance(value, bool) or int(value) != value:
          raise ConfigError(f"model.{name}={value!r}: expected an integer")
        value = int(value)
      elif isinstance(default, float):
        value = float(value)
      kwargs[name] = value
    return cls(**kwargs).validate()
