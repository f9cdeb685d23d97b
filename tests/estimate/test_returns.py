"""The frequency-rollout baseline: Monte-Carlo regularized return vs exact J."""

import jax
import numpy as np
import pytest

import harnax as hx
from harnax.estimate import returns

TAU = 0.5


@pytest.fixture(scope="module")
def problem():
  mdp = hx.random_dense_mdp(jax.random.PRNGKey(50), 6, 3, discount=0.8)
  ref = hx.random_reference(jax.random.PRNGKey(51), 6, 3, unavailable_fraction=0.3)
  pi = hx.random_policy(jax.random.PRNGKey(52), ref)
  return mdp, ref, pi, float(hx.regularized_return(mdp, pi, ref, TAU))


def test_rollout_return_converges_to_exact_return(problem):
  mdp, ref, pi, j = problem
  est = returns.rollout_return(jax.random.PRNGKey(53), mdp, pi, ref, TAU, num_rollouts=20000,
                               horizon=60, num_resamples=200)
  assert abs(float(est.value) - j) <= 4 * float(est.stderr) + float(est.truncation_bias)
  assert float(est.ci_low) <= float(est.value) <= float(est.ci_high)
  assert int(est.env_steps) == int(est.action_samples) == 20000 * 60
  logp = np.log(np.where(np.asarray(pi) > 0, np.asarray(pi), 1.0))
  logr = np.log(np.where(np.asarray(ref) > 0, np.asarray(ref), 1.0))
  c_pi = np.sum(np.asarray(pi) * (np.asarray(mdp.rewards) - TAU * (logp - logr)), -1)
  assert float(est.truncation_bias) == pytest.approx(0.8 ** 60 * np.abs(c_pi).max() / 0.2)
  # Prefixes: the error shrinks like 1/sqrt(n).
  r = np.asarray(est.samples)
  for n in (500, 5000):
    assert abs(r[:n].mean() - j) <= 4 * r[:n].std(ddof=1) / np.sqrt(n) + float(est.truncation_bias)


@pytest.mark.parametrize("horizon", [2, 5])
def test_truncation_bias_bound_holds_exactly(problem, horizon):
  mdp, ref, pi, j = problem
  p_pi = np.einsum("sa,sat->st", np.asarray(pi), np.asarray(mdp.transitions))
  logp = np.log(np.where(np.asarray(pi) > 0, np.asarray(pi), 1.0))
  logr = np.log(np.where(np.asarray(ref) > 0, np.asarray(ref), 1.0))
  c_pi = np.sum(np.asarray(pi) * (np.asarray(mdp.rewards) - TAU * (logp - logr)), -1)
  x, mean = np.asarray(mdp.initial), 0.0
  for t in range(horizon):
    mean += 0.8 ** t * x @ c_pi
    x = x @ p_pi
  bound = 0.8 ** horizon * np.abs(c_pi).max() / (1 - 0.8)
  assert abs(j - mean) <= bound + 1e-12


def test_bad_input_raises(problem):
  mdp, ref, pi, _ = problem
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="num_rollouts"):
    returns.rollout_return(key, mdp, pi, ref, TAU, num_rollouts=0, horizon=3)
  with pytest.raises(ValueError, match="policy"):
    returns.rollout_return(key, mdp, pi * 2, ref, TAU, num_rollouts=2, horizon=3)
  with pytest.raises(ValueError, match="tau"):
    returns.rollout_return(key, mdp, pi, ref, 0.0, num_rollouts=2, horizon=3)
