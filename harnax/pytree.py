"""The one pytree container mechanism of harnax: check on construction, never on rebuild.

Every container in the library (MDPs, harnesses, KV caches, generation and scoring
results) is a `container`. It sits below every layer: core, harness and models use it.

A container such as `TabularMDP` must reject bad input when a user builds it,
yet JAX rebuilds it from leaves all the time: `jit` with tracers, `vmap` with
`in_axes` specs (`TabularMDP.axes(transitions=None)` holds `None` and ints),
`tree_map` with whatever the mapped function returns, and
`jax.tree_util` with `object()` sentinels. Those rebuilt values are not
arrays of the right shape, so validation must not run on them.

`flax.struct.dataclass` (and `chex.dataclass`) rebuild by calling the class,
i.e. `__init__` and `__post_init__`, so a check placed there runs on tracers
and `in_axes` specs too. `container` registers a frozen dataclass whose own
`__init__` validates, and whose unflatten fills the fields directly, without
calling it. Fields declared `field(static=True)` are metadata (hashable,
compared by `jit`'s cache) rather than leaves, as `flax.struct.field(
pytree_node=False)` does.

Usage:

  @pytree.container
  class Box:
    values: jax.Array
    label: str = pytree.field(static=True)

    def __init__(self, *, values, label="box"):
      ...  # validate, convert
      pytree.set_fields(self, values=values, label=label)
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

T = TypeVar("T")

_STATIC = "harnax_static"


def field(*, static: bool = False, **kwargs) -> Any:
  """A dataclass field; `static=True` makes it metadata instead of a pytree leaf."""
  return dataclasses.field(metadata={_STATIC: static}, **kwargs)


def set_fields(obj: Any, **fields) -> None:
  """Assigns fields of a frozen container (for its `__init__`)."""
  for name, value in fields.items():
    object.__setattr__(obj, name, value)


def container(cls: type[T]) -> type[T]:
  """Makes `cls` a frozen dataclass and a pytree whose unflatten skips `__init__`.

  `cls` defines its own keyword `__init__` (which validates and ends with
  `set_fields`), and may define `__repr__`. The decorator adds
  `replace(**changes)`, a validated copy through `__init__`.
  """
  cls = dataclasses.dataclass(frozen=True, eq=False)(cls)
  fields = dataclasses.fields(cls)
  data = tuple(f.name for f in fields if not f.metadata.get(_STATIC, False))
  meta = tuple(f.name for f in fields if f.metadata.get(_STATIC, False))

  def flatten_with_keys(obj):
    children = [(jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in data]
    return children, tuple(getattr(obj, n) for n in meta)

  def flatten(obj):
    return [getattr(obj, n) for n in data], tuple(getattr(obj, n) for n in meta)

  def unflatten(aux, leaves):
    obj = object.__new__(cls)
    set_fields(obj, **dict(zip(data, leaves)), **dict(zip(meta, aux)))
    return obj

  def replace(self, **changes):
    values = {f.name: getattr(self, f.name) for f in fields}
    unknown = set(changes) - set(values)
    if unknown:
      raise ValueError(f"replace: {cls.__name__} has no fields {sorted(unknown)}")
    values.update(changes)
    return cls(**values)

  cls.replace = replace
  jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
  return cls


def unvalidated(cls: type[T], **fields) -> T:
  """An instance of a `container` built from its fields without running `__init__`.

  For values that are not data (e.g. an `in_axes` spec) and for results already
  known to be valid (e.g. the dense form of a validated sparse MDP).
  """
  names = {f.name for f in dataclasses.fields(cls)}
  if set(fields) != names:
    raise ValueError(f"fields: {cls.__name__} needs exactly {sorted(names)}, got "
                     f"{sorted(fields)}")
  obj = object.__new__(cls)
  set_fields(obj, **fields)
  return obj
