"""Sample-mean estimates: their container, standard errors and percentile-bootstrap intervals.

Every estimator here averages i.i.d. per-sample values (per-state KL estimates,
per-rollout returns), so one interval serves them all: resample the values
with replacement, take the mean of each replicate, and report the
`(1 - confidence)/2` and `(1 + confidence)/2` quantiles of those means.
Both functions work under `jit` and `vmap` (`num_resamples` is static).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from harnax.core import validation as val

Array = jax.Array


class SampleEstimate(NamedTuple):
  """A Monte-Carlo estimate: the scaled mean of i.i.d. samples, its error and its cost.

  Attributes:
    value: the estimate, scalar (`M_hat` or `J_hat`).
    samples: `[n]`, the i.i.d. values whose mean, scaled, is `value`: per-state KL
      estimates (`estimate_mismatch`), per-rollout discounted KL sums
      (`every_step_mismatch`) or per-rollout discounted returns (`rollout_return`).
    stderr: standard error of `value` from the spread of `samples`.
    ci_low, ci_high: percentile-bootstrap interval at the requested `confidence`.
    truncation_bias: bound on `|E value - truth|` from capping rollouts (each
      estimator's docstring gives its form).
    env_steps: environment steps used (scalar int).
    action_samples: actions drawn through the deployed policy (scalar int).
  """

  value: Array
  samples: Array
  stderr: Array
  ci_low: Array
  ci_high: Array
  truncation_bias: Array
  env_steps: Array
  action_samples: Array


def check_values(name: str, values) -> Array:
  """A non-empty 1-D float array of per-sample values."""
  values = val.as_float_array(name, values)
  if values.ndim != 1:
    raise ValueError(f"{name}: expected a 1-D array of per-sample values, got shape "
                     f"{list(values.shape)}")
  if values.shape[0] == 0:
    raise ValueError(f"{name}: expected at least one sample, got an empty array")
  return values


def check_bootstrap_options(confidence, num_resamples) -> int:
  """`confidence` in (0, 1) (checked when concrete) and `num_resamples >= 1`."""
  c = val.host(confidence)
  if c is not None and not 0.0 < float(c) < 1.0:
    raise ValueError(f"confidence: expected a level in (0, 1), got {confidence}")
  return val.check_count("num_resamples", num_resamples)


def standard_error(values) -> Array:
  """`std(values, ddof=1) / sqrt(n)`; `+inf` for a single value. `[n]` -> scalar."""
  values = check_values("values", values)
  n = values.shape[0]
  if n < 2:
    return jnp.asarray(jnp.inf, values.dtype)
  return jnp.std(values, ddof=1) / jnp.sqrt(n)


@functools.partial(jax.jit, static_argnames=("num_resamples",))
def _percentile_interval(key, values, confidence, num_resamples):
  n = values.shape[0]
  idx = jax.random.randint(key, (num_resamples, n), 0, n)
  means = jnp.mean(values[idx], axis=-1)
  alpha = (1.0 - confidence) / 2.0
  return jnp.quantile(means, alpha), jnp.quantile(means, 1.0 - alpha)


def bootstrap_ci(key, values, *, confidence: float = 0.9, num_resamples: int = 1000,
                 scale=1.0) -> tuple[Array, Array]:
  """Percentile-bootstrap interval for `scale * mean(values)`, resampling the values.

  Args:
    key: a `jax.random` key.
    values: `[n]` i.i.d. per-sample values, n >= 1.
    confidence: nominal coverage in (0, 1).
    num_resamples: bootstrap replicates (static).
    scale: multiplies the interval (e.g. `tau/(1-gamma)`), > 0.

  Returns:
    `(low, high)` scalars.
  """
  values = check_values("values", values)
  num_resamples = check_bootstrap_options(confidence, num_resamples)
  lo, hi = _percentile_interval(key, values, confidence, num_resamples=num_resamples)
  return scale * lo, scale * hi
