"""The decoder: embeddings, N pre-norm blocks (attention + SwiGLU), final norm, LM head.

Layers are either a list of blocks or, with `scan_layers`, one block whose parameters are
stacked on a leading 'layers' axis and run under `lax.scan` (one compiled block: faster
compiles and smaller HLO for deep models). Both run each block through the same pure
function, so remat applies identically.

Profiles name the parts (`jax.named_scope`, which only labels the compiled ops): `embed`,
`block_0`, `block_1`, ... (`block`: the one scanned body that runs every layer),
inside each `attention` and `mlp`, and `lm_head`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax import attention as attn_lib
from cardjax.errors import CardjaxError
from cardjax.model.attention import Attention
from cardjax.model.cache import KVCache
from cardjax.model.config import ModelConfig
from cardjax.model.layers import MLP, RMSNorm, param
from cardjax.model.lora import layer_keys
from cardjax.model.lora_spec import LoraSpec
from cardjax.parallel.sharding import constrain

_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Block(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: LoraSpec | None = None):
    self.attn_norm = RMSNorm(cfg, rngs)
    self.attn = Attention(cfg, rngs, lora)
    self.mlp_norm = RMSNorm(cfg, rngs)
    self.mlp = MLP(cfg, rngs, lora)

  def __call__(self, x, meta, spec, drop_keys=None):
    with jax.named_scope("attention"):
      x = x + self.attn(self.attn_norm(x), meta, spec, layer_keys(drop_keys, 0))
    with jax.named_scope("mlp"):
      x = x + self.mlp(self.mlp_norm(x), layer_keys(drop_keys, 1))
    return constrain(x, ("act_batch", "act_seq", "act_embed"))

  def cached(self, x, meta, spec, k_all, v_all, layer, k_meta, index):
    with jax.named_scope("attention"):
      out, k_all, v_all = self.attn.cached(self.attn_norm(x), meta, spec, k_all, v_all,
                                           layer, k_meta, index)
      x = x + out
    with jax.named_scope("mlp"):
      return x + self.mlp(self.mlp_norm(x)), k_all, v_all


def _run_block(graphdef, state, x, meta, spec, drop_keys):
  return nnx.merge(graphdef, state)(x, meta, spec, drop_keys)


class Decoder(nnx.Module):
  """`logits = model(tokens)` with tokens int32 [batch, seq] -> [batch, seq, vocab].

  With `lora`, the projections it targets carry LoRA adapters (cardjax/model/lora.py)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: LoraSpec | None = None):
    cfg.validate()
    self.cfg = cfg
    self.lora = lora
    pd = jnp.dtype(cfg.param_dtype)
    self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd,
                       scale=cfg.initializer_range)
    if cfg.scan_layers:
      @nnx.split_rngs(splits=cfg.num_layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def stacked(rngs):
        return Block(cfg, rngs, lora)

      self.layers = stacked(rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs, lora) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg, rngs)
    if not cfg.tie_word_embeddings:
      # Same [vocab, embed] layout as the embedding, so tied and untied share one matmul.
      self.lm_head = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd,
                           scale=cfg.initializer_range)

  def __call__(self, tokens, positions=None, segment_ids=None, mask=None, streams=None,
               drop_keys=None):
    """Run the decoder.

    tokens: int32 [batch, seq]. positions: [batch, seq] position ids (default 0..seq-1).
    segment_ids: [batch, seq], packed documents never attend across ids (default all 1).
    mask: an attention MaskSpec (default causal). streams: [batch, seq] 0 clean / 1 noisy
    for the dual-stream patterns (default all 0). drop_keys: one key per row for LoRA
    dropout (training; None = no dropout).
    """
    return self._head(self.features(tokens, positions, segment_ids, mask, streams, drop_keys))

  def features(self, tokens, positions=None, segment_ids=None, mask=None, streams=None,
               drop_keys=None):
    """The final-normed hidden states [batch, seq, embed] the LM head reads (arguments as
    for __call__): a chunked loss applies `head_matrix()` a slice at a time."""
    cfg = self.cfg
    tokens, meta, spec = self._inputs(tokens, positions, segment_ids, mask, streams)
    x = self._embed(tokens)
    run = _run_block
    if cfg.remat != "none":
      run = jax.checkpoint(_run_block, policy=_REMAT[cfg.remat], static_argnums=(0, 4))
    if cfg.scan_layers:
      graphdef, state = nnx.split(self.layers)

      def body(h, layer):
        s, i = layer
        return run(graphdef, s, h, meta, spec, layer_keys(drop_keys, i)), None

      with jax.named_scope("block"):
        x, _ = jax.lax.scan(body, x, (state, jnp.arange(cfg.num_layers)))
    else:
      for i, block in enumerate(self.layers):
        graphdef, state = nnx.split(block)
        with jax.named_scope(f"block_{i}"):
          x = run(graphdef, state, x, meta, spec, layer_keys(drop_keys, i))
    return self.final_norm(x)

  def forward_cached(self, tokens, cache: KVCache, positions=None, segment_ids=None,
                     mask=None, streams=None, logits_at=None):
    """(logits, cache): run `tokens` against the cached keys and write theirs at
    cache.index (prefill with a whole prompt, then a token or a block per call).

    logits_at: optional int [batch, k] indices into the tokens; logits are computed at
    those k only ([batch, k, vocab]). The LM head is a fifth of a small model's weights
    and FLOPs per token (SmolLM2: 28M of 135M), so a prefill that needs one position, or
    a MARS window that needs B of its 2B, should not pay it everywhere."""
    tokens, meta, spec = self._inputs(tokens, positions, segment_ids, mask, streams)
    cache = cache.write_meta(meta)
    k_meta, index = cache.key_meta(), cache.index
    x = self._embed(tokens)
    # Every layer writes its slots of the one [layers, ...] cache in place: carried through
    # the layers (and the caller's decode loop), never stacked or sliced into a copy.
    k, v = cache.k, cache.v
    if self.cfg.scan_layers:
      graphdef, state = nnx.split(self.layers)

      def body(carry, layer):
        h, k, v = carry
        s, i = layer
        h, k, v = nnx.merge(graphdef, s).cached(h, meta, spec, k, v, i, k_meta, index)
        return (h, k, v), None

      with jax.named_scope("block"):
        (x, k, v), _ = jax.lax.scan(body, (x, k, v),
                                    (state, jnp.arange(self.cfg.num_layers)))
    else:
      for i, block in enumerate(self.layers):
        with jax.named_scope(f"block_{i}"):
          x, k, v = block.cached(x, meta, spec, k, v, i, k_meta, index)
    cache = dataclasses.replace(cache, k=k, v=v, index=index + tokens.shape[1])
    if logits_at is not None:
      x = jnp.take_along_axis(x, jnp.asarray(logits_at, jnp.int32)[..., None], axis=1)
    return self._head(self.final_norm(x)), cache

  def _inputs(self, tokens, positions, segment_ids, mask, streams):
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise CardjaxError(f"tokens must be an integer array [batch, seq], got "
                         f"{tokens.dtype}{list(tokens.shape)}")
    _check_token_range(tokens, self.cfg.vocab_size)
    b, t = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids is None:
      segment_ids = jnp.ones((b, t), jnp.int32)
    if streams is None:
      streams = jnp.zeros((b, t), jnp.int32)
    spec = attn_lib.CAUSAL if mask is None else mask
    meta = (jnp.asarray(positions, jnp.int32), jnp.asarray(streams, jnp.int32),
            jnp.asarray(segment_ids, jnp.int32))
    return tokens, meta, spec

  def _embed(self, tokens):
    # Gather from a table whose embed dim is whole (all-gathered over fsdp): a gather from
    # an fsdp-sharded table into fsdp-sharded rows makes XLA replicate everything.
    with jax.named_scope("embed"):
      table = constrain(self.embed[...], ("vocab", None))
      x = jnp.take(table, tokens, axis=0).astype(jnp.dtype(self.cfg.dtype))
      return constrain(x, ("act_batch", "act_seq", "act_embed"))

  def head_matrix(self):
    """The LM head [vocab, embed] in the compute dtype (the embedding when tied)."""
    head = self.embed if self.cfg.tie_word_embeddings else self.lm_head
    return head[...].astype(jnp.dtype(self.cfg.dtype))

  def _head(self, x):
    return head_logits(x, self.head_matrix())


def head_logits(features, head):
  """Logits [batch, seq, vocab] of final-normed features [batch, seq, embed]."""
  with jax.named_scope("lm_head"):  # also the chunked loss's head (objectives/chunked_ce)
    logits = jnp.einsum("btd,vd->btv", features, head)
    return constrain(logits, ("act_batch", "act_seq", "act_vocab"))


def _check_token_range(tokens, vocab_size: int) -> None:
  """Eager inputs are checked here (a traced jit input is checked by the data pipeline)."""
  try:
    if tokens.size == 0 or not tokens.is_fully_addressable:
      return  # a multi-host global array: each host's pipeline checked its own part
    values = np.asarray(tokens)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # traced under jit: no values to check here
  lo, hi = int(values.min()), int(values.max())
  if lo < 0 or hi >= vocab_size:
    raise CardjaxError(f"token ids must lie in [0, vocab_size={vocab_size}), got min {lo} "
                       f"max {hi}; check the tokenizer matches the model (model.vocab_size)")
