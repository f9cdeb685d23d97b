"""Exact policy gradients of the regularized return.

`J(pi_theta) = mu0^T (I - gamma P_{pi_theta})^{-1} c_{pi_theta}` is a smooth
function of the policy, so `jax.grad` through the exact evaluation (a linear
solve, itself differentiated as a linear solve) is the exact gradient — no
sampling. The policy-gradient theorem gives the same vector in closed form:

  dJ/dpi(a|s) = d^pi(s) / (1 - gamma) * (Q^pi(s, a) - tau log(pi(a|s) / pi_ref(a|s)))

up to a per-state constant that vanishes along directions keeping pi
normalized; for the tabular softmax `pi = softmax(theta)` this becomes
`d(s)/(1-gamma) pi(a|s) (Q - tau log(pi/pi_ref) - V)(s, a)` (Mei et al. 2020).
Derivation: docs/theory.md.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from harnax.core import bellman
from harnax.core import evaluation

Array = jax.Array
PolicyFn = Callable[[Any], Array]


def softmax_policy(logits: Array, pi_ref: Array) -> Array:
  """Tabular softmax over available actions; exact zeros where `pi_ref == 0`.

  Args:
    logits: `[S, A]` parameters theta.
    pi_ref: `[S, A]`, its zeros mask unavailable actions.

  Returns:
    `[S, A]` policy.
  """
  avail = bellman.available(pi_ref)
  return jax.nn.softmax(jnp.where(avail, logits, -jnp.inf), axis=-1)


def policy_gradient(mdp, params, policy_fn: PolicyFn, pi_ref, tau) -> tuple[Array, Any]:
  """`(J, dJ/dparams)` by differentiating the exact evaluation (`jax.grad`).

  Args:
    mdp: one MDP.
    params: any pytree of parameters.
    policy_fn: maps params to a policy `[S, A]` (differentiable).
    pi_ref: `[S, A]`.
    tau: temperature > 0.

  Returns:
    `(value, grads)` with `grads` shaped like `params`.
  """
  policy0 = policy_fn(params)
  _, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy0, pi_ref, tau)

  def objective(p):
    # Under grad the policy is traced: evaluate_policy checks only its shape.
    return evaluation.evaluate_policy(mdp, policy_fn(p), pi_ref, tau).value

  return jax.value_and_grad(objective)(params)


def policy_gradient_theorem(mdp, policy, pi_ref, tau) -> Array:
  """`dJ/dpi(a|s)` from the policy-gradient theorem, `[S, A]`.

  Exact along normalized directions (`sum_a dpi(a|s) = 0`); entries where
  `pi(a|s) = 0` are 0 (the theorem needs pi > 0 on the actions it moves).
  """
  policy, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  return _theorem(mdp, policy, pi_ref, tau)[1]


def _theorem(mdp, policy, pi_ref, tau):
  """`(J, dJ/dpi)` for validated inputs."""
  ev = evaluation.evaluate_policy(mdp, policy, pi_ref, tau)
  d = evaluation.occupancy(mdp, policy)
  adv = ev.q - tau * bellman.log_ratio(policy, pi_ref)
  return ev.value, jnp.where(policy > 0, d[:, None] / (1.0 - mdp.discount) * adv, 0.0)


def analytic_policy_gradient(mdp, params, policy_fn: PolicyFn, pi_ref,
                             tau) -> tuple[Array, Any]:
  """`(J, dJ/dparams)` from the theorem, chained through `policy_fn` by a VJP.

  Same arguments and result as `policy_gradient`; no autodiff through the
  evaluation (only through `policy_fn`).
  """
  policy, vjp = jax.vjp(policy_fn, params)
  _, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  value, dpi = _theorem(mdp, policy, pi_ref, tau)
  (grads,) = vjp(dpi)
  return value, grads


def softmax_policy_gradient(mdp, logits, pi_ref, tau) -> Array:
  """Closed form for `pi = softmax(logits)`:
  `d(s)/(1-gamma) pi (Q - tau log(pi/pi_ref) - V)`, `[S, A]`."""
  policy = softmax_policy(logits, pi_ref)
  policy, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  ev = evaluation.evaluate_policy(mdp, policy, pi_ref, tau)
  d = evaluation.occupancy(mdp, policy)
  adv = ev.q - tau * bellman.log_ratio(policy, pi_ref) - ev.v[:, None]
  return jnp.where(policy > 0, d[:, None] / (1.0 - mdp.discount) * policy * adv, 0.0)
