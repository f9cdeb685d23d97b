"""The KL-regularized (soft) Bellman operator and the quantities built from it.

With reference policy `pi_ref` (zeros mark unavailable actions) and temperature
`tau > 0` (DESIGN.md §1):

  Q(s, a) = r(s, a) + gamma * sum_s' P(s'|s, a) V(s')
  (T V)(s) = tau * log sum_a pi_ref(a|s) exp(Q(s, a) / tau)
  F(s, a)  = Q(s, a) + tau * log pi_ref(a|s)        (-inf where unavailable)
  pi(a|s)  = softmax(F(s, .) / tau)

`T` is monotone and shifts constants by gamma: `T(V + c) = T V + gamma c`. Those
two facts give MacQueen's bounds (see `solvers.py`) and let every solver
iterate on centred values, which keeps float32 rounding at the scale of the
value *differences* rather than of `r / (1 - gamma)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax.core import mdp as mdp_lib

Array = jax.Array


def available(pi_ref: Array) -> Array:
  """Boolean mask of available actions, `[S, A]`."""
  return pi_ref > 0


def log_reference(pi_ref: Array) -> Array:
  """`log pi_ref` with `-inf` at unavailable actions and finite gradients.

  The inner `where` keeps `log` away from 0 so that gradients w.r.t. `pi_ref`
  are 0 (not NaN) at unavailable actions.
  """
  avail = available(pi_ref)
  safe = jnp.where(avail, pi_ref, 1.0)
  return jnp.where(avail, jnp.log(safe), -jnp.inf)


def q_values(mdp: mdp_lib.AnyMDP, values: Array) -> Array:
  """`Q = r + gamma P V`, `[S]` -> `[S, A]`."""
  return mdp.rewards + mdp.discount * mdp_lib.expected_next(mdp, values)


def action_scores(q: Array, pi_ref: Array, tau) -> Array:
  """`F = Q + tau log pi_ref`, `-inf` where unavailable. `[S, A]`."""
  avail = available(pi_ref)
  return jnp.where(avail, q + tau * jnp.where(avail, log_reference(pi_ref), 0.0), -jnp.inf)


def soft_value(q: Array, pi_ref: Array, tau) -> Array:
  """`tau log sum_a pi_ref exp(Q / tau)`, `[S, A]` -> `[S]`."""
  avail = available(pi_ref)
  logits = jnp.where(avail, q / tau + log_reference(pi_ref), -jnp.inf)
  return tau * jax.nn.logsumexp(logits, axis=-1)


def soft_policy(q: Array, pi_ref: Array, tau) -> Array:
  """`pi ∝ pi_ref exp(Q / tau)`: exact zeros at unavailable actions. `[S, A]`."""
  avail = available(pi_ref)
  logits = jnp.where(avail, q / tau + log_reference(pi_ref), -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)


def soft_bellman_operator(mdp: mdp_lib.AnyMDP, values: Array, pi_ref: Array, tau) -> Array:
  """`(T V)(s)`, `[S]` -> `[S]`."""
  return soft_value(q_values(mdp, values), pi_ref, tau)


def hard_bellman_operator(mdp: mdp_lib.AnyMDP, values: Array, pi_ref: Array) -> Array:
  """`max_{a available} Q(s, a)`: the `tau -> 0` limit (unregularized control)."""
  q = q_values(mdp, values)
  return jnp.max(jnp.where(available(pi_ref), q, -jnp.inf), axis=-1)


def kl_terms(policy: Array, pi_ref: Array) -> Array:
  """Per-state `KL(pi(.|s) || pi_ref(.|s)) = sum_a pi log(pi / pi_ref)`, `[S]`.

  Terms with `pi(a|s) = 0` are 0 (and have zero gradient); mass on an action
  with `pi_ref = 0` gives `+inf`, the mathematically right answer.
  """
  pos = policy > 0
  safe_pi = jnp.where(pos, policy, 1.0)
  # Mask before multiplying: 0 * inf in the untaken branch would poison gradients.
  log_ratio = jnp.where(pos, jnp.log(safe_pi) - log_reference(pi_ref), 0.0)
  return jnp.sum(policy * log_ratio, axis=-1)


def kl_between(p: Array, q: Array) -> Array:
  """Per-state `KL(p(.|s) || q(.|s))`, `[S, A]` x `[S, A]` -> `[S]`."""
  return kl_terms(p, q)


def centered(scores: Array, mask: Array) -> Array:
  """Subtracts the per-state mean over available actions; 0 elsewhere.

  Readout scores are defined up to a per-state constant, so they are always
  compared centred (DESIGN.md §1).
  """
  count = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1)
  safe = jnp.where(mask, scores, 0.0)
  mean = jnp.sum(safe, axis=-1, keepdims=True) / count
  return jnp.where(mask, safe - mean, 0.0)
