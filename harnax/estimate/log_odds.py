"""The log-odds route: centred score errors from pairs of actions, and M.

For a deployed policy `pi` and the optimum `pi* = softmax(F*/tau)` at a state,
the score error of a pair of available actions `(a, b)` is

  e(a, b) = tau log(pi(a)/pi(b)) - (F*(a) - F*(b)) = tau (l(a) - l(b)),
  l = log(pi / pi*),

a difference of log-odds (per-state constants cancel, so no normalisation of
either policy is needed). The centred score error is
`eps(a) = tau (l(a) - mean_available l)`, and `max_{a,b} e(a,b) = max eps - min eps`.

Proved in docs/estimation.md §5 (for every state, with `A_s` the available actions):

* Upper bound (Popoviciu on the log-sum-exp Bregman form of KL):
  `KL(pi || pi*) <= Delta_s^2 / (8 tau^2)`, `Delta_s = max_{a,b in A_s} e(a, b)`, so

    M(pi) <= 1/(8 tau (1-gamma)) * sum_s d^pi(s) Delta_s^2.

* Pair lower bound (chain rule + the softplus Bregman form of the binary KL):
  for any pair `(a, b)` per state,
  `w_s(a, b) e_s(a, b)^2 <= 2 tau^2 KL(pi(.|s) || pi*(.|s))` with
  `w(a, b) = (pi(a) + pi(b)) * min(sigma'(x), sigma'(x*))`,
  `sigma'(x) = pi(a) pi(b) / (pi(a) + pi(b))^2` (x, x*: the log-odds under pi, pi*), so

    sum_s d^pi(s) w_s e_s^2 <= 2 tau (1-gamma) M(pi).

The harness-transfer study's "squared error <= M / (4 tau (1-gamma))" is not
scale-consistent under our conventions (multiply r and tau by c: the left side
scales by c^2, the right side not at all) and fails for actions that both
policies almost never take; read with the inequality the other way round it is
the upper bound above with the constant 4 where 8 is valid (i.e. true but twice
as loose). docs/estimation.md §5 has the counterexample.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax.core import bellman
from harnax.core import evaluation
from harnax.core import solvers
from harnax.core import validation as val

Array = jax.Array


def _take(x, idx):
  """`x[..., idx]` for a scalar index, else `take_along_axis` over pairs `[..., P]`."""
  idx = jnp.asarray(idx)
  if idx.ndim == 0:
    return x[..., idx]
  return jnp.take_along_axis(x, idx, axis=-1)


def _check_pair(policy, pi_star):
  policy = val.as_float_array("policy", policy)
  pi_star = val.as_float_array("pi_star", pi_star, policy.dtype)
  if policy.shape != pi_star.shape or policy.ndim < 1:
    raise ValueError(f"pi_star: expected shape {list(policy.shape)} like policy, got "
                     f"{list(pi_star.shape)}")
  val.check_distribution("policy", policy)
  val.check_distribution("pi_star", pi_star)
  return policy, pi_star


def pair_score_errors(log_policy, scores, actions_a, actions_b, tau) -> Array:
  """`e(a, b) = tau (log pi(a) - log pi(b)) - (F*(a) - F*(b))`.

  `log_policy` may be unnormalised (e.g. empirical log-counts): constants cancel.

  Args:
    log_policy: `[..., A]` log-probabilities (or log-odds up to a constant).
    scores: `[..., A]` optimal action scores `F*` (or `tau log pi*`).
    actions_a, actions_b: int `[..., P]` pairs of action indices.
    tau: temperature > 0.

  Returns:
    `[..., P]` score errors.
  """
  val.check_temperature(tau)
  lp = jnp.asarray(log_policy)
  f = jnp.asarray(scores)
  return tau * (_take(lp, actions_a) - _take(lp, actions_b)) - (_take(f, actions_a)
                                                                - _take(f, actions_b))


def empirical_log_odds(counts, actions_a, actions_b, *, pseudocount: float = 0.5) -> Array:
  """`log((n_a + c) / (n_b + c))` from sampled action counts `[..., A]`.

  The pseudocount keeps unseen actions finite (c = 1/2 is the Jeffreys choice;
  the estimate's bias is O(1/N) for actions with probability bounded below).
  """
  counts = jnp.asarray(counts)
  if pseudocount < 0:
    raise ValueError(f"pseudocount: expected >= 0, got {pseudocount}")
  lc = jnp.log(counts + pseudocount)
  return _take(lc, actions_a) - _take(lc, actions_b)


def centered_score_errors(policy, pi_star, tau) -> Array:
  """`eps(s, a) = tau (l(s,a) - mean_{available} l(s,.))`, `l = log(pi/pi*)`.

  Available actions are those with `pi* > 0` (the support of `pi_ref`).
  `[S, A]`; 0 at unavailable actions; `-inf`/NaN where `pi` is 0 on an
  available action (its log-odds are infinite).
  """
  policy, pi_star = _check_pair(policy, pi_star)
  mask = pi_star > 0
  l = jnp.where(mask, bellman.safe_log(policy) - bellman.safe_log(jnp.where(mask, pi_star, 1.0)),
                0.0)
  return tau * bellman.centered(l, mask)


def score_error_range(policy, pi_star, tau) -> Array:
  """`Delta_s = max_{a,b available} e_s(a, b) = tau (max l - min l)`, `[S]`.

  `+inf` where `pi` is zero on an available action; 0 with one available action.
  """
  policy, pi_star = _check_pair(policy, pi_star)
  return _range(policy, pi_star, tau)


def _range(policy, pi_star, tau):
  mask = pi_star > 0
  l = bellman.safe_log(policy) - bellman.safe_log(jnp.where(mask, pi_star, 1.0))
  hi = jnp.max(jnp.where(mask, l, -jnp.inf), axis=-1)
  lo = jnp.min(jnp.where(mask, l, jnp.inf), axis=-1)
  return tau * jnp.where(lo == -jnp.inf, jnp.inf, hi - lo)


def mismatch_upper_bound(state_weights, score_ranges, tau, discount) -> Array:
  """`sum_s w(s) Delta_s^2 / (8 tau (1-gamma)) >= M` when `w = d^pi`.

  With sampled states `s_i ~ d^pi`, pass `w = 1/n` at each sample for an
  unbiased estimate of the bound.

  Args:
    state_weights: `[n]` non-negative weights summing to 1 (e.g. `d^pi`).
    score_ranges: `[n]` `Delta_s` (from `score_error_range` or estimated).
    tau: temperature; discount: gamma.
  """
  w = jnp.asarray(state_weights)
  r = jnp.asarray(score_ranges)
  terms = jnp.where(w > 0, w * r ** 2, 0.0)
  return jnp.sum(terms) / (8.0 * tau * (1.0 - discount))


def pair_weights(policy, pi_star, actions_a, actions_b) -> Array:
  """`w(a, b) = (pi(a) + pi(b)) min(sigma'(x), sigma'(x*))` for the pair bound.

  `sigma'(x) = p_a p_b / (p_a + p_b)^2` is the variance of the pair's
  conditional Bernoulli. Rows `[..., A]`, pairs `[..., P]` -> `[..., P]`; 0
  where `pi` puts no mass on one of the two actions.
  """
  policy, pi_star = _check_pair(policy, pi_star)
  return _pair_weights(policy, pi_star, actions_a, actions_b)


def _pair_weights(policy, pi_star, actions_a, actions_b):
  pa, pb = _take(policy, actions_a), _take(policy, actions_b)
  qa, qb = _take(pi_star, actions_a), _take(pi_star, actions_b)

  def bern_var(x, y):
    tot = x + y
    return jnp.where(tot > 0, x * y / jnp.where(tot > 0, tot, 1.0) ** 2, 0.0)

  return (pa + pb) * jnp.minimum(bern_var(pa, pb), bern_var(qa, qb))


def weighted_pair_errors(policy, pi_star, actions_a, actions_b, tau) -> Array:
  """`w(a, b) e(a, b)^2 <= 2 tau^2 KL(pi || pi*)` per state (0 where `w = 0`).

  Rows `[S, A]`, pairs int `[S, P]` -> `[S, P]`.
  """
  policy, pi_star = _check_pair(policy, pi_star)
  val.check_temperature(tau)
  return _weighted_pair_errors(policy, pi_star, actions_a, actions_b, tau)


def _weighted_pair_errors(policy, pi_star, actions_a, actions_b, tau):
  w = _pair_weights(policy, pi_star, actions_a, actions_b)
  lp, lq = bellman.safe_log(policy), bellman.safe_log(pi_star)
  e = tau * ((_take(lp, actions_a) - _take(lp, actions_b))
             - (_take(lq, actions_a) - _take(lq, actions_b)))
  return jnp.where(w > 0, w * jnp.where(w > 0, e, 0.0) ** 2, 0.0)


def mismatch_lower_bound(state_weights, weighted_errors, tau, discount) -> Array:
  """`sum_s w(s) [w_s e_s^2] / (2 tau (1-gamma)) <= M` when `w = d^pi`.

  Args:
    state_weights: `[n]` (e.g. `d^pi`, or `1/n` at sampled states).
    weighted_errors: `[n]` one pair's `w e^2` per state (or any average over
      pairs of them).
  """
  w = jnp.asarray(state_weights)
  terms = jnp.where(w > 0, w * jnp.asarray(weighted_errors), 0.0)
  return jnp.sum(terms) / (2.0 * tau * (1.0 - discount))


def exact_bounds(mdp, policy, pi_ref, tau, *, solution=None) -> tuple[Array, Array, Array]:
  """`(lower, M, upper)` with the exact occupancy: the lower bound uses, per
  state, the best pair (largest `w e^2`).

  Returns:
    Scalars `lower <= M <= upper`.
  """
  policy, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  if solution is None:
    solution = solvers.solve_soft_bellman(mdp, pi_ref, tau)
  pi_star = solution.policy
  return _exact_bounds(mdp, policy, pi_star, tau, evaluation.occupancy(mdp, policy))


@jax.jit
def _exact_bounds(mdp, policy, pi_star, tau, d):
  kl = bellman.kl_between(policy, pi_star)
  m = tau / (1.0 - mdp.discount) * jnp.dot(d, kl)
  upper = mismatch_upper_bound(d, _range(policy, pi_star, tau), tau, mdp.discount)
  s, a = policy.shape
  aa = jnp.broadcast_to(jnp.repeat(jnp.arange(a), a), (s, a * a))
  bb = jnp.broadcast_to(jnp.tile(jnp.arange(a), a), (s, a * a))
  we = _weighted_pair_errors(policy, pi_star, aa, bb, tau)
  lower = mismatch_lower_bound(d, jnp.max(we, axis=-1), tau, mdp.discount)
  return lower, m, upper
