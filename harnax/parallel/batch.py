"""Sharding a batch of independent problems (MDPs, temperatures, policies).

Solvers take one problem; a batch is `jax.vmap` over a leading axis. On many
devices the same jitted function runs with that axis split over a mesh axis:
each device solves its slice, the while loops run independently per shard
(no collectives), and results come back sharded the same way.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np


def batch_mesh(axis: str = "data", devices=None) -> Mesh:
  """A 1-D mesh over `devices` (default: all) named `axis`."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  return Mesh(devices.reshape(-1), (axis,))


def shard_batch(tree: Any, mesh: Mesh, axis: str = "data") -> Any:
  """Places every leaf with its leading axis split over mesh axis `axis`.

  Raises:
    ValueError: a leaf has no leading axis, or its size is not divisible by
      the number of devices along `axis`.
  """
  if axis not in mesh.axis_names:
    raise ValueError(f"axis: expected one of the mesh axes {mesh.axis_names}, got {axis!r}")
  n = mesh.shape[axis]
  sharding = NamedSharding(mesh, PartitionSpec(axis))

  def place(path, x):
    shape = np.shape(x)
    if not shape or shape[0] % n:
      raise ValueError(
          f"{jax.tree_util.keystr(path) or 'leaf'}: expected a leading batch axis divisible by "
          f"{n} devices, got shape {list(shape)}")
    return jax.device_put(x, sharding)

  return jax.tree_util.tree_map_with_path(place, tree)
