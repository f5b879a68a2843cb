"""`cardjax init --config F --workdir D`: a random-init orbax checkpoint of a config's model."""

from __future__ import annotations

from cardjax.storage import resolve


def add_arguments(p) -> None:
  p.add_argument("--workdir", required=True,
                 help="run folder; checkpoints go to WORKDIR/checkpoints")


def run(args) -> None:
  from cardjax import checkpoint
  from cardjax.config import load_config, model_config
  from cardjax.model import create_model, param_count
  from cardjax.parallel.mesh import local_mesh

  config = load_config(args.config, args.overrides)
  model = create_model(model_config(config), seed=config.seed, mesh=local_mesh())
  # The run config goes with it, as a training run's does: serve, generate and eval find
  # the config's tokenizer there.
  path = checkpoint.save_model(f"{resolve(args.workdir)}/checkpoints", model, step=0,
                               run_config=config)
  print(f"initialised {param_count(model):,} parameters -> {path}")
