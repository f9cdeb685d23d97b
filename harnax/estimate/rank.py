"""Rank statistics for predicted vs realized gains: Spearman and Kendall tau-b.

Both handle ties (average ranks; tau-b's tie correction) and are O(n^2) pure
`jnp` functions, fine for the tens of harnesses or swaps they compare; they
work under `jit` and `vmap`. Undefined cases (a constant input) give NaN, as
scipy does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax.core import validation as val

Array = jax.Array


def _check(x, y):
  x = val.as_float_array("x", x)
  y = val.as_float_array("y", y, x.dtype)
  if x.ndim != 1:
    raise ValueError(f"x: expected a 1-D array, got shape {list(x.shape)}")
  if y.shape != x.shape:
    raise ValueError(f"y: expected shape {list(x.shape)} like x, got {list(y.shape)}")
  if x.shape[0] < 2:
    raise ValueError(f"x: expected at least 2 paired values, got {x.shape[0]}")
  val.check_finite("x", x)
  val.check_finite("y", y)
  return x, y


def average_ranks(x) -> Array:
  """1-based ranks with ties given their average rank, `[n]` -> `[n]`."""
  return _average_ranks(jnp.asarray(x))


@jax.jit
def _average_ranks(x):
  less = jnp.sum(x[None, :] < x[:, None], axis=-1)
  equal = jnp.sum(x[None, :] == x[:, None], axis=-1)
  return less + (equal + 1) / 2.0


def spearman(x, y) -> Array:
  """Spearman's rho: the Pearson correlation of the average ranks. Scalar."""
  return _spearman(*_check(x, y))


@jax.jit
def _spearman(x, y):
  rx, ry = _average_ranks(x), _average_ranks(y)
  rx, ry = rx - jnp.mean(rx), ry - jnp.mean(ry)
  return jnp.sum(rx * ry) / jnp.sqrt(jnp.sum(rx ** 2) * jnp.sum(ry ** 2))


def kendall_tau_b(x, y) -> Array:
  """Kendall's tau-b: `(C - D) / sqrt((n0 - n1)(n0 - n2))`.

  C, D: concordant and discordant pairs; n0 = n(n-1)/2; n1, n2: pairs tied in
  x and in y. Scalar.
  """
  return _kendall_tau_b(*_check(x, y))


@jax.jit
def _kendall_tau_b(x, y):
  sx = jnp.sign(x[:, None] - x[None, :])
  sy = jnp.sign(y[:, None] - y[None, :])
  n = x.shape[0]
  n0 = n * (n - 1) / 2.0
  s = jnp.sum(sx * sy) / 2.0
  n1 = (jnp.sum(sx == 0) - n) / 2.0
  n2 = (jnp.sum(sy == 0) - n) / 2.0
  return s / jnp.sqrt((n0 - n1) * (n0 - n2))
