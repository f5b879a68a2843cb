"""Data pipeline throughput next to what a train step consumes, in one run.

  python -m benchmarks.data [--data_dir DIR] [--steps 20]

For each workload of the demo (configs/tiny.py on python_stdlib pretraining and on arith_sft
SFT rows) it prints the pipeline's tokens/s (in-process and with 2 grain workers) and the
tokens/s of a jitted AdamW step of the tiny model on the same batches (next-token loss,
forward + backward + update), and their ratio: the pipeline must be faster than the step.
"""

from __future__ import annotations

import tempfile
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cardjax.config import load_config, model_config
from cardjax.data.prepare import make_loader, prepare
from cardjax.model import create_model

from benchmarks.common import announce, arg_parser

WORKLOADS = {
    "pretrain python_stdlib": [],
    "sft arith_sft": ["--config.data.dataset=arith_sft", "--config.data.mode=sft",
                      "--config.data.pad_to_multiple=4", "--config.data.packing=true"],
}


def pipeline_tokens_per_s(config, workers: int, steps: int) -> float:
  loader = make_loader(config, num_workers=workers)
  next(loader)  # start-up (worker processes, first reads) is not throughput
  start = time.perf_counter()
  tokens = 0
  for _ in range(steps):
    tokens += next(loader)["tokens"].size
  return tokens / (time.perf_counter() - start)


def step_tokens_per_s(config, steps: int) -> float:
  """A stand-in train step: next-token cross-entropy, grads, AdamW, all in one jit."""
  model = create_model(model_config(config), seed=0)
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, batch):
    def loss_fn(model):
      logits = model(batch["tokens"], positions=batch["positions"],
                     segment_ids=batch["segment_ids"])
      targets = batch["tokens"][:, 1:]
      weights = (batch["loss_mask"][:, 1:] * (batch["segment_ids"][:, 1:]
                                               == batch["segment_ids"][:, :-1]))
      ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], targets)
      return (ce * weights).sum() / jnp.maximum(weights.sum(), 1)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  loader = make_loader(config)
  batches = [{k: jnp.asarray(v) for k, v in next(loader).items()} for _ in range(4)]
  jax.block_until_ready(step(model, optimizer, batches[0]))  # compile
  start = time.perf_counter()
  for i in range(steps):
    loss = step(model, optimizer, batches[i % len(batches)])
  jax.block_until_ready(loss)
  return steps * batches[0]["tokens"].size / (time.perf_counter() - start)


def main():
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--data-dir", "--data_dir", dest="data_dir", default="",
                      help="default: a temporary folder (--data_dir: the old spelling)")
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args()
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="cardjax-bench-")
  announce("data pipeline")
  rows = []
  for name, overrides in WORKLOADS.items():
    config = load_config("configs/tiny.py", [f"--config.data.data_dir={data_dir}", *overrides])
    prepare(config)
    p0 = pipeline_tokens_per_s(config, 0, args.steps)
    p2 = pipeline_tokens_per_s(config, 2, args.steps)
    s = step_tokens_per_s(config, args.steps)
    rows.append((name, config.data.batch_size, config.data.seq_len, p0, p2, s))
  header = ("workload", "batch", "seq", "pipeline tok/s", "pipeline 2 workers",
            "train step tok/s", "pipeline / step")
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for name, b, l, p0, p2, s in rows:
    print(f"| {name} | {b} | {l} | {p0:,.0f} | {p2:,.0f} | {s:,.0f} | {max(p0, p2) / s:.1f}x |")


if __name__ == "__main__":
  main()
