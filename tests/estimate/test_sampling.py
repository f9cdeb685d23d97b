"""Geometric stopping reproduces d^pi (JAX and gymnasium samplers); histograms."""

import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax.estimate import sampling


def _problem(sparse=False, discount=0.8):
  key = jax.random.PRNGKey(0)
  if sparse:
    mdp = hx.random_sparse_mdp(key, 7, 3, 2, discount=discount)
  else:
    mdp = hx.random_dense_mdp(key, 7, 3, discount=discount)
  ref = hx.random_reference(jax.random.PRNGKey(1), 7, 3, unavailable_fraction=0.3)
  return mdp, hx.random_policy(jax.random.PRNGKey(2), ref)


N = 20000  # one sample size throughout: each (MDP shape, N) compiles once


@pytest.mark.parametrize("sparse", [False, True])
def test_geometric_stopping_reproduces_occupancy(sparse):
  mdp, pi = _problem(sparse)
  d = np.asarray(hx.occupancy(mdp, pi))
  occ = sampling.sample_occupancy(jax.random.PRNGKey(3), mdp, pi, num_samples=N)
  states = np.asarray(occ.states)
  tvs = [0.5 * np.abs(np.bincount(states[:n], minlength=7) / n - d).sum() for n in (200, 2000, N)]
  # The TV of an n-sample histogram on 7 states is about 0.3 sqrt(S/n) (0.05 at
  # n = 200, 0.005 at n = 20000): it must shrink to the sampling floor.
  assert tvs[0] > tvs[2] and tvs[1] < 0.05 and tvs[2] < 0.02
  assert not bool(jnp.any(occ.truncated))


def test_stopping_time_is_geometric():
  mdp, pi = _problem(discount=0.7)
  occ = sampling.sample_occupancy(jax.random.PRNGKey(4), mdp, pi, num_samples=N)
  steps = np.asarray(occ.steps)
  for t in range(4):
    assert abs(np.mean(steps == t) - 0.3 * 0.7 ** t) < 0.012


# Upper 1e-6 tail of the chi-square distribution with 6 degrees of freedom (7 states):
# a correct sampler fails the goodness-of-fit test below with probability 1e-6.
CHI2_6DOF_1E6 = 38.26


def test_zero_discount_emits_the_initial_distribution():
  mdp, pi = _problem(discount=0.0)
  mu0 = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02])  # not uniform, so order matters
  mdp = mdp.replace(initial=mu0)
  occ = sampling.sample_occupancy(jax.random.PRNGKey(5), mdp, pi, num_samples=N)
  assert int(jnp.max(occ.steps)) == 0
  # With gamma = 0 the rollout stops before its first step: states ~ mu0 (Pearson test).
  counts = np.bincount(np.asarray(occ.states), minlength=7)
  chi2 = float(np.sum((counts - N * mu0) ** 2 / (N * mu0)))
  assert chi2 < CHI2_6DOF_1E6


def test_cap_flags_truncated_rollouts_and_bounds_the_bias():
  mdp, pi = _problem(discount=0.9)
  occ = sampling.sample_occupancy(jax.random.PRNGKey(6), mdp, pi, num_samples=N, max_steps=3)
  assert abs(float(jnp.mean(occ.truncated)) - 0.9 ** 3) < 0.015
  assert abs(float(occ.truncation_bias) - 0.9 ** 3) < 1e-12
  assert int(jnp.max(occ.steps)) == 3


def test_state_histogram_and_total_variation():
  h = sampling.state_histogram(jnp.array([0, 2, 2, 1]), num_states=4)
  np.testing.assert_allclose(h, [0.25, 0.25, 0.5, 0.0])
  assert float(sampling.total_variation(h, jnp.array([0.5, 0.5, 0.0, 0.0]))) == pytest.approx(0.5)


def test_sampler_vmaps_over_keys_and_jits():
  mdp, pi = _problem()
  keys = jax.random.split(jax.random.PRNGKey(7), 3)
  f = lambda k: sampling.sample_occupancy(k, mdp, pi, num_samples=10).states  # noqa: E731
  out = jax.jit(jax.vmap(f))(keys)
  assert out.shape == (3, 10)
  np.testing.assert_array_equal(out[1], f(keys[1]))


def _frozen_lake_mdp(env, discount):
  s, a = env.observation_space.n, env.action_space.n
  p = np.zeros((s, a, s))
  r = np.zeros((s, a))
  for i in range(s):
    for j in range(a):
      for prob, nxt, rew, _ in env.unwrapped.P[i][j]:
        p[i, j, nxt] += prob
        r[i, j] += prob * rew
  mu0 = np.asarray(env.unwrapped.initial_state_distrib, float)
  return hx.TabularMDP(transitions=p, rewards=r, discount=discount, initial=mu0)


def test_gym_sampler_reproduces_occupancy_on_frozen_lake():
  env = FrozenLakeEnv(map_name="4x4", is_slippery=True)   # no TimeLimit: terminal absorbs
  table = np.asarray(hx.random_policy(jax.random.PRNGKey(9), hx.uniform_reference(16, 4)))
  cdf = np.cumsum(table, -1)

  def policy_fn(obs, rng):
    return min(int(np.searchsorted(cdf[obs], rng.random(), "right")), 3)

  d = np.asarray(hx.occupancy(_frozen_lake_mdp(env, 0.9), table))
  tvs = []
  for n in (300, 6000):
    out = sampling.sample_occupancy_gym(np.random.default_rng(0), env, policy_fn, 0.9,
                                        num_samples=n)
    emp = np.bincount(np.asarray(out.observations), minlength=16) / n
    tvs.append(0.5 * np.abs(emp - d).sum())
    assert out.env_steps == int(out.steps.sum())
  assert tvs[1] < tvs[0]
  assert tvs[1] < 0.04
  assert np.any(out.ended)   # episodes do end in holes/goal and are absorbed


def test_gym_sampler_caps_rollouts():
  env = gym.make("FrozenLake-v1", is_slippery=False)
  out = sampling.sample_occupancy_gym(np.random.default_rng(1), env, lambda o, r: 2, 0.99,
                                      num_samples=50, max_steps=2)
  assert out.steps.max() <= 2
  assert out.truncation_bias == pytest.approx(0.99 ** 2)


def test_bad_inputs_raise_naming_the_field():
  mdp, pi = _problem()
  with pytest.raises(ValueError, match="num_samples"):
    sampling.sample_occupancy(jax.random.PRNGKey(0), mdp, pi, num_samples=0)
  with pytest.raises(ValueError, match="policy"):
    sampling.sample_occupancy(jax.random.PRNGKey(0), mdp, pi * 0.5, num_samples=4)
  with pytest.raises(ValueError, match="mdp"):
    sampling.sample_occupancy(jax.random.PRNGKey(0), hx.stack([mdp, mdp]), pi, num_samples=4)
  with pytest.raises(ValueError, match="max_steps"):
    sampling.sample_occupancy(jax.random.PRNGKey(0), mdp, pi, num_samples=4, max_steps=-1)
  with pytest.raises(ValueError, match="states"):
    sampling.state_histogram(jnp.zeros((0,), jnp.int32), num_states=7)
  env = FrozenLakeEnv()
  with pytest.raises(ValueError, match="discount"):
    sampling.sample_occupancy_gym(np.random.default_rng(0), env, lambda o, r: 0, 1.0,
                                  num_samples=2)
  with pytest.raises(ValueError, match="rng"):
    sampling.sample_occupancy_gym(0, env, lambda o, r: 0, 0.5, num_samples=2)
