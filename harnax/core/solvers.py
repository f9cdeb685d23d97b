"""Soft-Bellman solvers with certified error bounds and implicit gradients.

Three methods reach the same fixed point `V* = T V*` (see `bellman.py`):

* `"value_iteration"` — relative value iteration `h <- T h - mean(T h)`.
* `"anderson"` — Anderson acceleration (memory m) of the same map.
* `"policy_iteration"` — soft policy iteration, i.e. Newton's method on
  `V - T V` (Jacobian `I - gamma P_pi`): each step takes the soft-greedy policy
  of the certified midpoint (one sweep from `h_k`) and evaluates it exactly,
  `h_{k+1} = V^{pi_k}` centred. Quadratic locally.

`"auto"` (the default) runs value iteration and hands its iterate to Anderson
when the certificate's measured contraction predicts a slow finish: plain
sweeps are the fastest path on well-mixing MDPs, Anderson on slowly mixing ones
(near-deterministic transitions, cycles, gamma near 1). The rule and the
measurements behind it are in `docs/theory.md` (section 4.7).

All methods iterate on centred values and certify every iterate with MacQueen's
bounds (`fixed_point.py`): the returned `v` is within `error_bound` of `V*` in
sup-norm. The loop stops on the tolerance, as soon as the bound reaches its
rounding floor when the tolerance is below it, on a stall, or at `max_iters`;
nothing leaves the device per sweep.

Batching: under `jax.vmap` on the CPU, a batch whose transitions exceed the cache
is solved in cache-sized chunks one after the other (same iterations and values
per member; `docs/theory.md` section 4.8).

Differentiation: the returned `V*` is wrapped in a `custom_jvp` that applies the
implicit function theorem at the fixed point,
`dV* = (I - gamma P_{pi*})^{-1} (dT)(V*)`, so gradients w.r.t. rewards,
transitions, discount, `tau` and `pi_ref` cost one linear solve and never
differentiate through the loop.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from harnax.core import bellman
from harnax.core import fixed_point
from harnax.core import linear
from harnax.core import mdp as mdp_lib
from harnax.core import validation as val

Array = jax.Array

METHODS = ("auto", "value_iteration", "anderson", "policy_iteration")

# "auto" hands value iteration over to Anderson when, at the contraction of the
# latest sweep, more than this many further sweeps would be needed. Measured per
# backend (docs/theory.md, section 4.7); backends not measured use the CPU value.
_AUTO_SLOW_SWEEPS = {"cpu": 10}


# The certificate every solution carries (docstrings below): declared once.
_CERTIFICATE_FIELDS = [("iterations", Array), ("error_bound", Array), ("converged", Array),
                       ("rounding_floor", Array), ("tol", Array)]

SoftBellmanSolution = NamedTuple(
    "SoftBellmanSolution",
    [("v", Array), ("q", Array), ("scores", Array), ("policy", Array)] + _CERTIFICATE_FIELDS)
SoftBellmanSolution.__doc__ = """The regularized optimum of one MDP.

  Attributes:
    v: `V*`, `[S]`.
    q: `Q* = r + gamma P V*`, `[S, A]`.
    scores: `F* = Q* + tau log pi_ref`, `[S, A]` (`-inf` where unavailable).
    policy: `pi* = softmax(F* / tau)`, `[S, A]`.
    iterations: sweeps (value iteration, Anderson, both for `"auto"`) or Newton
      steps used, int32 scalar.
    error_bound: `||v - V*||_inf` bound, scalar: MacQueen's certificate plus
      `rounding_floor`.
    converged: `error_bound <= tol`, bool scalar.
    rounding_floor: the part of `error_bound` that rounding contributes (an
      allowance sized from the magnitudes involved, not interval arithmetic),
      scalar: no tolerance below it can be certified in this dtype.
    tol: the tolerance the solve aimed at, scalar: the `tol` argument, or the
      default `2 * rounding_floor`.
  """


class _Config(NamedTuple):
  method: str
  tol: float | None
  max_iters: int
  memory: int
  patience: int
  slow_sweeps: int
  hard: bool


def _operator(mdp, pi_ref, tau, hard):
  if hard:
    return lambda h: bellman.hard_bellman_operator(mdp, h, pi_ref)
  return lambda h: bellman.soft_bellman_operator(mdp, h, pi_ref, tau)


def _policy_iteration(mdp, pi_ref, tau, apply_t, gamma, h0, cfg, offset):
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
    return fixed_point.certify(apply_t, h, gamma, offset=offset)

  def newton(h, delta):
    pi = bellman.soft_policy(bellman.q_values(mdp, h), pi_ref, tau)
    h_new = h + linear.solve_policy_system(mdp, pi, delta)
    return h_new - jnp.mean(h_new)

  def step(h, cert):
    h_newton = newton(h, cert.delta)
    cert_newton, cert_sweep = certified(h_newton), certified(cert.sweep)
    take_newton = cert_newton.bound <= cert_sweep.bound
    pick = lambda a, b: jnp.where(take_newton, a, b)  # noqa: E731
    h_next = pick(h_newton, cert.sweep)
    cert_next = jax.tree.map(pick, cert_newton, cert_sweep)
    return h_next, cert_next, cert_next

  return fixed_point.run(step, fixed_point.init_state(h0, certified(h0)), cfg)


def _fixed_point_loop(mdp, pi_ref, tau, cfg: _Config):
  """Runs `cfg.method`; returns `(v, iterations, bound, floor, tol)`."""
  gamma = mdp.discount
  h0 = jnp.zeros(mdp.num_states, mdp.rewards.dtype)
  # T 0 is the operator applied to the rewards alone (P 0 = 0): no sweep needed.
  if cfg.hard:
    t_h0 = jnp.max(jnp.where(bellman.available(pi_ref), mdp.rewards, -jnp.inf), axis=-1)
  else:
    t_h0 = bellman.soft_value(mdp.rewards, pi_ref, tau)
  apply_t, offset = fixed_point.shift_rewards(_operator(mdp, pi_ref, tau, cfg.hard), h0, gamma,
                                              t_h0=t_h0)
  start = fixed_point.init_state(h0)
  if cfg.method == "value_iteration":
    out = fixed_point.value_iteration(apply_t, gamma, start, cfg, offset=offset)
  elif cfg.method == "anderson":
    out = fixed_point.anderson(apply_t, gamma, start, cfg, offset=offset)
  elif cfg.method == "auto":
    # Plain sweeps until they are predicted to be slow; Anderson from there. A
    # problem that converges (or stops) in the first loop runs no Anderson step.
    out = fixed_point.value_iteration(apply_t, gamma, start, cfg, offset=offset,
                                      exit_when_slow=True)
    out = fixed_point.anderson(apply_t, gamma, out, cfg, offset=offset)
  else:
    out = _policy_iteration(mdp, pi_ref, tau, apply_t, gamma, h0, cfg, offset)
  tol = fixed_point.effective_tol(cfg, out.floor)
  return out.v + offset, out.k, out.bound, out.floor, tol


# Under `jax.vmap`, every sweep of the batched loop reads every member's transitions. On
# the CPU a batch too large for the cache is therefore solved in chunks that fit in it
# (`lax.map` over chunks, `vmap` within one): each chunk's sweeps then read from cache, not
# memory (docs/theory.md §4.8 has the measurements). Bytes of transition data per chunk, by
# backend; a backend not listed solves the whole batch in one loop.
_CHUNK_BYTES = {"cpu": 4 * 2**20}


def _num_chunks(batched_leaves, batch: int) -> int:
  """How many sequential chunks the batch is split into: a divisor of `batch`, so that each
  device of a sharded batch axis keeps its own members (see `_chunked`)."""
  budget = _CHUNK_BYTES.get(jax.default_backend())
  # With several devices the batch is the mesh's to split: XLA's partitioner handles a
  # plain vmapped loop better than the chunk loop (measured: 2 host devices, 2x slower).
  if budget is None or batch <= 1 or jax.device_count() > 1:
    return 1
  per_item = sum(x.size * x.dtype.itemsize for x in batched_leaves) // batch
  fewest = -(-batch // max(1, budget // max(per_item, 1)))
  return next(n for n in range(fewest, batch + 1) if batch % n == 0)


def _chunked(fn, args, in_batched, batch: int):
  """`jax.vmap(fn)` over the leaves of `args` that `in_batched` marks (leading axis `batch`),
  in cache-sized chunks; unbatched leaves (a shared P) stay unbatched.

  Member `b` goes to chunk `b % n`: the batch is read as `[c, n]` with `c` major, so a
  batch axis sharded in contiguous blocks stays sharded along `c` and the sequential
  axis `n` is local to every device.
  """
  leaves, treedef = jax.tree.flatten(args)
  flags = jax.tree.leaves(in_batched)
  batched = [x for x, f in zip(leaves, flags) if f]

  def one(*items):
    it = iter(items)
    return fn(jax.tree.unflatten(treedef, [next(it) if f else x for x, f in zip(leaves, flags)]))

  n = _num_chunks(batched, batch)
  if n == 1:
    return jax.vmap(one)(*batched)
  c = batch // n
  # A reshape, not a transpose: the inputs are never copied whole; each step gathers its
  # chunk (c contiguous items) into a buffer its sweeps then read from cache.
  grid = [x.reshape((c, n) + x.shape[1:]) for x in batched]

  def step(_, j):
    chunk = [lax.dynamic_index_in_dim(x, j, axis=1, keepdims=False) for x in grid]
    return None, jax.vmap(one)(*chunk)

  _, out = lax.scan(step, None, jnp.arange(n))
  return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape((batch,) + y.shape[2:]), out)


@functools.lru_cache(maxsize=None)
def _batched_loop(cfg: _Config):
  """`_fixed_point_loop` for `cfg`, solved in cache-sized chunks under `jax.vmap`."""

  @jax.custom_batching.custom_vmap
  def loop(mdp, pi_ref, tau):
    return _fixed_point_loop(mdp, pi_ref, tau, cfg)

  @loop.def_vmap
  def _(axis_size, in_batched, mdp, pi_ref, tau):
    out = _chunked(lambda a: _fixed_point_loop(*a, cfg), (mdp, pi_ref, tau), tuple(in_batched),
                   axis_size)
    return out, jax.tree.map(lambda _: True, out)

  return loop


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _soft_fixed_point(mdp, pi_ref, tau, cfg):
  v, *aux = _batched_loop(cfg)(mdp, pi_ref, tau)
  return v, tuple(aux)


@_soft_fixed_point.defjvp
def _soft_fixed_point_jvp(cfg, primals, tangents):
  mdp, pi_ref, tau = primals
  v, *aux = _batched_loop(cfg)(mdp, pi_ref, tau)
  aux = tuple(aux)
  # dV* = (I - gamma P_{pi*})^{-1} (dT)(V*)  (implicit function theorem).
  _, d_t = jax.jvp(lambda m, p, t: bellman.soft_bellman_operator(m, v, p, t), primals, tangents)
  policy = bellman.soft_policy(bellman.q_values(mdp, v), pi_ref, tau)
  dv = linear.solve_policy_system(mdp, policy, d_t)
  # The certificate (iterations, bound, floor, tol) is not differentiated.
  aux_tangent = (np.zeros((), jax.dtypes.float0),) + tuple(jnp.zeros_like(x) for x in aux[1:])
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


def _check_method(method):
  if method not in METHODS:
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
  return method


def _default_max_iters(method):
  return {"value_iteration": 100_000, "anderson": 20_000, "auto": 100_000,
          "policy_iteration": 100}[method]


def _default_patience(method, memory):
  # Value iteration and the Newton race never raise the bound in exact arithmetic,
  # so a short stall is rounding; Anderson may raise it for a few steps.
  return {"value_iteration": 20, "anderson": 4 * memory + 20, "auto": 4 * memory + 20,
          "policy_iteration": 5}[method]


def solve_soft_bellman(mdp: mdp_lib.AnyMDP, pi_ref, tau, *, method: str = "auto",
                       tol: float | None = None, max_iters: int | None = None,
                       anderson_memory: int = 5,
                       patience: int | None = None) -> SoftBellmanSolution:
  """Solves `V* = T V*` for one MDP (batch with `jax.vmap`).

  Args:
    mdp: a `TabularMDP` or `SparseTabularMDP` (one MDP).
    pi_ref: reference policy `[S, A]`; zeros mark unavailable actions.
    tau: temperature > 0 (scalar; may be traced).
    method: `"auto"` (value iteration, continued by Anderson when it is measured
      to contract slowly; `docs/theory.md` section 4.7), `"value_iteration"`,
      `"anderson"` or `"policy_iteration"`.
    tol: target for the certified sup-norm error of `v`, in the units of the
      values. None (default): twice the certificate's rounding floor, i.e. a
      few `eps` of the dtype times the problem's value scale
      (`2 eps (|v| + 2 gamma/(1-gamma) (|T h| + |h| + |kappa|))`, see
      `SoftBellmanSolution.rounding_floor`): the most a solve in this dtype can
      certify, reached whenever the contraction term falls below the rounding
      term. An explicit `tol` below the floor stops as soon as the bound reaches
      the floor and reports `converged=False`.
    max_iters: iteration cap (sweeps or Newton steps); default by method.
    anderson_memory: history length m of the Anderson method.
    patience: stop after this many iterations without a better bound (rounding
      noise above the allowance); default by method.

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
  cfg = _make_config(method, tol, max_iters, anderson_memory, patience, hard=False)
  return _solve(mdp, pi_ref, tau, cfg)


# Jitted once per (shapes, config): eager callers reuse the compiled loop, and
# inside a caller's jit it is simply inlined.
@functools.partial(jax.jit, static_argnums=(3,))
def _solve(mdp, pi_ref, tau, cfg):
  v, (k, bound, floor, tol) = _soft_fixed_point(mdp, pi_ref, tau, cfg)
  q = bellman.q_values(mdp, v)
  return SoftBellmanSolution(
      v=v, q=q, scores=bellman.action_scores(q, pi_ref, tau),
      policy=bellman.soft_policy(q, pi_ref, tau), iterations=k,
      error_bound=bound, converged=bound <= tol, rounding_floor=floor, tol=tol)


def _make_config(method, tol, max_iters, memory, patience, hard):
  method = _check_method(method)
  if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))
                          or not math.isfinite(tol) or tol <= 0):
    raise ValueError(f"tol: expected None or a positive finite number, got {tol!r}")
  if max_iters is not None and (not isinstance(max_iters, int) or max_iters < 1):
    raise ValueError(f"max_iters: expected a positive integer, got {max_iters!r}")
  if not isinstance(memory, int) or memory < 1:
    raise ValueError(f"anderson_memory: expected a positive integer, got {memory!r}")
  if patience is not None and (not isinstance(patience, int) or patience < 1):
    raise ValueError(f"patience: expected a positive integer, got {patience!r}")
  backend = jax.default_backend()
  return _Config(method=method, tol=None if tol is None else float(tol),
                 max_iters=max_iters or _default_max_iters(method), memory=memory,
                 patience=patience or _default_patience(method, memory),
                 slow_sweeps=_AUTO_SLOW_SWEEPS.get(backend, _AUTO_SLOW_SWEEPS["cpu"]),
                 hard=hard)


HardBellmanSolution = NamedTuple(
    "HardBellmanSolution", [("v", Array), ("q", Array), ("policy", Array)] + _CERTIFICATE_FIELDS)
HardBellmanSolution.__doc__ = """The unregularized optimum (`tau -> 0`) over the available actions.

  Attributes:
    v: `V*_hard(s) = max_a Q*(s, a)` over available actions, `[S]`.
    q: `Q* = r + gamma P V*_hard`, `[S, A]` (also at unavailable actions).
    policy: greedy, uniform over the tied maximizers among available actions,
      `[S, A]`.
    iterations: sweeps used, int32 scalar.
    error_bound: `||v - V*_hard||_inf` bound, scalar: MacQueen's certificate
      plus `rounding_floor`.
    converged: `error_bound <= tol`, bool scalar.
    rounding_floor: the rounding part of `error_bound`, scalar (as in
      `SoftBellmanSolution`).
    tol: the tolerance the solve aimed at, scalar.
  """


def solve_hard_bellman(mdp: mdp_lib.AnyMDP, pi_ref, *, method: str = "value_iteration",
                       tol: float | None = None, max_iters: int | None = None,
                       anderson_memory: int = 5,
                       patience: int | None = None) -> HardBellmanSolution:
  """Unregularized control, `V = max_a (r + gamma P V)` over available actions.

  The `tau -> 0` limit of `solve_soft_bellman`; MacQueen's bounds hold for the
  max operator too. Not differentiated implicitly (the max is not smooth).

  Args:
    mdp: a `TabularMDP` or `SparseTabularMDP` (one MDP).
    pi_ref: `[S, A]`; only its zeros matter (unavailable actions).
    method: `"value_iteration"`, `"anderson"` or `"auto"` (as in
      `solve_soft_bellman`; Newton is not defined for the max).
    tol, max_iters, anderson_memory, patience: as in `solve_soft_bellman`.

  Returns:
    `HardBellmanSolution`.

  Raises:
    ValueError: invalid MDP, `pi_ref`, method or options.
  """
  _check_inputs(mdp, pi_ref, None)
  dtype = mdp.rewards.dtype
  pi_ref = _as_dtype(pi_ref, dtype, "pi_ref")
  if method == "policy_iteration":
    raise ValueError("method: policy_iteration is the soft solver's Newton method; use "
                     "'value_iteration', 'anderson' or 'auto' for the hard operator")
  cfg = _make_config(method, tol, max_iters, anderson_memory, patience, hard=True)
  return _solve_hard(mdp, pi_ref, cfg)


@functools.partial(jax.jit, static_argnums=(2,))
def _solve_hard(mdp, pi_ref, cfg):
  v, k, bound, floor, tol = _batched_loop(cfg)(mdp, pi_ref, None)
  v = lax.stop_gradient(v)
  q = bellman.q_values(mdp, v)
  qm = jnp.where(bellman.available(pi_ref), q, -jnp.inf)
  best = qm >= jnp.max(qm, axis=-1, keepdims=True)
  policy = best / jnp.sum(best, axis=-1, keepdims=True)
  return HardBellmanSolution(v=v, q=q, policy=policy.astype(v.dtype), iterations=k,
                             error_bound=bound, converged=bound <= tol, rounding_floor=floor,
                             tol=tol)
