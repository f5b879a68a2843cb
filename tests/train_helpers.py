"""What the trainer's tests share: a small python_stdlib slice and the tiny AR config on it."""

import jax
from flax import nnx

from cardjax import checkpoint
from cardjax.config import load_config
from cardjax.data.prepare import prepare

SMALL = ["--config.data.options.max_files=40", "--config.data.options.validation_percent=10",
         "--config.data.seq_len=32",
         "--config.data.batch_size=8", "--config.train.log_every=2",
         "--config.train.progress=false", "--config.train.eval_steps=1",
         "--config.model.hidden_size=32", "--config.model.intermediate_size=64"]


def small_config(data_dir, *extra):
  """configs/tiny_ar.py, shrunk, on the slice prepared in `data_dir`; `extra` overrides."""
  return load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL,
                                            *extra])


def prepare_small(root):
  """The slice (40 files, 10% held out) built in `root`; returns `root`."""
  prepare(small_config(root))
  return root


def restored_params(workdir, step=None):
  """The parameter leaves of a run's checkpoint (the newest, or `step`)."""
  model, _ = checkpoint.restore_model(workdir / "checkpoints", step=step)
  return jax.tree.leaves(nnx.state(model, nnx.Param))
