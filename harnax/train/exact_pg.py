"""Exact policy-gradient training: optax ascent on a return computed without sampling.

The objective is any differentiable `J(params, data)`: typically the exact regularized
return `J(Pi_theta) = mu0^T (I - gamma P_Pi)^{-1} c_Pi` of a policy read through a
harness, whose gradient `jax.grad` gives exactly (a linear solve differentiated as a
linear solve; docs/theory.md, "Exact policy gradient"). `fit` runs `num_steps` optax
updates in one `lax.scan`, so one call is one compiled program, and reports `J` before
every step (and, with `keep_path`, the parameters before every step: the training
trajectory a study evaluates checkpoint by checkpoint).

`data` is an argument rather than a closure so that problems of one shape (the
instances of a task family padded to one size, every harness of a family) share one
compilation; `objective` and `optimizer` are static, so build them once and pass the
same objects on every call.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from harnax.core import evaluation
from harnax.core import validation as val
from harnax.harness import interface
from harnax.policies import log_linear

Array = jax.Array
Objective = Callable[[Any, Any], Array]


class FitResult(NamedTuple):
  """The outcome of `fit`.

  Attributes:
    params: the trained parameters (the best ones seen when `keep_best`).
    values: `[num_steps]`, `J` at the parameters *before* each step.
    final_value: scalar, `J(params)` of the returned parameters.
    path: with `fit(..., keep_path=True)`, the parameters *before* each step, every leaf
      stacked on a leading axis `[num_steps, ...]` (so `values[k] = J(path[k])`, and the
      last parameters are `params` when `keep_best` is off); None otherwise.
  """

  params: Any
  values: Array
  final_value: Array
  path: Any = None


def fit(objective: Objective, params, data=None, *, optimizer: optax.GradientTransformation,
        num_steps: int, keep_best: bool = False, keep_path: bool = False) -> FitResult:
  """Maximizes `objective(params, data)` by `num_steps` optax updates of its exact gradient.

  Args:
    objective: `(params, data) -> scalar J` to maximize; differentiable in `params`.
    params: initial parameters (any pytree), e.g. a trained model to adapt.
    data: a pytree of arrays the objective reads (the MDPs, features, decoders, ...).
    optimizer: an optax transformation (it minimizes: `fit` feeds it `-grad J`).
    num_steps: number of updates (0 returns `params` unchanged).
    keep_best: return the parameters with the largest `J` seen (including the final
      ones) instead of the last ones, so training never ends below where it started.
    keep_path: also return the parameters before every step (`FitResult.path`); costs
      `num_steps` copies of the parameters, so meant for small models.

  Returns:
    `FitResult(params, values [num_steps], final_value, path)`.
  """
  if not callable(objective):
    raise ValueError(f"objective: expected a callable (params, data) -> J, got {objective!r}")
  if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise ValueError(f"optimizer: expected an optax GradientTransformation, got {optimizer!r}")
  if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
    raise ValueError(f"num_steps: expected a non-negative int, got {num_steps!r}")
  return _fit(objective, optimizer, num_steps, bool(keep_best), bool(keep_path), params, data)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _fit(objective, optimizer, num_steps, keep_best, keep_path, params, data):
  value_and_grad = jax.value_and_grad(objective)

  def step(carry, _):
    p, state, best_p, best_v = carry
    v, g = value_and_grad(p, data)
    updates, state = optimizer.update(jax.tree.map(jnp.negative, g), state, p)
    better = v > best_v
    best_p = jax.tree.map(lambda new, old: jnp.where(better, new, old), p, best_p)
    best_v = jnp.where(better, v, best_v)
    return (optax.apply_updates(p, updates), state, best_p, best_v), ((v, p) if keep_path else v)

  dtype = jnp.result_type(*jax.tree.leaves(params)) if jax.tree.leaves(params) else jnp.float32
  init = (params, optimizer.init(params), params, jnp.asarray(-jnp.inf, dtype))
  (last, _, best_p, best_v), ys = jax.lax.scan(step, init, None, length=num_steps)
  values, path = ys if keep_path else (ys, None)
  last_v = objective(last, data)
  if not keep_best:
    return FitResult(params=last, values=values, final_value=last_v, path=path)
  better = last_v >= best_v
  out = jax.tree.map(lambda a, b: jnp.where(better, a, b), last, best_p)
  return FitResult(params=out, values=values, final_value=jnp.maximum(last_v, best_v),
                   path=path)


@functools.lru_cache(maxsize=None)
def _semantic_return(num_actions: int, invalid: str, noop_action: int | None) -> Objective:
  # One object per static configuration: `fit` compiles once per objective.
  def objective(theta, data):
    mdp, pi_ref, decode_table, features, tau = data
    policy = log_linear.semantic_policy(theta, features, decode_table, num_actions=num_actions,
                                        invalid=invalid, noop_action=noop_action)
    return evaluation.evaluate_policy(mdp, policy, pi_ref, tau).value
  return objective


@functools.lru_cache(maxsize=None)
def adam(learning_rate: float) -> optax.GradientTransformation:
  """`optax.adam(learning_rate)`, one object per step size (so `fit` compiles once)."""
  return optax.adam(learning_rate)


def fit_log_linear(harness: interface.TabularHarness, features, tau, *, theta=None,
                   num_steps: int = 300, learning_rate: float = 0.5, invalid: str = "noop",
                   keep_best: bool = True) -> FitResult:
  """Trains a log-linear text policy on one harness by exact policy gradient (Adam).

  Maximizes `J_H(Pi_H(theta))`, the exact regularized return of the policy read
  through `harness` (`harnax.policies.log_linear.semantic_policy`). Start from `theta`
  to adapt a model trained elsewhere; with `keep_best` (the default) the result is
  never below the model it started from.

  Args:
    harness: the `TabularHarness` to train on.
    features: `[S, O, D]` text features of the harness's encoded states.
    tau: temperature > 0.
    theta: initial weights `[D]` (zeros if None).
    num_steps: Adam steps.
    learning_rate: Adam step size.
    invalid: `"noop"` (invalid outputs execute the harness's no-op) or `"renormalize"`.
    keep_best: see `fit`.

  Returns:
    `FitResult`; `.params` are the weights `[D]`.
  """
  dtype = harness.pi_ref.dtype
  features = jnp.asarray(features, dtype)
  if features.ndim != 3 or features.shape[:2] != (harness.num_states, harness.num_outputs):
    raise ValueError(f"features: expected shape [{harness.num_states}, {harness.num_outputs}, D] "
                     f"(states x candidate outputs of the harness), got {list(features.shape)}")
  val.check_temperature(tau)
  theta = (jnp.zeros(features.shape[-1], dtype) if theta is None
           else jnp.asarray(theta, dtype))
  if theta.shape != features.shape[-1:]:
    raise ValueError(f"theta: expected shape [{features.shape[-1]}] (the feature dimension), "
                     f"got {list(theta.shape)}")
  noop = harness.noop_action if invalid == "noop" else None
  objective = _semantic_return(harness.num_actions, invalid, noop)
  data = (harness.mdp, harness.pi_ref, harness.decode_table, features, jnp.asarray(tau, dtype))
  return fit(objective, theta, data, optimizer=adam(float(learning_rate)), num_steps=num_steps,
             keep_best=keep_best)
