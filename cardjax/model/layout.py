"""A model's layers as a list or as one scanned block, converted either way.

A checkpoint keeps the layout it was trained in. Serving may want the other: with its
layers unrolled, every decode program (a step of a served pool, a prefill) holds a copy of
the block per layer, and XLA compiles them all; scanned, it compiles one block and loops
over the stacked parameters. On an accelerator a served model compiles a few hundred such
programs at start-up, so the scanned layout shortens the warm-up by about the number of
layers (`cardjax serve --scan-layers`). The parameters are the same numbers, stacked
along a leading layer axis or split off it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.model.create import abstract_model


def with_layout(model, scan: bool):
  """`model` with `scan_layers` = `scan`: the same module when it already is, else a new
  one holding the same parameters (stacked or split)."""
  cfg = model.cfg
  if cfg.scan_layers == scan:
    return model
  if getattr(model, "lora", None) is not None:
    raise ValueError("with_layout converts plain models; merge the LoRA adapters first")
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  layers = params.pop("layers")
  if scan:
    params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs),
                                    *[layers[i] for i in range(cfg.num_layers)])
  else:
    params["layers"] = {i: jax.tree.map(lambda x, i=i: x[i], layers)
                        for i in range(cfg.num_layers)}
  new = abstract_model(dataclasses.replace(cfg, scan_layers=scan))
  graphdef, state = nnx.split(new)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)
