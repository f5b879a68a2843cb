"""Join a multi-process (multi-host) job before anything touches the devices.

Three ways in, by environment:
  CARDJAX_COORDINATOR=host:port CARDJAX_NUM_PROCESSES=N CARDJAX_PROCESS_ID=i
      explicit (local multi-process runs, any cluster); on CPU the collectives use gloo
  CARDJAX_DISTRIBUTED=auto
      jax.distributed.initialize() detects the cluster itself (TPU pod slices, SLURM, ...)
  neither: a single process, nothing to do.
"""

from __future__ import annotations

import logging
import os

import jax

from cardjax.errors import ConfigError

log = logging.getLogger("cardjax.parallel")
_done = False


def initialize() -> bool:
  """Initialise jax.distributed when the environment asks for it; True if it did."""
  global _done
  if _done:
    return True
  coordinator = os.environ.get("CARDJAX_COORDINATOR")
  if coordinator:
    try:
      count = int(os.environ["CARDJAX_NUM_PROCESSES"])
      index = int(os.environ["CARDJAX_PROCESS_ID"])
    except (KeyError, ValueError):
      raise ConfigError("CARDJAX_COORDINATOR is set, so CARDJAX_NUM_PROCESSES and "
                        "CARDJAX_PROCESS_ID must be integers too") from None
    # CPU processes need a collectives backend to talk to each other; harmless elsewhere.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=count, process_id=index)
  elif os.environ.get("CARDJAX_DISTRIBUTED", "").lower() == "auto":
    jax.distributed.initialize()
  else:
    return False
  _done = True
  log.info("process %d of %d, %d local / %d global devices", jax.process_index(),
           jax.process_count(), jax.local_device_count(), jax.device_count())
  return True
