"""Meshes and sharding rules shared by solvers and models."""

from harnax.parallel.batch import batch_mesh
from harnax.parallel.batch import shard_batch
from harnax.parallel.sharding import DEFAULT_RULES
from harnax.parallel.sharding import MESH_AXES
from harnax.parallel.sharding import constrain
from harnax.parallel.sharding import current_mesh
from harnax.parallel.sharding import logical_to_spec
from harnax.parallel.sharding import make_mesh
from harnax.parallel.sharding import module_shardings
from harnax.parallel.sharding import shard_module
from harnax.parallel.sharding import sharding_rules
from harnax.parallel.sharding import tree_shardings

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
