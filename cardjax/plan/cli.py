"""`cardjax plan --config F --topology T`: compile the config's train step for a TPU slice
or a GPU node and report memory and time (cardjax/plan/__init__.py).

before_jax sets the environment jax must start with (CPU default backend, libtpu on the
path, simulated GPU devices), so this module and its package import no jax at import time.
"""

from __future__ import annotations

from cardjax.errors import CardjaxError

DESCRIPTION = (
    "Compiles the config's real train step (no weights allocated) for a TPU slice (v4-N, "
    "v5p-N: N TensorCores, N/2 chips; v5e-N, v6e-N: N chips; compile-only devices from "
    "libtpu, which `make install` puts beside the venv) or a GPU node (8xH200, 1xH100, "
    "16xA100: compile-only devices of XLA:GPU when `make install-gpu-plan` has put jax's "
    "CUDA plugin beside the venv, else simulated CPU devices, an estimate). Exit 0: fits as "
    "given; 3: fits with the grad_accum printed; 1: does not fit.")


def add_arguments(p) -> None:
  p.description = DESCRIPTION
  p.add_argument("--topology", required=True, help="v5p-64, v5e-16, v6e-8, v4-32, 8xH200, ...")
  p.add_argument("--mfu", type=float, default=0.4, help="assumed MFU for the step time")
  p.add_argument("--no-search", action="store_true",
                 help="do not try larger grad_accum when the step does not fit")
  p.add_argument("--json", default="", help="also write the plans to this JSON file")
  p.add_argument("--estimate", action="store_true",
                 help="GPU nodes: XLA:CPU's plan on simulated devices even where XLA:GPU is "
                      "installed (to compare the two)")


def before_jax(args) -> None:
  from cardjax.plan import plan_env

  plan_env(args.topology, args.estimate)


def run(args) -> int:
  import json
  from cardjax.storage import check, checked_path

  from cardjax.config import load_config
  from cardjax.plan import report, run_plan

  config = load_config(args.config, args.overrides)
  if not 0 < args.mfu <= 1:
    raise CardjaxError(f"--mfu={args.mfu} must lie in (0, 1] (e.g. 0.4 for 40%)")
  if args.json:  # a bucket that cannot take the JSON fails now, not after the compiles
    check(args.json)
  plans = run_plan(config, args.topology, search=not args.no_search, estimate=args.estimate)
  print(report(config, plans, args.mfu))
  if args.json:
    checked_path(args.json).write_text(json.dumps(  # local, gs:// or s3://
        {"config": args.config, "overrides": args.overrides, "topology": args.topology,
         "mfu": args.mfu, "compiler": plans[0].compiler,
         "plans": [dict(vars(p), target=vars(p.target), compiler=p.compiler) for p in plans]},
        indent=1))
  return 0 if plans[-1].fits and plans[-1] is plans[0] else (3 if plans[-1].fits else 1)
