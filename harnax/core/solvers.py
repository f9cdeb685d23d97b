"""Soft-Bellman solvers with certified error bounds and implicit gradients.

Three methods reach the same fixed point `V* = T V*` (see `bellman.py`):

* `"value_iteration"` — relative value iteration `h <- T h - mean(T h)`.
* `"anderson"` — Anderson acceleration (memory m) of the same map.
* `"policy_iteration"` — soft policy iteration, i.e. Newton's method on
  `V - T V` (Jacobian `I - gamma P_pi`): each step takes the soft-greedy policy
  of the certified midpoint (one sweep from `h_k`) and evaluates it exactly,
  `h_{k+1} = V^{pi_k}` centred. Quadratic locally.

All three iterate on centred values and certify every iterate with MacQueen's
bounds (`fixed_point.py`): the returned `v` is within `error_bound` of `V*` in
sup-norm. The loop stops on the bound, on a stall at the rounding floor, or at
`max_iters`; nothing leaves the device per sweep.

Differentiation: the returned `V*` is wrapped in a `custom_jvp` that applies the
implicit function theorem at the fixed point,
`dV* = (I - gamma P_{pi*})^{-1} (dT)(V*)`, so gradients w.r.t. rewards,
transitions, discount, `tau` and `pi_ref` cost one linear solve and never
differentiate through the loop.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harnax.core import bellman
from harnax.core import fixed_point
from harnax.core import linear
from harnax.core import mdp as mdp_lib
from harnax.core import validation as val

Array = jax.Array

METHODS = ("auto", "value_iteration", "anderson", "policy_iteration")

# Dense MDPs up to this many states default to policy iteration (an O(S^3)
# solve per step is cheap there); larger or sparse ones to value iteration.
_AUTO_NEWTON_MAX_STATES = 1024


class SoftBellmanSolution(NamedTuple):
  """The regularized optimum of one MDP.

  Attributes:
    v: `V*`, `[S]`.
    q: `Q* = r + gamma P V*`, `[S, A]`.
    scores: `F* = Q* + tau log pi_ref`, `[S, A]` (`-inf` where unavailable).
    policy: `pi* = softmax(F* / tau)`, `[S, A]`.
    iterations: sweeps (value iteration, Anderson) or Newton steps used.
    error_bound: `||v - V*||_inf` bound: MacQueen's certificate plus an allowance
      for rounding sized from the magnitudes involved (not interval arithmetic).
    converged: `error_bound <= tol`.
  """

  v: Array
  q: Array
  scores: Array
  policy: Array
  iterations: Array
  error_bound: Array
  converged: Array


class _Config(NamedTuple):
  method: str
  tol: float
  max_iters: int
  memory: int
  patience: int
  hard: bool


def _operator(mdp, pi_ref, tau, hard):
  if hard:
    return lambda h: bellman.hard_bellman_operator(mdp, h, pi_ref)
  return lambda h: bellman.soft_bellman_operator(mdp, h, pi_ref, tau)


def _policy_iteration(mdp, pi_ref, tau, apply_t, gamma, h0, cfg):
  """Newton steps in correction form, each raced against one sweep.

  From `V = h + kappa/(1-gamma)` with `Delta = T V - V` (the certificate's
  residual) and `pi` soft-greedy at `V`, Newton's step is
  `V + (I - gamma P_pi)^{-1} Delta` = `V^pi`. Solving for the correction keeps
  the solve's rounding relative to `|Delta|`, not to `|V|`, so float32 Newton
  converges to the certificate's floor. The sweep candidate is cheap insurance
  far from the solution (Newton is only locally quadratic); the better
  certified candidate is kept. Each step: one linear solve and two sweeps.
  """
  def certified(h):
    g, _, bound, v_mid = fixed_point.certify(apply_t, h, gamma)
    return g, bound, v_mid

  def newton(h, g):
    pi = bellman.soft_policy(bellman.q_values(mdp, h), pi_ref, tau)
    h_new = h + linear.solve_policy_system(mdp, pi, g - h)
    return h_new - jnp.mean(h_new)

  def step(h, cert):
    g = cert[0]
    h_newton = newton(h, g)
    cert_newton, cert_sweep = certified(h_newton), certified(g)
    take_newton = cert_newton[1] <= cert_sweep[1]
    pick = lambda a, b: jnp.where(take_newton, a, b)  # noqa: E731
    h_next = pick(h_newton, g)
    cert_next = jax.tree.map(pick, cert_newton, cert_sweep)
    return h_next, cert_next, cert_next[1], cert_next[2]

  return fixed_point.run(step, h0, certified(h0), cfg)


def _fixed_point_loop(mdp, pi_ref, tau, cfg: _Config):
  gamma = mdp.discount
  h0 = jnp.zeros(mdp.num_states, mdp.rewards.dtype)
  apply_t, offset = fixed_point.shift_rewards(_operator(mdp, pi_ref, tau, cfg.hard), h0, gamma)
  if cfg.method == "value_iteration":
    v, k, bound = fixed_point.value_iteration(apply_t, gamma, h0, cfg)
  elif cfg.method == "anderson":
    v, k, bound = fixed_point.anderson(apply_t, gamma, h0, cfg)
  else:
    v, k, bound = _policy_iteration(mdp, pi_ref, tau, apply_t, gamma, h0, cfg)
  return v + offset, k, bound


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _soft_fixed_point(mdp, pi_ref, tau, cfg):
  v, k, bound = _fixed_point_loop(mdp, pi_ref, tau, cfg)
  return v, (k, bound)


@_soft_fixed_point.defjvp
def _soft_fixed_point_jvp(cfg, primals, tangents):
  mdp, pi_ref, tau = primals
  v, k, bound = _fixed_point_loop(mdp, pi_ref, tau, cfg)
  aux = (k, bound)
  # dV* = (I - gamma P_{pi*})^{-1} (dT)(V*)  (implicit function theorem).
  _, d_t = jax.jvp(lambda m, p, t: bellman.soft_bellman_operator(m, v, p, t), primals, tangents)
  policy = bellman.soft_policy(bellman.q_values(mdp, v), pi_ref, tau)
  dv = linear.solve_policy_system(mdp, policy, d_t)
  aux_tangent = (np.zeros((), jax.dtypes.float0), jnp.zeros_like(aux[1]))
  return (v, aux), (dv, aux_tangent)


def _check_inputs(mdp, pi_ref, tau):
  mdp_lib.check_mdp(mdp)
  if mdp.rewards.ndim != 2:
    raise ValueError(
        f"mdp: expected one MDP (rewards [S, A]); got batch shape "
        f"{tuple(mdp.rewards.shape[:-2])} — map over the batch with jax.vmap")
  val.check_reference_policy(pi_ref, mdp.num_states, mdp.num_actions)


def _as_dtype(x, dtype, name):
  return val.as_float_array(name, x, dtype)


def _resolve_method(mdp, method):
  if method not in METHODS:
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
  if method != "auto":
    return method
  if isinstance(mdp, mdp_lib.TabularMDP) and mdp.num_states <= _AUTO_NEWTON_MAX_STATES:
    return "policy_iteration"
  return "value_iteration"


def _default_max_iters(method):
  return {"value_iteration": 100_000, "anderson": 20_000, "policy_iteration": 100}[method]


def _default_patience(method, memory):
  return {"value_iteration": 20, "anderson": 4 * memory + 20, "policy_iteration": 10}[method]


def solve_soft_bellman(mdp: mdp_lib.AnyMDP, pi_ref, tau, *, method: str = "auto",
                       tol: float = 1e-6, max_iters: int | None = None,
                       anderson_memory: int = 5,
                       patience: int | None = None) -> SoftBellmanSolution:
  """Solves `V* = T V*` for one MDP (batch with `jax.vmap`).

  Args:
    mdp: a `TabularMDP` or `SparseTabularMDP` (one MDP).
    pi_ref: reference policy `[S, A]`; zeros mark unavailable actions.
    tau: temperature > 0 (scalar; may be traced).
    method: `"auto"` (policy iteration for dense MDPs with S <= 1024, else value
      iteration), `"value_iteration"`, `"anderson"` or `"policy_iteration"`.
    tol: target for the certified sup-norm error of `v`. In float32 at gamma
      near 1 the certificate itself has a rounding floor of roughly
      `gamma/(1-gamma) * eps * |V* - mean V*|`; the loop stops there (see
      `patience`) and reports `converged=False` if `tol` is below it.
    max_iters: iteration cap (sweeps or Newton steps); default by method.
    anderson_memory: history length m of the Anderson method.
    patience: stop after this many iterations without a better bound (the
      rounding floor); default by method.

  Returns:
    `SoftBellmanSolution`, differentiable w.r.t. `mdp` (rewards, transitions or
    probabilities, discount), `pi_ref` and `tau` by implicit differentiation.

  Raises:
    ValueError: invalid MDP, `pi_ref`, `tau`, method or options.
  """
  _check_inputs(mdp, pi_ref, tau)
  val.check_temperature(tau)
  dtype = mdp.rewards.dtype
  pi_ref = _as_dtype(pi_ref, dtype, "pi_ref")
  tau = _as_dtype(tau, dtype, "tau")
  if tau.ndim != 0:
    raise ValueError(f"tau: expected a scalar (vmap over a batch), got shape {list(tau.shape)}")
  cfg = _make_config(mdp, method, tol, max_iters, anderson_memory, patience, hard=False)
  return _solve(mdp, pi_ref, tau, cfg)


# Jitted once per (shapes, config): eager callers reuse the compiled loop, and
# inside a caller's jit it is simply inlined.
@functools.partial(jax.jit, static_argnums=(3,))
def _solve(mdp, pi_ref, tau, cfg):
  v, (k, bound) = _soft_fixed_point(mdp, pi_ref, tau, cfg)
  q = bellman.q_values(mdp, v)
  return SoftBellmanSolution(
      v=v, q=q, scores=bellman.action_scores(q, pi_ref, tau),
      policy=bellman.soft_policy(q, pi_ref, tau), iterations=k,
      error_bound=bound, converged=bound <= cfg.tol)


def _make_config(mdp, method, tol, max_iters, memory, patience, hard):
  method = _resolve_method(mdp, method)
  if hard and method == "policy_iteration":
    method = "value_iteration"
  if not (isinstance(tol, (int, float)) and tol > 0):
    raise ValueError(f"tol: expected a positive number, got {tol!r}")
  if max_iters is not None and (not isinstance(max_iters, int) or max_iters < 1):
    raise ValueError(f"max_iters: expected a positive integer, got {max_iters!r}")
  if not isinstance(memory, int) or memory < 1:
    raise ValueError(f"anderson_memory: expected a positive integer, got {memory!r}")
  if patience is not None and (not isinstance(patience, int) or patience < 1):
    raise ValueError(f"patience: expected a positive integer, got {patience!r}")
  return _Config(method=method, tol=float(tol),
                 max_iters=max_iters or _default_max_iters(method), memory=memory,
                 patience=patience or _default_patience(method, memory), hard=hard)


class HardBellmanSolution(NamedTuple):
  """The unregularized optimum (`tau -> 0`) over the actions `pi_ref` allows."""

  v: Array
  q: Array
  policy: Array  # greedy, uniform over ties
  iterations: Array
  error_bound: Array
  converged: Array


def solve_hard_bellman(mdp: mdp_lib.AnyMDP, pi_ref, *, method: str = "value_iteration",
                       tol: float = 1e-6, max_iters: int | None = None,
                       anderson_memory: int = 5,
                       patience: int | None = None) -> HardBellmanSolution:
  """Unregularized control, `V = max_a (r + gamma P V)` over available actions.

  The `tau -> 0` limit of `solve_soft_bellman`; MacQueen's bounds hold for the
  max operator too. Not differentiated implicitly (the max is not smooth).
  """
  _check_inputs(mdp, pi_ref, None)
  dtype = mdp.rewards.dtype
  pi_ref = _as_dtype(pi_ref, dtype, "pi_ref")
  if method == "policy_iteration":
    raise ValueError("method: policy_iteration is the soft solver's Newton method; use "
                     "'value_iteration' or 'anderson' for the hard operator")
  cfg = _make_config(mdp, method, tol, max_iters, anderson_memory, patience, hard=True)
  return _solve_hard(mdp, pi_ref, cfg)


@functools.partial(jax.jit, static_argnums=(2,))
def _solve_hard(mdp, pi_ref, cfg):
  v, k, bound = _fixed_point_loop(mdp, pi_ref, None, cfg)
  v = lax.stop_gradient(v)
  q = bellman.q_values(mdp, v)
  qm = jnp.where(bellman.available(pi_ref), q, -jnp.inf)
  best = qm >= jnp.max(qm, axis=-1, keepdims=True)
  policy = best / jnp.sum(best, axis=-1, keepdims=True)
  return HardBellmanSolution(v=v, q=q, policy=policy.astype(v.dtype), iterations=k,
                             error_bound=bound, converged=bound <= cfg.tol)
