"""Linear systems in `I - gamma P_pi`: exact evaluation, occupancy and adjoints.

Dense MDPs build the `[S, S]` matrix and use an LU solve. Sparse MDPs never
build it: they run GMRES on the matrix-free products of `mdp.py` (gathers
forward, segment sums transposed). Both paths are differentiable and
transposable (`jnp.linalg.solve` and `gmres` are `custom_linear_solve`s), so
reverse-mode gradients through them are themselves linear solves, not unrolled
iterations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.sparse import linalg as sparse_linalg

from harnax.core import mdp as mdp_lib

Array = jax.Array


def default_rtol(dtype) -> float:
  """Relative residual target of iterative solves: near the dtype's precision."""
  return 1e-6 if jnp.finfo(dtype).bits <= 32 else 1e-12


def solve_policy_system(mdp: mdp_lib.AnyMDP, policy: Array, rhs: Array, *,
                        transpose: bool = False, rtol: float | None = None,
                        max_iters: int = 200, restart: int = 32) -> Array:
  """Solves `(I - gamma P_pi) x = rhs` (or with `P_pi^T` when `transpose`).

  Args:
    mdp: one (unbatched) MDP.
    policy: `[S, A]`.
    rhs: `[S]`.
    transpose: solve the transposed system (occupancy, adjoints).
    rtol: relative residual target of the sparse (GMRES) path; default by dtype.
    max_iters: GMRES restarts cap (sparse path).
    restart: Krylov subspace size per restart (sparse path).

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

  if transpose:
    def matvec(x):
      return x - gamma * mdp_lib.policy_apply_transpose(mdp, policy, x)
  else:
    def matvec(x):
      return x - gamma * mdp_lib.policy_apply(mdp, policy, x)
  tol = default_rtol(rhs.dtype) if rtol is None else rtol
  # The Neumann series is a good start: one sweep of x = rhs + gamma P x.
  x0 = rhs
  x, _ = sparse_linalg.gmres(matvec, rhs, x0=x0, tol=tol, atol=0.0, restart=restart,
                             maxiter=max_iters, solve_method="batched")
  return x
