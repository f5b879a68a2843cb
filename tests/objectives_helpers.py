"""Shared pieces of the objective tests: a cached objective factory, hand-built batches,
jitted corrupt + loss, and a small model for the forward-equivalence checks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from conftest import packed_batch
from cardjax.config import base_config
from cardjax.model import ModelConfig, create_model
from cardjax.objectives import make_objective

V, MASK = 64, 63
MODEL_CFG = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, mask_token_id=MASK)


def objective(name, **fields):
  """The objective for base_config().objective with these fields set (one instance per
  setting, so its jitted functions compile once per shape across the tests)."""
  return _objective(name, tuple(sorted(fields.items())))


@functools.lru_cache(maxsize=None)
def _objective(name, fields):
  cfg = base_config().objective
  cfg.name = name
  for key, value in fields:
    cfg[key] = value
  return make_objective(cfg, MODEL_CFG)


def make_batch(rows, length, seed=0):
  """See conftest.packed_batch; token ids never equal the [MASK] id."""
  return packed_batch(rows, length, seed, vocab_high=MASK)


def np_batch(batch):
  return {k: np.asarray(v) for k, v in batch.items()}


@functools.lru_cache(maxsize=None)
def jitted(obj):
  return jax.jit(obj.corrupt), jax.jit(obj.loss)


def run(obj, batch, seed):
  corrupt, _ = jitted(obj)
  return corrupt(batch, jax.random.key(seed))


def random_logits(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(0, 2, shape + (V,)), jnp.float32)


# Rows shared by the CARD tests: full rows, rows padded at the end, packed rows.
PRETRAIN_ROWS = [[(0, 32)], [(0, 32)], [(0, 20)], [(0, 7)], [(0, 12), (0, 20)],
                 [(0, 9), (0, 11)], [(0, 1)], []]



@functools.lru_cache(maxsize=None)
def small_model():
  return create_model(MODEL_CFG, seed=0)


@functools.partial(nnx.jit, static_argnames=("mask",))
def _forward(model, tokens, positions, segment_ids, streams, mask):
  return model(tokens, positions=positions, segment_ids=segment_ids, streams=streams, mask=mask)


def forward(model, tokens, positions, segment_ids, streams, mask):
  args = (jnp.asarray(np.asarray(a), jnp.int32)
          for a in (tokens, positions, segment_ids, streams))
  return np.asarray(_forward(model, *args, mask=mask))

