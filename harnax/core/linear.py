"""Linear systems in `I - gamma P_pi`: exact evaluation, occupancy and adjoints.

Dense MDPs build the `[S, S]` matrix and use an LU solve. Sparse MDPs never
build it:

* `(I - gamma P_pi) x = b` is the fixed point of `T_pi x = b + gamma P_pi x`, a
  monotone, constant-shifting operator, so it is solved by the same certified,
  Anderson-accelerated relative iteration as the Bellman equation
  (`fixed_point.py`): robust even where Krylov methods stall (near-deterministic
  policies on long cycles), with a sup-norm certificate.
* `(I - gamma P_pi^T) x = b` (occupancy, adjoints) uses GMRES on the transposed
  products (segment sums).

Both paths are `custom_linear_solve`s (LU is one too), so differentiating
through them — exact policy gradients, implicit differentiation — is itself a
linear solve, never an unrolled loop.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.scipy.sparse import linalg as sparse_linalg

from harnax.core import fixed_point
from harnax.core import mdp as mdp_lib

Array = jax.Array


def default_rtol(dtype) -> float:
  """Relative accuracy target of iterative solves: near the dtype's precision."""
  return 1e-6 if jnp.finfo(dtype).bits <= 32 else 1e-12


class _IterConfig(NamedTuple):
  tol: float
  max_iters: int
  patience: int
  memory: int
  slow_sweeps: int = 0  # unused: this loop never hands over to another method


def _forward_iterative(mdp, policy, rhs, rtol, max_iters):
  """Certified Anderson iteration for `x = rhs + gamma P_pi x`."""
  gamma = mdp.discount
  # Tolerance relative to the solution's scale |rhs| / (1 - gamma).
  scale = jnp.max(jnp.abs(rhs)) / (1.0 - gamma)
  cfg = _IterConfig(tol=rtol, max_iters=max_iters, patience=40, memory=5)

  def apply_t(h):
    return rhs + gamma * mdp_lib.policy_apply(mdp, policy, h)

  # The loop compares the bound with a static tolerance: make it relative by
  # solving for x / scale.
  safe = jnp.where(scale > 0, scale, 1.0)

  def apply_scaled(h):
    return apply_t(h * safe) / safe

  start = fixed_point.init_state(jnp.zeros_like(rhs))
  out = fixed_point.anderson(apply_scaled, gamma, start, cfg)
  return out.v * safe


def solve_policy_system(mdp: mdp_lib.AnyMDP, policy: Array, rhs: Array, *,
                        transpose: bool = False, rtol: float | None = None,
                        max_iters: int = 100_000, restart: int = 32) -> Array:
  """Solves `(I - gamma P_pi) x = rhs` (or with `P_pi^T` when `transpose`).

  Args:
    mdp: one (unbatched) MDP.
    policy: `[S, A]`.
    rhs: `[S]`.
    transpose: solve the transposed system (occupancy, adjoints).
    rtol: relative accuracy of the sparse path; default by dtype.
    max_iters: iteration cap of the sparse path.
    restart: Krylov subspace size of the sparse transposed path (GMRES).

  Returns:
    `x`, shape `[S]`.
  """
  gamma = mdp.discount
  if isinstance(mdp, mdp_lib.TabularMDP):
    p_pi = mdp_lib.policy_matrix(mdp, policy)
    if transpose:
      p_pi = p_pi.T
    a = jnp.eye(p_pi.shape[0], dtype=p_pi.dtype) - gamma * p_pi
    return jnp.linalg.solve(a, rhs)

  tol = default_rtol(rhs.dtype) if rtol is None else rtol
  # custom_linear_solve differentiates through `matvec`'s closure (policy, MDP):
  # dx = A^{-1} (db - dA x), each solve again one of the two below.
  mdp_fixed = mdp

  def matvec(x):
    return x - gamma * mdp_lib.policy_apply(mdp_fixed, policy, x)

  def matvec_t(x):
    return x - gamma * mdp_lib.policy_apply_transpose(mdp_fixed, policy, x)

  def forward(_, b):
    return _forward_iterative(mdp_fixed, policy, b, tol, max_iters)

  def backward(_, b):
    x, _ = sparse_linalg.gmres(matvec_t, b, x0=b, tol=tol, atol=0.0, restart=restart,
                               maxiter=max(1, max_iters // restart), solve_method="batched")
    return x

  if transpose:
    return lax.custom_linear_solve(matvec_t, rhs, solve=backward, transpose_solve=forward)
  return lax.custom_linear_solve(matvec, rhs, solve=forward, transpose_solve=backward)
