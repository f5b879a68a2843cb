"""The demo's lines on wall-clock speed: what a forward of w tokens costs against one of 1
token on this machine (measured in the demo, a few seconds), and the latest accelerator
measurement the repository records, with its date and device.

A method that writes t tokens a forward of w tokens gains about t / cost(w) / cost(1) over
AR on the machine at hand: on a CPU a forward costs about its tokens, so 3.6 tokens a
forward of 8 gains little; on an accelerator a small-batch forward costs about the weights
it reads, whatever its width.
"""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"  # in a clone of the repository


def forward_costs(run, batch: int, widths: tuple[int, ...], context: int = 48,
                  slots: int = 128) -> dict[int, float]:
  """ms per cached forward of each width (new tokens per row) for `run`'s model at `batch`
  rows (cardjax.eval.forward_cost: a jitted loop of 40 forwards, the best of 3)."""
  from flax import nnx

  from cardjax.eval.forward_cost import forward_ms

  graphdef, state = nnx.split(run.model)
  return {w: forward_ms(graphdef, state, batch, w, slots, context, 40, 3) for w in widths}


def forward_cost_line(costs: dict[int, float], names: dict[int, str]) -> str:
  one = costs[1]
  parts = [f"1 token {one:.2f} ms"] + [f"{w} tokens ({names.get(w, '')}) {costs[w] / one:.2f}x"
                                       for w in sorted(costs) if w != 1]
  return "one forward on this CPU: " + ", ".join(parts)


def accelerator_line(results: Path = RESULTS) -> str:
  """The newest decode-attention measurement on an accelerator under results/kernels/, as
  one line with its date and device; or why there is none."""
  files = sorted(results.glob("kernels/attention_decode_*.md"))
  if not files:
    return "no accelerator measurement in this checkout (results/kernels/)"
  path = files[-1]
  text = path.read_text()
  device = re.search(r"gpu:([^,]+),", text)
  date = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
  ratios = []
  for slots in re.findall(r"^\| AR step \| (\d+) \|", text, flags=re.M):
    ar = re.search(rf"^\| AR step \| {slots} \| [\d.]+ \| ([\d.]+) \|", text, flags=re.M)
    window = re.search(rf"^\| MARS window B=4 \| {slots} \| [\d.]+ \| ([\d.]+) \|", text,
                       flags=re.M)
    if ar and window:
      ratios.append(float(window.group(1)) / float(ar.group(1)))
  if not (device and date and ratios):
    return f"{path.relative_to(results.parent)}: not in the expected form; read it there"
  return (f"on one {device.group(1)} ({date.group(1)}, {path.relative_to(results.parent)}) "
          f"the attention of a MARS window of 8 tokens took {min(ratios):.2f}-"
          f"{max(ratios):.2f}x an AR step's (batch 16, {len(ratios)} cache sizes); no "
          "whole-decoder timing on an accelerator is recorded yet")
