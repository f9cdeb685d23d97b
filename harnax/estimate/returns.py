"""The "frequency rollout" baseline: Monte-Carlo regularized return.

`J_hat = mean_i sum_{t<H} gamma^t [r(s_t, a_t) - tau log(pi(a_t|s_t)/pi_ref(a_t|s_t))]`
along n sampled rollouts of the deployed policy. Each step's regularization
term is the sampled (k1) form of `tau KL(pi(.|s_t) || pi_ref(.|s_t))`, so the
untruncated sum is unbiased for `J(pi)`; truncation at H changes its mean by at
most `gamma^H max_s |c_pi(s)| / (1-gamma)`, `c_pi(s) = sum_a pi r - tau KL(pi || pi_ref)`
(returned as `truncation_bias`).

Budget: the rollouts cost `n * H` environment steps and `n * H` action samples;
compare with the mismatch estimate's `env_steps + action_samples` at equal totals.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from harnax.core import bellman
from harnax.core import evaluation
from harnax.core import sampling
from harnax.core import validation as val
from harnax.estimate import bootstrap

Array = jax.Array


def rollout_return(key, mdp, policy, pi_ref, tau, *, num_rollouts: int, horizon: int,
                   confidence: float = 0.9, num_resamples: int = 1000) -> bootstrap.SampleEstimate:
  """Monte-Carlo estimate of `J(pi)` from `num_rollouts` rollouts of `horizon` steps.

  Args:
    key: a `jax.random` key.
    mdp: one MDP (dense or sparse).
    policy: `[S, A]` deployed policy; pi_ref: `[S, A]`; tau: temperature > 0.
    num_rollouts: n >= 1; horizon: H >= 1 (static).
    confidence, num_resamples: bootstrap interval options.

  Returns:
    `SampleEstimate`; `samples` holds the n discounted regularized returns, and
    `truncation_bias` is `gamma^H max |c_pi| / (1-gamma)`.
  """
  policy, pi_ref, tau = evaluation.check_policy_inputs(mdp, policy, pi_ref, tau)
  val.check_count("num_rollouts", num_rollouts)
  val.check_count("horizon", horizon)
  bootstrap.check_bootstrap_options(confidence, num_resamples)
  return _rollout_return(key, mdp, policy, pi_ref, tau, num_rollouts, horizon, confidence,
                         num_resamples)


@functools.partial(jax.jit, static_argnums=(5, 6, 8))
def _rollout_return(key, mdp, policy, pi_ref, tau, num_rollouts, horizon, confidence,
                    num_resamples):
  k_roll, k_boot = jax.random.split(key)
  traj = sampling.rollout(k_roll, mdp, policy, num_envs=num_rollouts, num_steps=horizon)
  # Sampled actions have pi > 0, so the log-ratio is finite.
  steps = traj.rewards - tau * bellman.log_ratio(policy, pi_ref)[traj.states, traj.actions]
  weights = mdp.discount ** jnp.arange(horizon, dtype=steps.dtype)
  returns = steps @ weights
  lo, hi = bootstrap.bootstrap_ci(k_boot, returns, confidence=confidence,
                                  num_resamples=num_resamples)
  c = evaluation.regularized_reward(mdp, policy, pi_ref, tau)
  return bootstrap.SampleEstimate(
      value=jnp.mean(returns), samples=returns, stderr=bootstrap.standard_error(returns),
      ci_low=lo, ci_high=hi,
      truncation_bias=mdp.discount ** horizon * jnp.max(jnp.abs(c)) / (1.0 - mdp.discount),
      env_steps=jnp.asarray(num_rollouts * horizon),
      action_samples=jnp.asarray(num_rollouts * horizon))
