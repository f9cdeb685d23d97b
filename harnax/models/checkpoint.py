"""Orbax save/restore of NNX model state for training runs.

The HF safetensors format (:mod:`harnax.models.hf`) is for exchange with other tools; this is
the native, shard-aware format for resuming training: any pytree of arrays (params, optimizer
state) saved as a plain nested dict, restored into the shardings of an abstract target.
"""

from __future__ import annotations

import os
from typing import Any

from flax import nnx
import jax


def _orbax():
  # Imported on first use: orbax (with tensorstore) adds about 25 MB of resident memory to
  # every process that imports harnax.models, most of which never checkpoint.
  import orbax.checkpoint as ocp
  return ocp


def save_state(directory: str, tree: Any) -> None:
  """Saves a pytree (e.g. ``nnx.state(model)`` or ``{"params": ..., "opt": ...}``).

  ``directory`` must not exist yet (orbax refuses to overwrite a checkpoint).
  """
  if isinstance(tree, nnx.Module):
    tree = nnx.state(tree)
  tree = _pure(tree)
  checkpointer = _orbax().StandardCheckpointer()
  checkpointer.save(os.path.abspath(directory), tree)
  checkpointer.wait_until_finished()


def restore_state(directory: str, target: Any) -> Any:
  """Restores into the structure, dtypes and shardings of ``target``.

  Args:
    target: an ``nnx.Module`` (restored in place and returned), an ``nnx.State``, or a pytree
      of arrays / ``jax.ShapeDtypeStruct`` (with ``.sharding`` to restore sharded).
  """
  module = target if isinstance(target, nnx.Module) else None
  state = nnx.state(target) if module is not None else target
  abstract = jax.tree.map(_abstract, _pure(state))
  restored = _orbax().StandardCheckpointer().restore(os.path.abspath(directory), abstract)
  if isinstance(state, nnx.State):
    nnx.replace_by_pure_dict(state, restored)
    if module is not None:
      nnx.update(module, state)
      return module
    return state
  return restored


def _pure(tree):
  if isinstance(tree, nnx.State):
    return nnx.to_pure_dict(tree)
  if isinstance(tree, dict):
    return {k: _pure(v) for k, v in tree.items()}
  return tree


def _abstract(x):
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
