"""The KL-regularized (soft) Bellman operator and the quantities built from it.

With reference policy `pi_ref` (zeros mark unavailable actions) and temperature
`tau > 0` (docs/theory.md):

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


def safe_log(probs: Array) -> Array:
  """`log p` with `-inf` where `p == 0` and finite gradients, any shape.

  The inner `where` keeps `log` away from 0 so that gradients w.r.t. `p` are 0
  (not NaN) at zero entries (e.g. the unavailable actions of `pi_ref`).
  """
  pos = probs > 0
  return jnp.where(pos, jnp.log(jnp.where(pos, probs, 1.0)), -jnp.inf)


def q_values(mdp: mdp_lib.AnyMDP, values: Array) -> Array:
  """`Q = r + gamma P V`, `[S]` -> `[S, A]`."""
  return mdp.rewards + mdp.discount * mdp_lib.expected_next(mdp, values)


def action_scores(q: Array, pi_ref: Array, tau) -> Array:
  """`F = Q + tau log pi_ref`, `-inf` where unavailable. `[S, A]`."""
  avail = available(pi_ref)
  return jnp.where(avail, q + tau * jnp.where(avail, safe_log(pi_ref), 0.0), -jnp.inf)


def soft_value(q: Array, pi_ref: Array, tau) -> Array:
  """`tau log sum_a pi_ref exp(Q / tau)`, `[S, A]` -> `[S]`."""
  avail = available(pi_ref)
  logits = jnp.where(avail, q / tau + safe_log(pi_ref), -jnp.inf)
  return tau * jax.nn.logsumexp(logits, axis=-1)


def soft_policy(q: Array, pi_ref: Array, tau) -> Array:
  """`pi ∝ pi_ref exp(Q / tau)`: exact zeros at unavailable actions. `[S, A]`."""
  avail = available(pi_ref)
  logits = jnp.where(avail, q / tau + safe_log(pi_ref), -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)


def soft_bellman_operator(mdp: mdp_lib.AnyMDP, values: Array, pi_ref: Array, tau) -> Array:
  """`(T V)(s)`, `[S]` -> `[S]`."""
  return soft_value(q_values(mdp, values), pi_ref, tau)


def hard_bellman_operator(mdp: mdp_lib.AnyMDP, values: Array, pi_ref: Array) -> Array:
  """`max_{a available} Q(s, a)`: the `tau -> 0` limit (unregularized control)."""
  q = q_values(mdp, values)
  return jnp.max(jnp.where(available(pi_ref), q, -jnp.inf), axis=-1)


def log_ratio(p: Array, q: Array) -> Array:
  """`log(p / q)` where `p > 0`, else 0; `[..., A]`.

  Masked before any product: `0 * inf` in the untaken branch would poison
  gradients. Where `p > 0` and `q == 0` it is `+inf`.
  """
  pos = p > 0
  return jnp.where(pos, safe_log(p) - jnp.where(pos, safe_log(q), 0.0), 0.0)


def kl_between(p: Array, q: Array) -> Array:
  """Per-row `KL(p || q) = sum_a p log(p / q)`, `[..., A]` x `[..., A]` -> `[...]`.

  Terms with `p(a) = 0` are 0 (and have zero gradient); mass on an action
  with `q = 0` gives `+inf`, the mathematically right answer.
  """
  return jnp.sum(p * log_ratio(p, q), axis=-1)


def centered(scores: Array, mask: Array) -> Array:
  """Subtracts the per-state mean over available actions; 0 elsewhere.

  Scores are defined up to a per-state constant, so they are always compared
  centred. Entries outside `mask` never enter the mean (they may be `-inf`).
  `[S, A]` -> `[S, A]`.
  """
  count = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1)
  safe = jnp.where(mask, scores, 0.0)
  mean = jnp.sum(safe, axis=-1, keepdims=True) / count
  return jnp.where(mask, safe - mean, 0.0)
