"""Meshes, logical-axis sharding rules and multi-host helpers."""

from cardjax.parallel.mesh import make_mesh, mesh_shape
from cardjax.parallel.sharding import (DEFAULT_RULES, constrain, logical_to_spec,
                                       param_shardings, use_rules)

__all__ = ["make_mesh", "mesh_shape", "DEFAULT_RULES", "constrain", "logical_to_spec",
           "param_shardings", "use_rules"]
