"""Draw every attention mask cardjax trains with, from the project's own mask code.

Each picture is a grid of query rows against key columns for one tiny row (16 tokens,
blocks of B = 4): a filled cell means the query may attend to that key. The grids are not
drawn by hand. Each objective's `corrupt` (cardjax/objectives/) builds its model inputs
from a small batch, exactly as in training (tokens, position ids, streams, segment ids
and the MaskSpec it picks), and `cardjax.attention.dense_mask` (the dense reference
every kernel is tested against) turns them into the boolean mask drawn here. The
block-causal kind, which no objective uses, comes from `MaskSpec("block_causal", 4)` the
same way. Tick labels name each token: `x7` a visible token at position 7, `M7` a [MASK]
at position 7, `-` a filler slot of the compact MARS stream.

Regenerate (about 20 s on a laptop CPU; writes docs/images/masks/*.png):

  source .venv/bin/activate
  python tools/make_mask_pictures.py [--out docs/images/masks]

docs/concepts.md shows the pictures.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from cardjax.attention import CLEAN, NOISY, MaskSpec, dense_mask  # noqa: E402
from cardjax.config import base_config  # noqa: E402
from cardjax.model.config import ModelConfig  # noqa: E402
from cardjax.objectives import OBJECTIVES, ModelInputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
L, B = 16, 4  # tokens per row, block size
MASK_ID = 500  # the [MASK] id of the tiny model config (any id of the vocabulary)
SEED = 3  # the corruption key: fold_in(PRNGKey(SEED), 0), one row

# Cell colours: 0 = hidden; then by (query stream, key stream).
COLOURS = ["#f4f4f4", "#4c72b0", "#dd8452", "#55a868", "#c44e52"]
RULE_NAMES = {1: "clean -> clean", 2: "noisy -> noisy", 3: "noisy -> clean",
              4: "clean -> noisy"}


def batch(tokens, positions, segments, loss_mask) -> dict:
  """One row as the data pipeline hands it to an objective."""
  def row(x):
    return jnp.asarray([x], jnp.int32)
  return dict(tokens=row(tokens), positions=row(positions), segment_ids=row(segments),
              loss_mask=row(loss_mask))


def one_document() -> dict:
  """A 16-token pretraining row: one document, every token carries loss."""
  return batch(range(10, 10 + L), range(L), [1] * L, [1] * L)


def packed_documents() -> dict:
  """Two documents packed in one row (10 + 6 tokens): positions restart, segments differ."""
  return batch(range(10, 10 + L), list(range(10)) + list(range(6)), [1] * 10 + [2] * 6,
               [1] * L)


def sft_row() -> dict:
  """An SFT example: a 7-token prompt (no loss) and a 9-token response."""
  return batch(range(10, 10 + L), range(L), [1] * L, [0] * 7 + [1] * 9)


def corrupt(name: str, row: dict, **objective) -> ModelInputs:
  """The named objective's model inputs for `row`, built by its own corrupt()."""
  cfg = base_config().objective
  cfg.name = name
  cfg.block_size = B
  cfg.update(objective)
  model_cfg = ModelConfig(mask_token_id=MASK_ID)
  obj = OBJECTIVES[name](cfg, model_cfg)
  return obj.corrupt(row, jax.random.fold_in(jax.random.PRNGKey(SEED), 0))


def mask_of(spec: MaskSpec, positions, streams, segments) -> np.ndarray:
  """[T, T] booleans from the dense reference (cardjax/attention/reference.py)."""
  meta = (positions, streams, segments)
  return np.asarray(dense_mask(spec, meta, meta))[0]


def labels(inputs: ModelInputs) -> list[str]:
  tokens, pos, seg = (np.asarray(a)[0] for a in (inputs.tokens, inputs.positions,
                                                   inputs.segment_ids))
  out = []
  for t, p, g in zip(tokens, pos, seg):
    out.append("-" if g == 0 else (f"M{p}" if t == MASK_ID else f"x{p}"))
  return out


def coloured(allowed: np.ndarray, streams: np.ndarray) -> np.ndarray:
  """Cell codes: 0 hidden, else 1-4 by (query stream, key stream) as in RULE_NAMES."""
  qs, ks = streams[:, None], streams[None, :]
  code = np.select([(qs == CLEAN) & (ks == CLEAN), (qs == NOISY) & (ks == NOISY),
                    (qs == NOISY) & (ks == CLEAN)], [1, 2, 3], 4)
  return np.where(allowed, code, 0)


def draw(path: Path, title: str, inputs: ModelInputs, spec: MaskSpec | None = None,
         note: str = "", weights: np.ndarray | None = None, blocks: bool = True):
  """Draw one mask as a labelled grid and save it as a PNG."""
  spec = inputs.mask if spec is None else spec
  pos, streams, seg = inputs.positions, inputs.streams, inputs.segment_ids
  allowed = mask_of(spec, pos, streams, seg)
  streams_np, pos_np = np.asarray(streams)[0], np.asarray(pos)[0]
  seg_np = np.asarray(seg)[0]
  codes = coloured(allowed, streams_np)
  t = len(streams_np)
  names = labels(inputs)
  size = 2.2 + 0.27 * t
  extra = 0.9 if weights is not None else 0.0
  height = size + extra + 0.6
  fig = plt.figure(figsize=(size + 1.2, height))
  top = 1 - 1.25 / height
  if weights is not None:
    ax = fig.add_axes([0.14, 0.2, 0.74, top - 0.2])
    wax = fig.add_axes([0.14, 0.06, 0.74, 0.045])
  else:
    ax = fig.add_axes([0.14, 0.07, 0.74, top - 0.07])
  ax.imshow(codes, cmap=ListedColormap(COLOURS), vmin=0, vmax=4, interpolation="nearest")
  ax.set_xticks(range(t), names, rotation=90, fontsize=7)
  ax.set_yticks(range(t), names, fontsize=7)
  ax.xaxis.tick_top()
  ax.set_xticks(np.arange(-0.5, t), minor=True)
  ax.set_yticks(np.arange(-0.5, t), minor=True)
  ax.grid(which="minor", color="white", linewidth=0.6)
  ax.tick_params(which="minor", length=0)
  # Block boundaries (position // B changes, or a new document / stream starts).
  if blocks and spec.kind in ("dual_stream", "bd3lm", "block_causal"):
    cuts = [i for i in range(1, t) if pos_np[i] // B != pos_np[i - 1] // B
            or streams_np[i] != streams_np[i - 1] or seg_np[i] != seg_np[i - 1]]
    for c in cuts:
      ax.axvline(c - 0.5, color="#888888", linewidth=0.8)
      ax.axhline(c - 0.5, color="#888888", linewidth=0.8)
  docs = [i for i in range(1, t) if seg_np[i] != seg_np[i - 1] and streams_np[i] ==
          streams_np[i - 1]]
  for c in docs:
    ax.axvline(c - 0.5, color="#444444", linewidth=1.2, linestyle="--")
    ax.axhline(c - 0.5, color="#444444", linewidth=1.2, linestyle="--")
  # The two streams' halves.
  halves = [i for i in range(1, t) if streams_np[i] != streams_np[i - 1]]
  spans = []
  start = 0
  for c in halves + [t]:
    spans.append((start, c, "clean" if streams_np[start] == CLEAN else "noisy"))
    start = c
  for c in halves:
    ax.axvline(c - 0.5, color="black", linewidth=2.2)
    ax.axhline(c - 0.5, color="black", linewidth=2.2)
  for a, b, name in spans if halves else []:
    mid = (a + b - 1) / 2
    ax.text(t - 0.5 + 0.6, mid, f"{name}\nqueries", rotation=270, va="center", ha="left",
            fontsize=9, fontweight="bold")
    ax.text(mid, t - 0.5 + 0.55, f"{name} keys", va="top", ha="center", fontsize=9,
            fontweight="bold")
  ax.set_xlabel("")
  ax.set_ylabel("query (output position)", fontsize=9)
  ax.set_title("key (what the query may read)", fontsize=9, pad=28)
  present = sorted(set(np.unique(codes)) - {0})
  handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in present]
  legend = [RULE_NAMES[c] if len(set(streams_np)) > 1 else "may attend" for c in present]
  handles.append(plt.Rectangle((0, 0), 1, 1, color=COLOURS[0]))
  legend.append("hidden")
  fig.legend(handles, legend, loc="lower right", fontsize=8, ncol=len(legend), frameon=False,
             bbox_to_anchor=(0.98, 0.0))
  fig.suptitle(title, fontsize=11, fontweight="bold", y=1 - 0.08 / height)
  fig.text(0.5, 1 - 0.38 / height, f"{spec}" + (f"   {note}" if note else ""), ha="center",
           va="top", fontsize=8, family="monospace")
  if weights is not None:
    fig.canvas.draw()  # the grid's box is final once drawn (square cells)
    box = ax.get_position()
    wax.set_position([box.x0, 0.06, box.width, 0.045])
    w = np.asarray(weights)[0]
    wax.imshow(w[None, :], cmap="Greens", vmin=0, vmax=2, aspect="auto")
    for i, v in enumerate(w):
      wax.text(i, 0, f"{v:.2f}", ha="center", va="center", fontsize=6.5)
    wax.set_xticks(range(t), names, fontsize=6.5)
    wax.set_yticks([0], ["w_q"], fontsize=8)
    wax.set_title("loss weight of output q (which predicts the clean token q+1)", fontsize=8)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "masks"))
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)

  ar = corrupt("ar", one_document())
  draw(out / "ar_causal.png", "AR: causal", ar, note="objective ar")
  packed = corrupt("ar", packed_documents())
  draw(out / "packed_documents.png", "Packed documents: causal within each document",
       packed, note="objective ar, segments 1 | 2")
  card = corrupt("card", one_document())
  draw(out / "card_causal.png", "CARD: causal over a soft tail of [MASK]s", card,
       note="objective card (soft_tail, lambda 1.5)", weights=card.weights)
  mdlm = corrupt("mdlm", one_document())
  draw(out / "mdlm_bidirectional.png", "MDLM: bidirectional", mdlm,
       note=f"objective mdlm, t = {float(mdlm.aux['t'][0]):.2f}")
  bd3 = corrupt("bd3lm", one_document())
  draw(out / "bd3lm_block_diffusion.png", "BD3LM: block diffusion [x_t | x_0]", bd3,
       note="objective bd3lm")
  mars = corrupt("mars", sft_row())
  draw(out / "mars_dual_stream.png", "MARS: dual stream [clean | noisy]", mars,
       note="objective mars; prompt x0-x6, response x7-x15")
  compact = corrupt("mars", sft_row(), noisy_fraction=0.75)
  draw(out / "mars_compact_stream.png", "MARS: compact noisy stream (noisy_fraction 0.75)",
       compact, note="block 0 carries no loss: dropped")
  draw(out / "block_causal.png", "Block-causal (a mask kind of the kernels)", ar,
       spec=MaskSpec("block_causal", B), note="no objective uses it")
  for p in sorted(out.glob("*.png")):
    print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)


if __name__ == "__main__":
  main()
