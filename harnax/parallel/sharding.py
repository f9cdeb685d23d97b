"""Logical axis names -> mesh axes: the one place where sharding is decided.

Code annotates arrays with *logical* axis names (``("embed", "mlp")`` on a weight,
``("batch", "seq", "act_embed")`` on an activation). A rules table maps each logical name to a
mesh axis (or a tuple of them, or None = replicated). The same model then runs data-parallel,
FSDP or tensor-parallel by changing only the rules and the mesh.

Two safety valves keep tiny test models and odd shapes legal: a dimension whose size is not
divisible by its mesh axes is replicated, and a mesh axis is used at most once per array.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")

LogicalAxes = tuple[str | None, ...]
Rules = Mapping[str, str | tuple[str, ...] | None]

# Parameters: FSDP shards the model dimension, tensor parallelism the heads / MLP / vocab
# dimension. Activations: the batch is split over every data-like axis.
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    # parameter axes
    "embed": "fsdp",
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "experts": None,
    "head_dim": None,
    "norm": None,
    # activation axes
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": None,
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    "cache_seq": None,
}


def make_mesh(shape: Mapping[str, int] | Sequence[int], devices=None) -> Mesh:
  """Builds a ``Mesh`` with axes ``(data, fsdp, tensor)``.

  Args:
    shape: sizes per axis, as a dict (missing axes get 1) or a 3-sequence. The product must
      equal the number of devices used.
    devices: devices to use; defaults to all of ``jax.devices()``.
  """
  if isinstance(shape, Mapping):
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
      raise ValueError(f"shape: unknown mesh axes {sorted(unknown)}; expected {MESH_AXES}")
    sizes = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
  else:
    sizes = tuple(int(s) for s in shape)
    if len(sizes) != len(MESH_AXES):
      raise ValueError(f"shape: expected {len(MESH_AXES)} sizes for {MESH_AXES}, got {sizes}")
  devices = list(jax.devices() if devices is None else devices)
  if math.prod(sizes) != len(devices):
    raise ValueError(f"shape: mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                     f"{len(devices)} given")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None] | None, shape: Sequence[int] | None, mesh: Mesh,
                    rules: Rules = DEFAULT_RULES) -> PartitionSpec:
  """Maps logical axis names to a ``PartitionSpec`` on ``mesh``.

  Args:
    axes: one logical name (or None) per array dimension; None means fully replicated.
    shape: the array shape, used to replicate dimensions not divisible by their mesh axes.
    mesh: the target mesh.
    rules: logical name -> mesh axis / tuple of mesh axes / None.
  """
  if axes is None:
    return PartitionSpec()
  if shape is not None and len(axes) != len(shape):
    raise ValueError(f"axes: {tuple(axes)} has {len(axes)} names for an array of shape "
                     f"{tuple(shape)}")
  used: set[str] = set()
  spec = []
  for i, name in enumerate(axes):
    target = rules.get(name) if name is not None else None
    mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
    mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape and a not in used)
    size = math.prod(mesh.shape[a] for a in mesh_axes)
    if shape is not None and shape[i] % size:
      mesh_axes = ()  # not divisible: replicate rather than fail
    used.update(mesh_axes)
    if not mesh_axes:
      spec.append(None)
    else:
      spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return PartitionSpec(*spec)


@dataclasses.dataclass(frozen=True)
class _Context:
  mesh: Mesh
  rules: Rules


_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar("harnax_sharding",
                                                                           default=None)


@contextlib.contextmanager
def sharding_rules(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
  """Within this context :func:`constrain` applies sharding constraints (at trace time)."""
  token = _CONTEXT.set(_Context(mesh, dict(rules)))
  try:
    yield
  finally:
    _CONTEXT.reset(token)


def current_mesh() -> Mesh | None:
  ctx = _CONTEXT.get()
  return None if ctx is None else ctx.mesh


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Annotates an activation with logical axes; identity outside :func:`sharding_rules`."""
  ctx = _CONTEXT.get()
  if ctx is None:
    return x
  spec = logical_to_spec(axes, x.shape, ctx.mesh, ctx.rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(ctx.mesh, spec))


def tree_shardings(abstract_tree: Any, axes_tree: Any, mesh: Mesh,
                   rules: Rules = DEFAULT_RULES) -> Any:
  """``NamedSharding`` for every leaf of ``abstract_tree`` given a matching tree of axes.

  ``axes_tree`` holds a tuple of logical names (or None) per leaf, with the same structure.
  """
  def is_axes(a):
    return a is None or (isinstance(a, tuple) and all(
        isinstance(n, (str, type(None))) for n in a))

  flat_axes = jax.tree.leaves(axes_tree, is_leaf=is_axes)
  leaves, treedef = jax.tree.flatten(abstract_tree)
  if len(flat_axes) != len(leaves):
    raise ValueError(f"axes_tree: {len(flat_axes)} entries for {len(leaves)} leaves")
  out = [NamedSharding(mesh, logical_to_spec(a, tuple(x.shape), mesh, rules))
         for a, x in zip(flat_axes, leaves)]
  return jax.tree.unflatten(treedef, out)


def module_shardings(module, mesh: Mesh,
                     rules: Rules = DEFAULT_RULES) -> dict[tuple, NamedSharding]:
  """``{param path: NamedSharding}`` from the ``axes`` metadata of a Flax NNX module's variables.

  Variables without ``axes`` metadata are replicated.
  """
  from flax import nnx  # parallel itself does not need flax; only module helpers do

  out = {}
  for path, var in nnx.to_flat_state(nnx.state(module)):
    value = var.get_value()
    axes = var.get_metadata().get("axes")
    out[path] = NamedSharding(mesh, logical_to_spec(axes, value.shape, mesh, rules))
  return out


def shard_module(module, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Moves every variable of an NNX module to its sharded layout (in place); returns it."""
  from flax import nnx

  shardings = module_shardings(module, mesh, rules)
  flat = nnx.to_flat_state(nnx.state(module))
  placed = nnx.from_flat_state([
      (path, var.replace(value=jax.device_put(var.get_value(), shardings[path])))
      for path, var in flat])
  nnx.update(module, placed)
  return module
