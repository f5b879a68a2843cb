"""METHODS.md sections 1, 2 and 4 in plain numpy and Python loops, written independently of
cardjax/objectives: the tests compare the jnp objectives against these, element by element.

Conventions shared with the objectives (each stated in the module docstrings there):
- a batch row holds packed documents (segment id > 0, positions restarting at 0) and maybe
  padding (segment 0); a token carries loss where loss_mask is 1;
- "the output at q predicts x_{q+1}" counts where q+1 is a loss-carrying token of the same
  document.
"""

from __future__ import annotations

import math

import numpy as np


def ce(logit_row, target) -> float:
  """-log softmax(logit_row)[target] in float64."""
  z = np.asarray(logit_row, np.float64)
  m = z.max()
  return float(m + math.log(np.exp(z - m).sum()) - z[target])


def next_target(tokens, seg, loss_mask, q):
  """(target, valid) of the output at q under the next-token convention (one row)."""
  n = len(tokens)
  if q + 1 >= n:
    return 0, False
  valid = seg[q + 1] > 0 and seg[q + 1] == seg[q] and loss_mask[q + 1] > 0
  return int(tokens[q + 1]), bool(valid)


def doc_start(seg, q):
  """Index of the first token of q's document (run of equal segment ids)."""
  i = q
  while i > 0 and seg[i - 1] == seg[q]:
    i -= 1
  return i


# --- CARD (section 1) -------------------------------------------------------------------------

def card_n_w(l_eff: int, t: float, lam: float):
  """N = max(1, floor(L t)), W = min(L, floor(lambda N)); products in float32 like the
  objective (an exact IEEE product, so floor agrees bit for bit)."""
  if l_eff == 0:
    return 0, 0
  n = max(1, int(math.floor(float(np.float32(l_eff) * np.float32(t)))))
  n = min(n, l_eff)
  return n, min(l_eff, int(math.floor(float(np.float32(lam) * np.float32(n)))))


def card_weights(masked, seg, beta: float, p: float) -> np.ndarray:
  """Closed form w_q = 1 / (beta + S_q), S_q = sum_{i<=q} C_i (1-p)^(q-i),
  C_i = m_i (1 + m_{i-1}), the sums running over q's own document."""
  b, l = masked.shape
  out = np.zeros((b, l))
  for r in range(b):
    for q in range(l):
      start = doc_start(seg[r], q)
      s = 0.0
      for i in range(start, q + 1):
        prev = masked[r, i - 1] if i > start else 0
        c = masked[r, i] * (1 + prev)
        s += c * (1 - p) ** (q - i)
      out[r, q] = 1.0 / (beta + s)
  return out


def card_loss(logits, tokens, seg, loss_mask, masked, beta, p, reweighting) -> float:
  w = card_weights(masked, seg, beta, p) if reweighting == "context" else np.ones(masked.shape)
  rows = []
  for r in range(tokens.shape[0]):
    num = den = 0.0
    for q in range(tokens.shape[1]):
      target, valid = next_target(tokens[r], seg[r], loss_mask[r], q)
      if valid:
        num += w[r, q] * ce(logits[r, q], target)
        den += w[r, q]
    if den > 0:
      rows.append(num / den)
  return float(np.mean(rows))


# --- MARS (section 2) -------------------------------------------------------------------------

def mars_rule(i, q_clean, j, k_clean, block) -> bool:
  """The four rules for query position i and key position j of one document."""
  bi, bj = i // block, j // block
  if q_clean and k_clean:
    return j <= i
  if not q_clean and not k_clean:
    return bj == bi and j <= i
  if not q_clean and k_clean:
    return bj < bi
  return False  # clean -> noisy


def two_stream_mask(rule, positions, seg, block, noisy_first) -> np.ndarray:
  """[2L, 2L] of one row laid out [clean | noisy] (or [noisy | clean]); packed documents
  never see each other (padding, segment 0, counts as one more 'document')."""
  l = len(positions)
  out = np.zeros((2 * l, 2 * l), bool)
  for a in range(2 * l):
    for c in range(2 * l):
      qa, kc = a % l, c % l
      if seg[qa] != seg[kc]:
        continue
      q_clean = (a < l) != noisy_first
      k_clean = (c < l) != noisy_first
      out[a, c] = rule(int(positions[qa]), q_clean, int(positions[kc]), k_clean, block)
  return out


def mars_loss(logits, tokens, seg, loss_mask, alpha) -> tuple[float, float, float]:
  """(loss, noisy term, clean term); logits [B, 2L, V] laid out [clean | noisy]."""
  b, l = tokens.shape
  terms = {"clean": [], "noisy": []}
  for r in range(b):
    for name, off in (("clean", 0), ("noisy", l)):
      total, count = 0.0, 0
      for q in range(l):
        target, valid = next_target(tokens[r], seg[r], loss_mask[r], q)
        if valid:
          total += ce(logits[r, off + q], target)
          count += 1
      if count:
        terms[name].append(total / count)
  noisy, clean = float(np.mean(terms["noisy"])), float(np.mean(terms["clean"]))
  return noisy + alpha * clean, noisy, clean


# --- MDLM and BD3LM (section 4) ---------------------------------------------------------------

def maskable(seg, loss_mask, shift) -> np.ndarray:
  b, l = seg.shape
  out = np.zeros((b, l), bool)
  for r in range(b):
    for i in range(l):
      ok = loss_mask[r, i] > 0 and seg[r, i] > 0
      if shift:
        ok = ok and i > 0 and seg[r, i - 1] == seg[r, i]
      out[r, i] = ok
  return out


def diffusion_loss(logits, tokens, seg, loss_mask, masked, t_pos, shift) -> float:
  """Per row: sum over masked j of CE(output predicting x_j, x_j) / t_j, divided by the
  row's number of maskable tokens; the mean over rows that have any. logits [B, L, V] of
  the noisy stream; the output predicting x_j is j (shift False) or j - 1 (shift True)."""
  elig = maskable(seg, loss_mask, shift)
  rows = []
  for r in range(tokens.shape[0]):
    n = int(elig[r].sum())
    if not n:
      continue
    total = 0.0
    for j in range(tokens.shape[1]):
      if masked[r, j]:
        q = j - 1 if shift else j
        total += ce(logits[r, q], int(tokens[r, j])) / float(t_pos[r, j])
    rows.append(total / n)
  return float(np.mean(rows))


def bd3lm_rule(i, q_clean, j, k_clean, block) -> bool:
  """METHODS section 4: block-diagonal within the noisy stream | x_t -> earlier clean blocks
  | clean block-causal; clean never sees x_t."""
  bi, bj = i // block, j // block
  if not q_clean and not k_clean:
    return bi == bj
  if not q_clean and k_clean:
    return bj < bi
  if q_clean and k_clean:
    return bj <= bi
  return False
