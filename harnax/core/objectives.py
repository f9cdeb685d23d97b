"""Ceiling, mismatch, regularized return and centred scores (docs/theory.md).

  C = J(pi*) = mu0^T V*                                   (the harness ceiling)
  M(pi) = tau / (1 - gamma) * sum_s d^pi(s) KL(pi(.|s) || pi*(.|s))
  J(pi) = C - M(pi)                                       (exact; docs/theory.md)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax.core import bellman
from harnax.core import evaluation
from harnax.core import solvers

Array = jax.Array


def ceiling(mdp, pi_ref, tau, *, solution: solvers.SoftBellmanSolution | None = None,
            **solver_options) -> Array:
  """`C = mu0^T V*`: no policy on this harness has a larger regularized return.

  Args:
    mdp: one MDP.
    pi_ref: `[S, A]`.
    tau: temperature > 0.
    solution: a precomputed `solve_soft_bellman(mdp, pi_ref, tau)` to reuse.
    **solver_options: forwarded to `solve_soft_bellman`.

  Returns:
    Scalar.
  """
  if solution is None:
    solution = solvers.solve_soft_bellman(mdp, pi_ref, tau, **solver_options)
  return jnp.dot(mdp.initial, solution.v)


def regularized_return(mdp, policy, pi_ref, tau) -> Array:
  """`J(pi) = mu0^T V^pi` (regularized, unnormalized discounted sum). Scalar."""
  return evaluation.evaluate_policy(mdp, policy, pi_ref, tau).value


def mismatch_per_state(mdp, policy, pi_ref, tau, *,
                       solution: solvers.SoftBellmanSolution | None = None,
                       **solver_options) -> Array:
  """`KL(pi(.|s) || pi*(.|s))`, `[S]`."""
  policy, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  if solution is None:
    solution = solvers.solve_soft_bellman(mdp, pi_ref, tau, **solver_options)
  return bellman.kl_between(policy, solution.policy)


def mismatch(mdp, policy, pi_ref, tau, *, solution: solvers.SoftBellmanSolution | None = None,
             **solver_options) -> Array:
  """`M(pi) = tau/(1-gamma) E_{s ~ d^pi} KL(pi(.|s) || pi*(.|s))`, scalar >= 0.

  The return a policy loses to the optimum of its harness: `J(pi) = C - M(pi)`.

  Args:
    mdp: one MDP.
    policy: `[S, A]`.
    pi_ref: `[S, A]`.
    tau: temperature > 0.
    solution: a precomputed optimum to reuse.
    **solver_options: forwarded to `solve_soft_bellman`.
  """
  kl = mismatch_per_state(mdp, policy, pi_ref, tau, solution=solution, **solver_options)
  policy, _, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  d = evaluation.occupancy(mdp, policy)
  return tau / (1.0 - mdp.discount) * jnp.dot(d, kl)


def centered_scores(scores: Array, pi_ref: Array) -> Array:
  """Scores minus their per-state mean over available actions (0 elsewhere).

  `F*` and readout scores `tau log Pi_H` are defined up to a per-state constant;
  compare them centred. `[S, A]` -> `[S, A]`. Readout scores of a model seen
  through a harness: `harnax.harness.readout_scores`.
  """
  return bellman.centered(scores, bellman.available(pi_ref))
