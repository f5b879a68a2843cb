"""Multi-head attention with grouped kv heads, rotary positions, optional biases and
optional per-head q/k RMSNorm (Qwen3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax import attention as attn_lib
from cardjax.attention import select
from cardjax.model import lora as lora_lib
from cardjax.model.cache import write_slots
from cardjax.model.config import ModelConfig
from cardjax.model.layers import param, rms_norm
from cardjax.model.rope import inverse_frequencies, rope_factors, rotate
from cardjax.parallel.sharding import constrain


class Attention(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: lora_lib.LoraSpec | None = None):
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    pd, s = jnp.dtype(cfg.param_dtype), cfg.initializer_range
    self.dtype = jnp.dtype(cfg.dtype)
    self.impl = cfg.attention_impl
    self.inv_freq = tuple(float(f) for f in inverse_frequencies(cfg))
    # Rotary tables cover twice the context: a decoder's windows and padding may reach a
    # little past it, and nothing costs more than the coarse table's extra rows.
    self.rope_limit = 2 * cfg.max_position_embeddings
    self.q = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), pd, scale=s)
    self.k = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd, scale=s)
    self.v = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd, scale=s)
    self.o = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), pd, scale=s)
    self.qk_norm, self.eps = cfg.qk_norm, cfg.rms_norm_eps
    if cfg.qk_norm:  # Qwen3: one [head_dim] scale each for q and k, shared by every head
      self.q_norm = param(rngs, (hd,), ("head_dim",), pd, "ones")
      self.k_norm = param(rngs, (hd,), ("head_dim",), pd, "ones")
    self.qkv_bias, self.o_bias = cfg.qkv_bias, cfg.o_bias
    if cfg.qkv_bias:
      self.q_bias = param(rngs, (h, hd), ("heads", "head_dim"), pd, "zeros")
      self.k_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, "zeros")
      self.v_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, "zeros")
    if cfg.o_bias:
      self.out_bias = param(rngs, (d,), ("embed",), pd, "zeros")
    self.q_lora = lora_lib.adapter(lora, "q", d, h * hd, cfg, rngs, in_axis="embed")
    self.k_lora = lora_lib.adapter(lora, "k", d, kv * hd, cfg, rngs, in_axis="embed")
    self.v_lora = lora_lib.adapter(lora, "v", d, kv * hd, cfg, rngs, in_axis="embed")
    self.o_lora = lora_lib.adapter(lora, "o", h * hd, d, cfg, rngs, out_axis="embed")

  def project(self, x, meta, drop_keys=None):
    """q, k, v for x [b, t, d], with rotary positions applied to q and k. drop_keys: per-row
    keys for LoRA dropout (training only)."""
    dt = self.dtype
    q = jnp.einsum("btd,dhk->bthk", x, self.q[...].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", x, self.k[...].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", x, self.v[...].astype(dt))
    if self.q_lora is not None:
      q = q + self.q_lora(x, drop_keys).reshape(q.shape)
    if self.k_lora is not None:
      k = k + self.k_lora(x, drop_keys).reshape(k.shape)
    if self.v_lora is not None:
      v = v + self.v_lora(x, drop_keys).reshape(v.shape)
    if self.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if self.qk_norm:  # per head, over head_dim, before rope (as Qwen3 does)
      q = rms_norm(q, self.q_norm[...], self.eps)
      k = rms_norm(k, self.k_norm[...], self.eps)
    factors = rope_factors(meta[0], self.inv_freq, self.rope_limit)  # one read for q and k
    q = constrain(rotate(q, factors), ("act_batch", "act_seq", "act_heads", None))
    k = constrain(rotate(k, factors), ("act_batch", "act_seq", "act_kv_heads", None))
    v = constrain(v, ("act_batch", "act_seq", "act_kv_heads", None))
    return q, k, v

  def output(self, ctx, drop_keys=None):
    out = jnp.einsum("bthk,hkd->btd", ctx, self.o[...].astype(self.dtype))
    if self.o_lora is not None:
      out = out + self.o_lora(ctx.reshape(ctx.shape[:2] + (-1,)), drop_keys)
    if self.o_bias:
      out = out + self.out_bias[...].astype(self.dtype)
    return out

  def __call__(self, x, meta, spec: attn_lib.MaskSpec, drop_keys=None):
    q, k, v = self.project(x, meta, drop_keys)
    ctx = attn_lib.attend(q, k, v, spec, meta, meta, impl=self.impl)
    return self.output(ctx, drop_keys)

  def cached(self, x, meta, spec, k_all, v_all, layer, k_meta, index):
    """Attend over the cache after writing this call's keys/values at `index`.

    k_all, v_all: every layer's cache [layers, batch, kv_heads, slots, head_dim]; this
    layer's part is written in place (the arrays are loop-carried: no copy) and read where
    it lies. layer: this layer's index (an int, or traced under scan). index: the first
    slot to write, shared or per row (KVCache.index). k_meta: the slots' metadata with
    this call's tokens already written. Returns (output, k_all, v_all)."""
    q, k, v = self.project(x, meta)
    k_all = write_slots(k_all, k.transpose(0, 2, 1, 3).astype(k_all.dtype), index, layer)
    v_all = write_slots(v_all, v.transpose(0, 2, 1, 3).astype(v_all.dtype), index, layer)
    k_layer = jax.lax.dynamic_index_in_dim(k_all, layer, keepdims=False)
    v_layer = jax.lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
    # The path is the impl's cache kernel or xla (select.cached_choose, logged once).
    k_layer, v_layer = k_layer.astype(q.dtype), v_layer.astype(q.dtype)
    chosen = select.cached_choose(self.impl, spec, q.shape, k_layer.shape[2], q.dtype)
    ctx = select.cached_run(chosen, q, k_layer, v_layer, spec, meta, k_meta)
    return self.output(ctx), k_all, v_all
