"""Shared test set-up: 8 host CPU devices, quiet transformers, random-init HF models.

The environment is set before anything imports jax, so every test sees 8 CPU devices
(single-device tests simply never build a mesh).
"""

from __future__ import annotations

import copy
import os
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# Cheaper compiles for the tests' programs (and the subprocesses they start): on a CPU,
# compiling is most of a test's time (78% of the slot pool's tests) and running its tiny
# shapes almost none. LLVM's optimisation passes off took a quarter off compile-bound tests,
# and XLA:CPU's older loop emitters for fusions (instead of its MLIR fusion emitters) a
# third more (2 Intel Xeon cores, 2026-12-07). HLO's passes (fusion, buffer assignment:
# what the memory tests read) are unchanged.
CHEAP_COMPILE_FLAGS = {"--xla_backend_optimization_level": "0",
                       "--xla_cpu_use_fusion_emitters": "false"}
for _name, _value in CHEAP_COMPILE_FLAGS.items():
  if _name not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" {_name}={_value}"
os.environ["JAX_PLATFORMS"] = "cpu"
# libtpu on the path before jax starts, for the compile-only TPU devices of `cardjax plan`
# (tests/test_plan.py); JAX_PLATFORMS keeps every other test on the CPU.
from cardjax.plan.targets import add_libtpu_path  # noqa: E402 (imports no jax)

add_libtpu_path()
# One persistent XLA compilation cache for every test and the subprocesses they start (the
# environment is inherited): the trainer tests compile the same tiny train steps again and
# again, and a hit skips the compile (five of them: 3 min 20 s -> 2 min 6 s from a cold
# cache). Entries are keyed by the program and the jax version, so a code change misses.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"cardjax-test-xla-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))  # LRU past 2 GiB
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Tolerances of the fp32 comparisons (logits are O(1..10) with the std-0.2 init below).
PARITY_ATOL = 1e-4


def _torch():
  import torch
  torch.set_num_threads(2)
  return torch


def reinit_(model, seed: int, std: float = 0.2):
  """Large random weights so the logits are O(1) and a 1e-4 tolerance means something:
  every weight and bias ~ N(0, std), every norm scale ~ 1 + N(0, std)."""
  torch = _torch()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=p.dtype) * std
      p.copy_(1.0 + noise if "norm" in name else noise)
  return model


def build_hf_model(family: str, seed: int = 0, **config):
  """A random-init transformers model (eager attention, fp32), re-initialised by reinit_."""
  torch = _torch()
  from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                            Qwen3Config, Qwen3ForCausalLM)

  classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
             "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
  config_cls, model_cls = classes[family]
  defaults = dict(vocab_size=160, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-6)
  defaults.update(copy.deepcopy(config))  # transformers edits rope dicts in place
  hf_config = config_cls(attn_implementation="eager", **defaults)
  torch.manual_seed(seed)
  model = model_cls(hf_config).to(torch.float32).eval()
  return reinit_(model, seed)


def torch_logits(model, tokens, position_ids=None) -> np.ndarray:
  """fp32 logits [batch, seq, vocab] of a transformers model for int tokens [batch, seq]."""
  torch = _torch()
  ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
  kwargs = {}
  if position_ids is not None:
    kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids), dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=ids, use_cache=False, **kwargs).logits.float().numpy()


def _jitted_call(model, tokens, positions, segment_ids, streams, mask):
  return model(tokens, positions=positions, segment_ids=segment_ids, streams=streams, mask=mask)


_JITTED = {}


def cardjax_logits(model, tokens, positions=None, segment_ids=None, streams=None, mask=None,
                   jit: bool = False) -> np.ndarray:
  """Logits of a cardjax Decoder as numpy; `jit` runs it under flax.nnx.jit (one compile
  per model structure and shape, much faster on CPU than eager op-by-op dispatch)."""
  import jax.numpy as jnp

  def as_int(a):
    return None if a is None else jnp.asarray(np.asarray(a), jnp.int32)

  args = (as_int(tokens), as_int(positions), as_int(segment_ids), as_int(streams))
  if not jit:
    return np.asarray(model(args[0], positions=args[1], segment_ids=args[2], streams=args[3],
                            mask=mask))
  if not _JITTED:
    from flax import nnx
    _JITTED["fn"] = nnx.jit(_jitted_call, static_argnames=("mask",))
  return np.asarray(_JITTED["fn"](model, *args, mask=mask))


def max_abs_diff(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert a.shape == b.shape, (a.shape, b.shape)
  return float(np.max(np.abs(a - b)))


def random_tokens(vocab_size: int, batch: int, seq: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, vocab_size, (batch, seq)).astype(np.int32)


@pytest.fixture(scope="session")
def hf_model_factory(tmp_path_factory):
  """make(family, seed=0, **hf_config) -> (folder, torch model); the folder holds what
  `save_pretrained` wrote (config.json, model.safetensors, generation_config.json).

  Built once per distinct (family, seed, config) in the session: treat both as read-only
  (copy the folder before editing its files).
  """
  cache: dict = {}

  def make(family: str = "qwen2", seed: int = 0, **config):
    key = (family, seed, repr(sorted(config.items())))
    if key not in cache:
      model = build_hf_model(family, seed, **config)
      path = tmp_path_factory.mktemp(f"hf_{family}")
      model.save_pretrained(str(path))
      cache[key] = (path, model)
    return cache[key]

  return make


@pytest.fixture(scope="session")
def num_devices():
  import jax
  n = jax.device_count()
  assert n == 8, f"conftest asks for 8 host CPU devices, jax sees {n} (jax imported too early?)"
  return n


def packed_batch(rows, length: int, seed: int = 0, vocab_high: int = 63):
  """A data-pipeline batch built by hand: rows is, per row, a list of documents
  (n_prompt, n_response); the rest of the row is padding (segment 0, position 0, no loss).
  Pretraining documents are (0, n). Token ids are drawn from [1, vocab_high)."""
  import jax.numpy as jnp

  rng = np.random.default_rng(seed)
  b = len(rows)
  out = {k: np.zeros((b, length), np.int32)
         for k in ("tokens", "positions", "segment_ids", "loss_mask")}
  out["tokens"][:] = rng.integers(1, vocab_high, (b, length))
  for r, docs in enumerate(rows):
    i = 0
    for s, (n_prompt, n_response) in enumerate(docs):
      n = n_prompt + n_response
      out["positions"][r, i:i + n] = np.arange(n)
      out["segment_ids"][r, i:i + n] = s + 1
      out["loss_mask"][r, i + n_prompt:i + n] = 1
      i += n
    assert i <= length
  return {k: jnp.asarray(v) for k, v in out.items()}
