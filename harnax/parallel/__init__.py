"""Meshes and sharding rules shared by solvers and models."""

from harnax.parallel.batch import batch_mesh, shard_batch
from harnax.parallel.sharding import (
    DEFAULT_RULES,
    MESH_AXES,
    constrain,
    current_mesh,
    logical_to_spec,
    make_mesh,
    module_shardings,
    shard_module,
    sharding_rules,
    tree_shardings,
)

__all__ = [
    "batch_mesh",
    "shard_batch",
    "DEFAULT_RULES",
    "MESH_AXES",
    "constrain",
    "current_mesh",
    "logical_to_spec",
    "make_mesh",
    "module_shardings",
    "shard_module",
    "sharding_rules",
    "tree_shardings",
]
