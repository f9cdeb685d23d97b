"""Spec of `harnax.core.sampling`: inversion sampling and the state marginals of rollouts.

Rollouts of compiled harnesses (absorbing end states, Monte Carlo returns, bad
input) are specified in tests/envs/test_rollout.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax.core import sampling

N = 20000
# Upper 1e-6 tail of chi-square with 3 degrees of freedom: a false alarm has
# probability 1e-6 per test.
CHI2_3DOF_1E6 = 30.66


def test_inverse_cdf_picks_the_interval_and_never_a_zero():
  probs = jnp.array([0.2, 0.0, 0.5, 0.3, 0.0])
  # Interval ends: [0, .2) -> 0, [.2, .7) -> 2, [.7, 1) -> 3; the zeros own no interval.
  u = jnp.array([0.0, 0.19, 0.2, 0.69, 0.71, 0.999999, 1.0])
  np.testing.assert_array_equal(sampling.inverse_cdf(u, probs), [0, 0, 2, 2, 3, 3, 3])


def test_categorical_frequencies_follow_the_rows():
  probs = jnp.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.0, 0.25, 0.25]])
  draws = sampling.categorical(jax.random.key(0), jnp.broadcast_to(probs, (N, 2, 4)))
  assert draws.shape == (N, 2) and draws.dtype == jnp.int32
  for row in range(2):
    counts = np.bincount(np.asarray(draws[:, row]), minlength=4)
    want = N * np.asarray(probs[row])
    assert counts[want == 0].sum() == 0
    pos = want > 0
    assert np.sum((counts[pos] - want[pos]) ** 2 / want[pos]) < CHI2_3DOF_1E6


@pytest.mark.parametrize("sparse", [False, True])
def test_rollout_state_marginals_follow_the_policy_matrix(sparse):
  key = jax.random.key(0)
  mdp = (hx.random_sparse_mdp(key, 7, 3, 2, discount=0.8) if sparse
         else hx.random_dense_mdp(key, 7, 3, discount=0.8))
  ref = hx.random_reference(jax.random.key(1), 7, 3, unavailable_fraction=0.3)
  pi = hx.random_policy(jax.random.key(2), ref)
  out = hx.rollout(jax.random.key(8), mdp, pi, num_envs=N, num_steps=3)
  assert out.states.shape == out.actions.shape == out.rewards.shape == (N, 3)
  # Independent reference: mu0^T P_pi^2 from the dense transitions in NumPy.
  p = np.asarray(hx.to_dense(mdp).transitions, np.float64)
  p_pi = np.einsum("sa,sat->st", np.asarray(pi, np.float64), p)
  marg = np.asarray(mdp.initial, np.float64) @ p_pi @ p_pi
  emp = np.bincount(np.asarray(out.states[:, 2]), minlength=7) / N
  # TV of a 7-state histogram from N draws is about 0.3 sqrt(7/N) ~ 0.006.
  assert 0.5 * np.abs(emp - marg).sum() < 0.02
  s, a = np.asarray(out.states), np.asarray(out.actions)
  np.testing.assert_allclose(np.asarray(out.rewards), np.asarray(mdp.rewards)[s, a])
  assert np.all(np.asarray(pi)[s, a] > 0)  # actions never leave the policy's support
