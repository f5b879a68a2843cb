"""One mask vocabulary for every attention pattern in cardjax.

A pattern is a predicate over (query, key) token metadata: position id, stream id and
segment id. The XLA reference path evaluates it densely, the kernels evaluate it per tile
(to skip empty tiles) and the tests evaluate it in numpy: the same function everywhere.

Streams: 0 = clean tokens, 1 = noisy (masked) tokens. A dual-stream row holds both streams
side by side with SHARED position ids, so every rule compares positions, never indices.
Segments: packed documents carry different segment ids and never attend to each other.
"""

from __future__ import annotations

import dataclasses

KINDS = ("causal", "bidirectional", "dual_stream", "bd3lm", "block_causal")
CLEAN, NOISY = 0, 1


@dataclasses.dataclass(frozen=True)
class MaskSpec:
  """Which keys a query may see.

  kind:
    causal         key position <= query position (AR, CARD, MDLM with right-shift is NOT this)
    bidirectional  every key of the same segment (MDLM)
    dual_stream    MARS: clean->clean causal; noisy->noisy causal inside the block;
                   noisy->clean earlier blocks only; clean->noisy never
    bd3lm          block diffusion [x_t | x_0]: noisy->noisy same block (bidirectional);
                   noisy->clean earlier blocks; clean->clean block-causal; clean->noisy never
    block_causal   one stream, key block <= query block (block-diffusion decoding)
  block_size: the block length B for the block patterns (ignored by causal/bidirectional).
  noisy_len: dual_stream only; 0: the noisy stream is the row's aligned second copy
    ([clean (L) | noisy (L)]); N > 0: the last N tokens are a compact noisy stream, the
    blocks that carry loss packed after the clean stream (MARS with noisy_fraction < 1).
    The rule is the same (it compares positions, never indices), so the paths that read
    per-token metadata serve it: xla (dense and structured) and pallas_gpu (its tile
    tables come from the metadata, so clean->noisy tiles are still skipped). Splash's
    mask is a static function of indices and which blocks a compact row keeps is data,
    so splash scatters the kept blocks into an aligned [clean | noisy (L)] row and
    gathers their outputs back (cardjax/attention/splash_compact.py): exact, at the full
    copy's attention cost.
  """

  kind: str = "causal"
  block_size: int = 0
  noisy_len: int = 0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"unknown attention mask kind {self.kind!r}; expected one of {KINDS}")
    if self.kind in ("dual_stream", "bd3lm", "block_causal") and self.block_size <= 0:
      raise ValueError(f"mask kind {self.kind!r} needs block_size > 0, got {self.block_size}")
    if self.noisy_len and self.kind != "dual_stream":
      raise ValueError(f"a compact noisy stream is a dual_stream layout, not {self.kind!r}")

  @property
  def compact(self) -> bool:
    """Whether the noisy stream is compact (noisy_len > 0) rather than an aligned copy."""
    return self.noisy_len > 0

  @property
  def is_causal_in_position(self) -> bool:
    """True when no key with a larger position than the query is ever visible."""
    return self.kind in ("causal", "dual_stream")

  def allowed(self, q_pos, k_pos, q_stream, k_stream, q_seg, k_seg):
    """Boolean visibility; arguments broadcast against each other (numpy or jax arrays)."""
    blockless = self.kind in ("causal", "bidirectional")
    q_blk, k_blk = (None, None) if blockless else (q_pos // self.block_size,
                                                   k_pos // self.block_size)
    return self.allowed_in_blocks(q_pos, k_pos, q_blk, k_blk, q_stream, k_stream, q_seg,
                                  k_seg)

  def allowed_in_blocks(self, q_pos, k_pos, q_blk, k_blk, q_stream, k_stream, q_seg, k_seg):
    """`allowed` with the block ids (position // block_size) given: for code that has
    them already, or cannot divide (the Hopper kernel's fragments); the causal and
    bidirectional kinds ignore them."""
    same_segment = q_seg == k_seg
    if self.kind == "causal":
      return same_segment & (k_pos <= q_pos)
    if self.kind == "bidirectional":
      return same_segment
    if self.kind == "block_causal":
      return same_segment & (k_blk <= q_blk)
    qc, kc = q_stream == CLEAN, k_stream == CLEAN
    qn, kn = q_stream == NOISY, k_stream == NOISY
    if self.kind == "dual_stream":
      rule = ((qc & kc & (k_pos <= q_pos))
              | (qn & kn & (k_blk == q_blk) & (k_pos <= q_pos))
              | (qn & kc & (k_blk < q_blk)))
    else:  # bd3lm
      rule = ((qn & kn & (k_blk == q_blk))
              | (qn & kc & (k_blk < q_blk))
              | (qc & kc & (k_blk <= q_blk)))
    return same_segment & rule


CAUSAL = MaskSpec("causal")
BIDIRECTIONAL = MaskSpec("bidirectional")
