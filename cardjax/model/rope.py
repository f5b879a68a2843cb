"""Rotary position embeddings, with the Llama-3 and linear frequency scalings."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from cardjax.model.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
  """The per-pair rotation frequencies [head_dim // 2], computed in float64 numpy."""
  dim = cfg.resolved_head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  if cfg.rope_type == "linear":
    return inv / cfg.rope_factor
  if cfg.rope_type == "llama3":
    # Low frequencies (long wavelengths) are slowed by `factor`, high ones kept, and the band
    # between interpolated smoothly (Llama 3.1's long-context recipe).
    old = cfg.rope_original_max_position
    low_wavelen = old / cfg.rope_low_freq_factor
    high_wavelen = old / cfg.rope_high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / cfg.rope_factor, inv)
    smooth = (old / wavelen - cfg.rope_low_freq_factor) / (
        cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)
  return inv


def apply_rope(x, positions, inv_freq):
  """Rotate x [batch, len, heads, head_dim] by positions [batch, len] (half-split layout)."""
  angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
