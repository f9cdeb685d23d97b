"""Sample-based mismatch: `M = tau/(1-gamma) E_{s ~ d^pi} KL(pi(.|s) || pi*(.|s))`.

Two stages (docs/estimation.md):

1. states `s_1..s_n ~ d^pi` by geometric stopping (`sampling.sample_occupancy`);
2. at each state, N actions `a_j ~ pi(.|s_i)` through the deployed policy, and a
   per-state KL estimate from them:

   * `"plugin"`: KL of the empirical action distribution `p_hat` to `pi*`.
     Biased upward by about `(m - 1)/(2N)` (m = support of `pi(.|s)`): the
     cross-entropy term is linear in `p_hat`, the entropy term is not.
   * `"miller_madow"`: plug-in minus `(k - 1)/(2N)`, k = distinct actions
     observed (Miller 1955, Madow's correction of the entropy bias), then
     clipped at 0 (a KL is non-negative; the clip adds a small upward bias
     only where the true KL is within O(1/N) of 0).
   * `"k1"`: mean of `l_j = log pi(a_j|s) - log pi*(a_j|s)`; unbiased, may be
     negative. Needs the policy's log-probabilities of its own samples.
   * `"k3"`: mean of `exp(-l_j) - 1 + l_j`; unbiased and >= 0 term by term.

The mismatch estimate is `tau/(1-gamma) * mean_i KL_hat(s_i)`, with variance
(for k1 exactly, for the others to first order)

  Var M_hat = (tau/(1-gamma))^2 [Var_{d^pi} KL(s) + E_{d^pi} Var(k|s)/N] / n,

`Var(k|s)` being the variance of one action's term (`l` for k1). Confidence
intervals are percentile bootstraps over states (the per-state estimates are
i.i.d. given the policy).

The every-step variant `tau * sum_{t<H} gamma^t KL_hat(s_t)` along full
rollouts uses every visited state; truncation at H biases it low by at most
`tau * gamma^H * max_s KL(s) / (1-gamma)`, returned with the estimate.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import bellman
from harnax.core import evaluation
from harnax.core import mdp as mdp_lib
from harnax.core import sampling as core_sampling
from harnax.core import validation as val
from harnax.estimate import bootstrap
from harnax.estimate import sampling

Array = jax.Array

ESTIMATORS = ("plugin", "miller_madow", "k1", "k3")


# ---------------------------------------------------------------------------
# Per-state KL estimators.
# ---------------------------------------------------------------------------

def _check_counts(counts) -> Array:
  counts = val.as_float_array("counts", counts)
  if counts.ndim < 1 or counts.shape[-1] == 0:
    raise ValueError(f"counts: expected shape [..., A] with A >= 1, got {list(counts.shape)}")
  if counts.size == 0:
    raise ValueError("counts: expected at least one state's action counts, got an empty array")
  c = val.host(counts)
  if c is not None:
    if np.any(c < 0) or not np.all(np.isfinite(c)):
      raise ValueError("counts: expected finite non-negative action counts")
    empty = c.sum(-1) <= 0
    if np.any(empty):
      idx = tuple(int(i) for i in np.argwhere(empty)[0])
      raise ValueError(f"counts: every state needs N >= 1 action samples; the row at index {idx} "
                       "has none")
  return counts


def plugin_kl(counts, target, *, correction: str = "miller_madow", clip: bool = True) -> Array:
  """KL of the empirical action distribution to `target`, optionally bias-corrected.

  Args:
    counts: `[..., A]` action counts from N >= 1 samples per row.
    target: `[..., A]` distributions (e.g. `pi*` at the sampled states).
    correction: `"miller_madow"` (subtract `(k-1)/(2N)`, k = observed actions)
      or `"none"`.
    clip: clip the corrected value at 0 (ignored without correction).

  Returns:
    `[...]`. `+inf` where an observed action has `target == 0`.
  """
  counts = _check_counts(counts)
  target = val.as_float_array("target", target, counts.dtype)
  if target.shape != counts.shape:
    raise ValueError(f"target: expected shape {list(counts.shape)} like counts, got "
                     f"{list(target.shape)}")
  val.check_distribution("target", target)
  if correction not in ("miller_madow", "none"):
    raise ValueError(f"correction: expected 'miller_madow' or 'none', got {correction!r}")
  return _plugin_kl(counts, target, correction == "miller_madow", clip)


def _plugin_kl(counts, target, miller_madow, clip):
  n = jnp.sum(counts, axis=-1)
  p_hat = counts / n[..., None]
  kl = bellman.kl_between(p_hat, target)
  if miller_madow:
    k = jnp.sum(counts > 0, axis=-1)
    kl = kl - (k - 1) / (2.0 * n)
    if clip:
      kl = jnp.maximum(kl, 0.0)
  return kl


def _check_logs(logp, logq):
  logp = val.as_float_array("log_policy", logp)
  logq = val.as_float_array("log_target", logq, logp.dtype)
  if logp.shape != logq.shape:
    raise ValueError(f"log_target: expected shape {list(logp.shape)} like log_policy, got "
                     f"{list(logq.shape)}")
  if logp.ndim < 1 or logp.shape[-1] == 0:
    raise ValueError(f"log_policy: expected [..., N] log-probabilities of N >= 1 sampled "
                     f"actions, got shape {list(logp.shape)}")
  return logp, logq


def k1_kl(log_policy, log_target) -> Array:
  """Unbiased per-state KL: `mean_j (log pi(a_j) - log pi*(a_j))`, `a_j ~ pi`.

  Args:
    log_policy: `[..., N]`, `log pi(a_j|s)` of the N sampled actions.
    log_target: `[..., N]`, `log pi*(a_j|s)` of the same actions.

  Returns:
    `[...]`; unbiased for `KL(pi || pi*)`, can be negative.
  """
  logp, logq = _check_logs(log_policy, log_target)
  return jnp.mean(logp - logq, axis=-1)


def k3_kl(log_policy, log_target) -> Array:
  """Unbiased non-negative per-state KL: `mean_j (exp(-l_j) - 1 + l_j)`.

  `l_j = log pi(a_j) - log pi*(a_j)`; `E exp(-l) = 1` under `a ~ pi` when
  `supp pi* ⊆ supp pi`, and `x - 1 - log x >= 0`. Shapes as `k1_kl`.
  """
  logp, logq = _check_logs(log_policy, log_target)
  return jnp.mean(_k3_terms(logp - logq), axis=-1)


def _k3_terms(l):
  return jnp.expm1(-l) + l


# ---------------------------------------------------------------------------
# Aggregation (standard errors and intervals: `bootstrap`).
# ---------------------------------------------------------------------------

def mismatch_from_state_kls(state_kls, tau, discount) -> Array:
  """`tau/(1-gamma) * mean_i KL_hat(s_i)` for states `s_i ~ d^pi`. `[n]` -> scalar."""
  state_kls = bootstrap.check_values("state_kls", state_kls)
  val.check_temperature(tau)
  val.check_discount(discount)
  return tau / (1.0 - discount) * jnp.mean(state_kls)


# ---------------------------------------------------------------------------
# End-to-end estimators on tabular MDPs.
# ---------------------------------------------------------------------------

def _state_kl_estimates(key, policy, pi_star, states, num_action_samples, estimator):
  """Per-state estimates at `states` (any shape) from N sampled actions each."""
  rows = policy[states]                                    # [..., A]
  u = jax.random.uniform(key, states.shape + (num_action_samples,), rows.dtype)
  actions = core_sampling.inverse_cdf(u, rows[..., None, :])        # [..., N]
  if estimator in ("k1", "k3"):
    lp = jnp.take_along_axis(bellman.safe_log(rows), actions, axis=-1)
    lq = jnp.take_along_axis(bellman.safe_log(pi_star[states]), actions, axis=-1)
    l = lp - lq
    return jnp.mean(l if estimator == "k1" else _k3_terms(l), axis=-1)
  counts = jnp.sum(jax.nn.one_hot(actions, rows.shape[-1], dtype=rows.dtype), axis=-2)
  return _plugin_kl(counts, pi_star[states], estimator == "miller_madow", True)


def _check_estimator_inputs(mdp, policy, pi_star, tau, estimator, num_action_samples):
  mdp_lib.check_single_mdp(mdp)
  s, a, dtype = mdp.num_states, mdp.num_actions, mdp.rewards.dtype
  policy = val.check_policy_array("policy", policy, s, a, dtype)
  pi_star = val.check_policy_array("pi_star", pi_star, s, a, dtype)
  val.check_temperature(tau, scalar=True)
  if estimator not in ESTIMATORS:
    raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {estimator!r}")
  val.check_count("num_action_samples", num_action_samples)
  p, q = val.host(policy), val.host(pi_star)
  if p is not None and q is not None and np.any((p > 0) & (q <= 0)):
    s, a = (int(i) for i in np.argwhere((p > 0) & (q <= 0))[0])
    raise ValueError(f"pi_star: zero at state {s}, action {a} where the policy has mass; "
                     "KL(pi || pi*) is infinite")
  return policy, pi_star, val.as_float_array("tau", tau, mdp.rewards.dtype)


def estimate_mismatch(key, mdp, policy, pi_star, tau, *, num_states: int,
                      num_action_samples: int, estimator: str = "miller_madow",
                      max_steps: int = 10_000, confidence: float = 0.9,
                      num_resamples: int = 1000) -> bootstrap.SampleEstimate:
  """Geometric-stopping mismatch estimate with a bootstrap interval.

  Args:
    key: a `jax.random` key.
    mdp: one MDP (dense or sparse).
    policy: `[S, A]` deployed policy (sampled; its log-probabilities are used
      only by `"k1"`/`"k3"`).
    pi_star: `[S, A]` optimum, e.g. `solve_soft_bellman(...).policy`.
    tau: temperature > 0.
    num_states: n, states drawn from `d^pi`.
    num_action_samples: N actions per state, >= 1.
    estimator: one of `ESTIMATORS`.
    max_steps: rollout cap of the geometric sampler.
    confidence: bootstrap level; num_resamples: bootstrap replicates.

  Returns:
    `SampleEstimate`; `samples` holds the n per-state KL estimates.
  """
  policy, pi_star, tau = _check_estimator_inputs(mdp, policy, pi_star, tau, estimator,
                                                 num_action_samples)
  val.check_count("num_states", num_states)
  val.check_count("max_steps", max_steps, 0)
  bootstrap.check_bootstrap_options(confidence, num_resamples)
  return _estimate_mismatch(key, mdp, policy, pi_star, tau, num_states, num_action_samples,
                            estimator, max_steps, confidence, num_resamples)


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8, 10))
def _estimate_mismatch(key, mdp, policy, pi_star, tau, num_states, num_action_samples,
                       estimator, max_steps, confidence, num_resamples):
  k_occ, k_act, k_boot = jax.random.split(key, 3)
  occ = sampling.sample_occupancy(k_occ, mdp, policy, num_samples=num_states,
                                  max_steps=max_steps)
  kls = _state_kl_estimates(k_act, policy, pi_star, occ.states, num_action_samples, estimator)
  scale = tau / (1.0 - mdp.discount)
  lo, hi = bootstrap.bootstrap_ci(k_boot, kls, confidence=confidence,
                                  num_resamples=num_resamples, scale=scale)
  max_kl = jnp.max(bellman.kl_between(policy, pi_star))
  return bootstrap.SampleEstimate(
      value=scale * jnp.mean(kls), samples=kls, stderr=scale * bootstrap.standard_error(kls),
      ci_low=lo, ci_high=hi, truncation_bias=scale * occ.truncation_bias * max_kl,
      # The pilot rollouts draw one action per transition, then N actions per sampled state.
      env_steps=jnp.sum(occ.steps),
      action_samples=jnp.sum(occ.steps) + num_states * num_action_samples)


def every_step_mismatch(key, mdp, policy, pi_star, tau, *, num_rollouts: int, horizon: int,
                        num_action_samples: int, estimator: str = "miller_madow",
                        confidence: float = 0.9,
                        num_resamples: int = 1000) -> bootstrap.SampleEstimate:
  """Every-step estimate `tau * mean_i sum_{t<H} gamma^t KL_hat(s_{i,t})`.

  `E sum_t gamma^t KL(s_t) = E_{d^pi} KL / (1-gamma)`, so the untruncated sum is
  unbiased for `M`; stopping at H drops at most
  `tau * gamma^H * max_s KL(s) / (1-gamma)` (returned as `truncation_bias`;
  the estimate is low by at most that).

  Args:
    key, mdp, policy, pi_star, tau, estimator, confidence, num_resamples: as in
      `estimate_mismatch`.
    num_rollouts: n rollouts; horizon: H steps each (static).
    num_action_samples: N actions at every visited state.

  Returns:
    `SampleEstimate`; `samples` holds the n per-rollout discounted KL sums
    (unscaled by tau).
  """
  policy, pi_star, tau = _check_estimator_inputs(mdp, policy, pi_star, tau, estimator,
                                                 num_action_samples)
  val.check_count("num_rollouts", num_rollouts)
  val.check_count("horizon", horizon)
  bootstrap.check_bootstrap_options(confidence, num_resamples)
  return _every_step(key, mdp, policy, pi_star, tau, num_rollouts, horizon, num_action_samples,
                     estimator, confidence, num_resamples)


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8, 10))
def _every_step(key, mdp, policy, pi_star, tau, num_rollouts, horizon, num_action_samples,
                estimator, confidence, num_resamples):
  k_roll, k_act, k_boot = jax.random.split(key, 3)
  traj = core_sampling.rollout(k_roll, mdp, policy, num_envs=num_rollouts, num_steps=horizon)
  kls = _state_kl_estimates(k_act, policy, pi_star, traj.states, num_action_samples, estimator)
  weights = mdp.discount ** jnp.arange(horizon, dtype=kls.dtype)
  sums = kls @ weights
  lo, hi = bootstrap.bootstrap_ci(k_boot, sums, confidence=confidence,
                                  num_resamples=num_resamples, scale=tau)
  max_kl = jnp.max(bellman.kl_between(policy, pi_star))
  return bootstrap.SampleEstimate(
      value=tau * jnp.mean(sums), samples=sums, stderr=tau * bootstrap.standard_error(sums),
      ci_low=lo, ci_high=hi,
      truncation_bias=tau * mdp.discount ** horizon * max_kl / (1.0 - mdp.discount),
      env_steps=jnp.asarray(num_rollouts * horizon),
      # One action per step drives the rollout; N more per visited state estimate its KL.
      action_samples=jnp.asarray(num_rollouts * horizon * (1 + num_action_samples)))


def mismatch_estimator_variance(mdp, policy, pi_star, tau, *, num_states: int,
                                num_action_samples: int, estimator: str = "k1") -> Array:
  """`(tau/(1-gamma))^2 [Var_d KL(s) + E_d Var(k|s)/N] / n` (docs/estimation.md).

  `Var(k|s)` is the variance of one sampled action's term: `l` for `"k1"` (the
  formula is then exact), `exp(-l) - 1 + l` for `"k3"` (exact), and `l` for the
  plug-in estimators (their first-order, delta-method variance).

  Returns:
    Scalar, the variance of `estimate_mismatch(...).value` (ignoring the cap).
  """
  policy, pi_star, tau = _check_estimator_inputs(mdp, policy, pi_star, tau, estimator,
                                                 num_action_samples)
  n = val.check_count("num_states", num_states)
  d = evaluation.occupancy(mdp, policy)
  kl = bellman.kl_between(policy, pi_star)
  pos = policy > 0
  l = bellman.log_ratio(policy, pi_star)
  if estimator == "k3":
    terms = jnp.where(pos, _k3_terms(l), 0.0)
    mean_t = jnp.sum(policy * terms, -1)
    var_k = jnp.sum(policy * terms ** 2, -1) - mean_t ** 2
  else:
    var_k = jnp.sum(policy * l ** 2, -1) - kl ** 2
  var_d = jnp.dot(d, kl ** 2) - jnp.dot(d, kl) ** 2
  return (tau / (1.0 - mdp.discount)) ** 2 * (var_d + jnp.dot(d, var_k) / num_action_samples) / n
