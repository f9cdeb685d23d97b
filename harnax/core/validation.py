"""Checks at the public edges: shapes always, values whenever they are concrete.

Shapes are static, so they are checked even under `jit`/`vmap`. Values are
checked only for concrete arrays (NumPy, or JAX arrays outside a trace): a
traced value cannot be inspected without a host round trip, and public
functions document that they propagate NaN instead.
Every failure is a `ValueError` that names the field and what was expected.

The checks on MDP containers (`check_mdp`, `check_single_mdp`) live beside the
containers in `mdp.py`; this module knows only arrays and numbers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
  """True when `x`'s values can be read on the host without tracing."""
  return not isinstance(x, jax.core.Tracer)


def float_dtype(x: Any) -> jnp.dtype:
  """The float dtype to compute in: `x`'s own if floating, else JAX's default."""
  dtype = getattr(x, "dtype", None)
  if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
    return jax.dtypes.canonicalize_dtype(dtype)
  return jax.dtypes.canonicalize_dtype(jnp.float64)


def as_float_array(name: str, x: Any, dtype=None) -> jax.Array:
  """Converts to a JAX float array; raises if `x` is not numeric."""
  if x is None:
    raise ValueError(f"{name}: expected an array, got None")
  try:
    arr = jnp.asarray(x)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: expected a numeric array, got {type(x).__name__}") from e
  if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
          or arr.dtype == jnp.bool_):
    raise ValueError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
  return arr.astype(dtype if dtype is not None else float_dtype(arr))


def host(x: Any) -> np.ndarray | None:
  """A NumPy view of `x` when concrete, else None (value checks are skipped)."""
  if not is_concrete(x):
    return None
  return np.asarray(x)


def stochastic_atol(dtype) -> float:
  """Tolerance on row sums: loose enough for float32 data written by hand."""
  return 1e-5 if jnp.finfo(dtype).bits <= 32 else 1e-9


def check_shape(name: str, x: Any, expected: tuple, what: str = "") -> None:
  """`expected` may contain None for free dimensions."""
  shape = tuple(np.shape(x))
  ok = len(shape) == len(expected) and all(
      e is None or e == s for e, s in zip(expected, shape))
  if not ok:
    exp = "[" + ", ".join("?" if e is None else str(e) for e in expected) + "]"
    suffix = f" ({what})" if what else ""
    raise ValueError(f"{name}: expected shape {exp}{suffix}, got {list(shape)}")


def check_finite(name: str, x: Any) -> None:
  v = host(x)
  if v is not None and not np.all(np.isfinite(v)):
    bad = np.argwhere(~np.isfinite(v))[0]
    raise ValueError(
        f"{name}: expected finite values, found {v[tuple(bad)]} at index "
        f"{tuple(int(i) for i in bad)}")


def check_temperature(tau: Any, *, scalar: bool = False) -> None:
  """τ > 0 and finite (scalar or a batch under vmap); `scalar=True` also wants rank 0."""
  if scalar and jnp.ndim(tau) != 0:
    raise ValueError(f"tau: expected a scalar (vmap over a batch), got shape "
                     f"{list(jnp.shape(tau))}")
  v = host(tau)
  if v is None:
    return
  if not np.all(np.isfinite(v)) or not np.all(v > 0):
    raise ValueError(f"tau: expected a finite temperature > 0, got {v}")


def check_discount(gamma: Any) -> None:
  v = host(gamma)
  if v is None:
    return
  if not np.all(np.isfinite(v)) or not np.all((v >= 0) & (v < 1)):
    raise ValueError(f"discount: expected 0 <= gamma < 1, got {v}")


def check_distribution(name: str, x: Any, axis: int = -1) -> None:
  """Non-negative, finite and summing to one along `axis`."""
  v = host(x)
  if v is None:
    return
  check_finite(name, v)
  if np.any(v < 0):
    bad = np.argwhere(v < 0)[0]
    raise ValueError(
        f"{name}: expected non-negative probabilities, found {v[tuple(bad)]} at index "
        f"{tuple(int(i) for i in bad)}")
  sums = v.sum(axis=axis)
  atol = stochastic_atol(v.dtype if np.issubdtype(v.dtype, np.floating) else np.float64)
  off = np.abs(sums - 1.0) > atol * max(1, v.shape[axis] ** 0.5)
  if np.any(off):
    bad = tuple(int(i) for i in np.argwhere(off)[0])
    raise ValueError(
        f"{name}: expected probabilities summing to 1 over axis {axis}; the slice at "
        f"index {bad} sums to {float(sums[bad]):.6g}")


def check_reference_policy(pi_ref: Any, num_states: int, num_actions: int) -> None:
  """π_ref[s, a] ≥ 0, each row a distribution with at least one available action."""
  check_shape("pi_ref", pi_ref, (num_states, num_actions), "[num_states, num_actions]")
  v = host(pi_ref)
  if v is None:
    return
  check_finite("pi_ref", v)
  if np.any(v < 0):
    raise ValueError("pi_ref: expected non-negative probabilities (0 marks an unavailable action)")
  empty = ~np.any(v > 0, axis=-1)
  if np.any(empty):
    raise ValueError(
        f"pi_ref: every state needs at least one available action; state "
        f"{int(np.argwhere(empty)[0][0])} has none")
  check_distribution("pi_ref", v)


def check_policy(policy: Any, pi_ref: Any, num_states: int, num_actions: int,
                 name: str = "policy") -> None:
  """A distribution per state that puts no mass on actions π_ref marks unavailable."""
  check_shape(name, policy, (num_states, num_actions), "[num_states, num_actions]")
  check_distribution(name, policy)
  p, r = host(policy), host(pi_ref)
  if p is None or r is None:
    return
  leak = (r <= 0) & (p > 0)
  if np.any(leak):
    s, a = (int(i) for i in np.argwhere(leak)[0])
    raise ValueError(
        f"{name}: puts mass {float(p[s, a]):.3g} on action {a} in state {s}, which pi_ref "
        "marks unavailable (pi_ref[s, a] == 0)")


def check_count(name: str, n: Any, minimum: int = 1) -> int:
  """A Python integer `>= minimum` (a static size: a sample count, a horizon)."""
  if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
    raise ValueError(f"{name}: expected an integer >= {minimum}, got {n!r}")
  if n < minimum:
    raise ValueError(f"{name}: expected an integer >= {minimum}, got {n}")
  return int(n)


def check_index(name: str, x: Any, size: int, what: str) -> jax.Array:
  """An integer array of `what` indices in `[0, size)`, as int32.

  The dtype is checked always, the range when `x` is concrete.
  """
  arr = jnp.asarray(x)
  if not jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == jnp.bool_:
    raise ValueError(f"{name}: expected integer {what} indices, got dtype {arr.dtype}")
  v = host(arr)
  if v is not None and (np.any(v < 0) or np.any(v >= size)):
    bad = int(v[(v < 0) | (v >= size)].reshape(-1)[0])
    raise ValueError(f"{name}: expected {what} indices in [0, {size}), got {bad}")
  return arr.astype(jnp.int32)


def check_policy_array(name: str, policy: Any, num_states: int, num_actions: int,
                       dtype) -> jax.Array:
  """`[S, A]` rows that are distributions, as a float array of `dtype`.

  Unlike `check_policy`, no reference policy constrains the support (samplers
  accept any policy of the MDP).
  """
  check_shape(name, policy, (num_states, num_actions), "[num_states, num_actions]")
  check_distribution(name, policy)
  return as_float_array(name, policy, dtype)
