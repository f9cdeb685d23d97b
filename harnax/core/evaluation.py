"""Exact evaluation of a fixed policy: regularized values and discounted occupancy.

  V^pi = (I - gamma P_pi)^{-1} c_pi,
  c_pi(s) = sum_a pi(a|s) r(s, a) - tau KL(pi(.|s) || pi_ref(.|s))
  Q^pi = r + gamma P V^pi,             J(pi) = mu0^T V^pi
  d^pi = (1 - gamma) (I - gamma P_pi^T)^{-1} mu0          (sums to 1)

Dense MDPs solve exactly (LU); sparse ones iteratively (see `linear.py`): a
certified Anderson iteration for `V^pi`, GMRES for the transposed system `d^pi`.
Everything is differentiable in the policy and the MDP, which is what makes
`policy_gradient` exact. Both entry points validate only shapes on traced
inputs, so they serve unchanged inside `jit`, `vmap` and `grad`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from harnax.core import bellman
from harnax.core import linear
from harnax.core import mdp as mdp_lib
from harnax.core import validation as val

Array = jax.Array


class PolicyEvaluation(NamedTuple):
  """Regularized evaluation of a policy.

  Attributes:
    v: `V^pi`, `[S]`.
    q: `Q^pi = r + gamma P V^pi`, `[S, A]`.
    value: `J(pi) = mu0^T V^pi`, scalar (unnormalized discounted sum).
  """

  v: Array
  q: Array
  value: Array


def check_policy_inputs(mdp, policy, pi_ref, tau=None):
  """Validates `(mdp, policy, pi_ref, tau)` of a public entry point.

  Returns:
    `[policy, pi_ref]` (and `tau` when given) as float arrays of the MDP's dtype.
  """
  mdp_lib.check_single_mdp(mdp)
  s, a = mdp.num_states, mdp.num_actions
  val.check_reference_policy(pi_ref, s, a)
  val.check_policy(policy, pi_ref, s, a)
  if tau is not None:
    val.check_temperature(tau, scalar=True)
  dtype = mdp.rewards.dtype
  out = [val.as_float_array("policy", policy, dtype), val.as_float_array("pi_ref", pi_ref, dtype)]
  if tau is not None:
    out.append(val.as_float_array("tau", tau, dtype))
  return out


def regularized_reward(mdp: mdp_lib.AnyMDP, policy: Array, pi_ref: Array, tau) -> Array:
  """`c_pi(s) = sum_a pi r - tau KL(pi || pi_ref)`, `[S]`."""
  return jnp.sum(policy * mdp.rewards, axis=-1) - tau * bellman.kl_between(policy, pi_ref)


@functools.partial(jax.jit, static_argnums=(4,))
def _evaluate(mdp, policy, pi_ref, tau, rtol=None):
  v = linear.solve_policy_system(mdp, policy, regularized_reward(mdp, policy, pi_ref, tau),
                                 rtol=rtol)
  q = bellman.q_values(mdp, v)
  return PolicyEvaluation(v=v, q=q, value=jnp.dot(mdp.initial, v))


def evaluate_policy(mdp: mdp_lib.AnyMDP, policy, pi_ref, tau, *,
                    rtol: float | None = None) -> PolicyEvaluation:
  """Exact regularized evaluation of `policy` (one MDP; batch with `jax.vmap`).

  Args:
    mdp: a `TabularMDP` or `SparseTabularMDP`.
    policy: `[S, A]`, rows are distributions with no mass where `pi_ref == 0`.
    pi_ref: `[S, A]` reference policy.
    tau: temperature > 0, scalar.
    rtol: relative sup-norm accuracy of the sparse path (certified iteration).

  Returns:
    `PolicyEvaluation` with `.v [S]`, `.q [S, A]`, `.value` (= J).
  """
  policy, pi_ref, tau = check_policy_inputs(mdp, policy, pi_ref, tau)
  return _evaluate(mdp, policy, pi_ref, tau, rtol)


@functools.partial(jax.jit, static_argnums=(2,))
def _occupancy(mdp, policy, rtol=None):
  rhs = (1.0 - mdp.discount) * mdp.initial
  return linear.solve_policy_system(mdp, policy, rhs, transpose=True, rtol=rtol)


def occupancy(mdp: mdp_lib.AnyMDP, policy, *, rtol: float | None = None) -> Array:
  """Normalized discounted occupancy `d^pi(s) = (1-gamma) sum_t gamma^t Pr(s_t = s)`.

  Args:
    mdp: one MDP.
    policy: `[S, A]` distributions.
    rtol: relative residual target for the sparse (GMRES) path.

  Returns:
    `[S]`, non-negative, sums to 1.
  """
  mdp_lib.check_single_mdp(mdp)
  policy = val.check_policy_array("policy", policy, mdp.num_states, mdp.num_actions,
                                  mdp.rewards.dtype)
  return _occupancy(mdp, policy, rtol)
