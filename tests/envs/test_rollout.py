"""Batched JAX stepping of compiled MDPs (`harnax.core.sampling`, re-exported by `harnax.envs`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax.core import sampling as ro
from harnax.envs.miniwob import harnesses
from harnax.envs.miniwob import tasks

NUM_ENVS = 4096
NUM_STEPS = 120  # 0.9^120 ~ 3e-6: truncation is far below the Monte Carlo error
Z = 5.0  # CLT bound in standard errors: a false alarm has probability ~6e-7


def _plain_value(mdp, policy):
  """`mu0^T (I - gamma P_pi)^{-1} r_pi` in float64 NumPy (no regularization)."""
  dense = hx.to_dense(mdp)
  p = np.asarray(dense.transitions, np.float64)
  r = np.asarray(dense.rewards, np.float64)
  pi = np.asarray(policy, np.float64)
  p_pi = np.einsum("sa,sat->st", pi, p)
  v = np.linalg.solve(np.eye(len(r)) - float(dense.discount) * p_pi, (pi * r).sum(-1))
  return float(np.asarray(dense.initial, np.float64) @ v)


def _random_case(sparse):
  """A random MDP (S=12, A=4, 3 successors when sparse) and a policy with unavailable actions.

  Built in NumPy: JAX's generators compile op by op, which costs seconds here.
  """
  rng = np.random.default_rng(0)
  s, a, k = 12, 4, 3
  rewards = rng.uniform(-1.0, 1.0, (s, a)).astype(np.float32)
  initial = np.full(s, 1.0 / s, np.float32)
  if sparse:
    mdp = hx.SparseTabularMDP(successors=rng.integers(0, s, (s, a, k)),
                              probabilities=rng.dirichlet(np.ones(k), (s, a)).astype(np.float32),
                              rewards=rewards, discount=0.9, initial=initial)
  else:
    mdp = hx.TabularMDP(transitions=rng.dirichlet(np.ones(s), (s, a)).astype(np.float32),
                        rewards=rewards, discount=0.9, initial=initial)
  logits = np.where(rng.random((s, a)) < 0.3, -np.inf, rng.normal(size=(s, a)))
  logits[:, 0] = np.maximum(logits[:, 0], 0.0)  # keep an available action per state
  policy = np.exp(logits - logits.max(-1, keepdims=True))
  return mdp, (policy / policy.sum(-1, keepdims=True)).astype(np.float32)


def _deterministic_case():
  rng = np.random.default_rng(1)
  return hx.SparseTabularMDP(successors=rng.integers(0, 9, (9, 5)),
                             rewards=rng.uniform(size=(9, 5)).astype(np.float32),
                             discount=0.9, initial=np.full(9, 1.0 / 9, np.float32))


def _harness_case():
  task = tasks.sample_task("click-checkboxes", 3)
  h = harnesses.compile_harness(task, "H3", dtype=jnp.float32).harness
  return h.mdp, h.pi_ref


@functools.cache
def _rollout_case(case):
  """`(mdp, policy, Rollout)`: one compiled rollout per case, shared by tests.

  Cases: a random sparse MDP with a random policy, and a compiled page (dense)
  under its reference policy. Each rollout compiles once per test worker.
  """
  mdp, policy = _random_case(True) if case == "sparse" else _harness_case()
  out = ro.rollout(jax.random.key(1), mdp, policy, num_envs=NUM_ENVS, num_steps=NUM_STEPS)
  return mdp, policy, out


@pytest.mark.parametrize("case", ["sparse", "harness"])
def test_monte_carlo_return_matches_the_plain_value(case):
  mdp, policy, out = _rollout_case(case)
  exact = _plain_value(mdp, policy)
  # With pi_ref = policy the KL term vanishes: evaluate_policy gives the plain value.
  ev = hx.evaluate_policy(mdp, policy, policy, 1.0)
  np.testing.assert_allclose(float(ev.value), exact, rtol=1e-4, atol=1e-5)
  returns = np.asarray(out.returns, np.float64)
  stderr = returns.std(ddof=1) / np.sqrt(NUM_ENVS)
  assert abs(returns.mean() - exact) <= Z * stderr + float(out.truncation_bias) + 1e-5


@pytest.mark.parametrize("case", ["sparse", "harness"])
def test_rollout_fields_are_consistent(case):
  mdp, policy, out = _rollout_case(case)
  for name in ("states", "actions", "rewards", "dones"):
    assert getattr(out, name).shape == (NUM_ENVS, NUM_STEPS), name
  assert out.states.dtype == out.actions.dtype == jnp.int32
  assert out.dones.dtype == jnp.bool_
  p = np.asarray(hx.to_dense(mdp).transitions)
  s, a = np.asarray(out.states), np.asarray(out.actions)
  nxt = np.concatenate([s[:, 1:], np.asarray(out.final_states)[:, None]], axis=1)
  assert np.all(p[s, a, nxt] > 0)  # every transition is possible
  assert np.all(np.asarray(policy)[s, a] > 0)  # and every action available
  np.testing.assert_allclose(out.rewards, np.asarray(mdp.rewards)[s, a])
  np.testing.assert_array_equal(out.dones, np.asarray(ro.absorbing_states(mdp))[nxt])
  weights = 0.9 ** np.arange(NUM_STEPS)
  np.testing.assert_allclose(out.returns, np.asarray(out.rewards) @ weights, rtol=1e-4,
                             atol=1e-5)


def test_absorbing_states_are_the_end_state():
  c = harnesses.compile_harness(tasks.sample_task("click-tab-2", 0), "H5")
  expected = np.arange(c.done_state + 1) == c.done_state
  np.testing.assert_array_equal(ro.absorbing_states(c.harness.mdp), expected)
  np.testing.assert_array_equal(ro.absorbing_states(hx.to_sparse(c.harness.mdp)), expected)


@pytest.mark.parametrize("kind", ["dense", "sparse", "harness"])
def test_step_equals_the_transition_table_when_deterministic(kind):
  if kind == "harness":
    mdp = harnesses.compile_harness(tasks.sample_task("click-option", 2), "H5").harness.mdp
    table = np.argmax(np.asarray(mdp.transitions), axis=-1)
  else:
    sparse = _deterministic_case()
    table = np.asarray(sparse.successors[..., 0])
    mdp = sparse if kind == "sparse" else hx.to_dense(sparse)
  s, a = np.meshgrid(np.arange(mdp.num_states), np.arange(mdp.num_actions), indexing="ij")
  nxt, reward, done = ro.step(jax.random.key(4), mdp, s, a)
  np.testing.assert_array_equal(nxt, table)
  np.testing.assert_array_equal(reward, np.asarray(mdp.rewards))
  np.testing.assert_array_equal(done, np.asarray(ro.absorbing_states(mdp))[table])
  # One environment at a time gives the same.
  assert int(ro.step(jax.random.key(5), mdp, 1, 2)[0]) == table[1, 2]


def test_reset_draws_from_the_initial_distribution():
  mdp, _ = _random_case(False)
  mu0 = np.asarray(mdp.initial)
  states = np.asarray(ro.reset(jax.random.key(6), mdp, num_envs=20000))
  counts = np.bincount(states, minlength=mdp.num_states)
  # Pearson goodness of fit, 11 degrees of freedom: 48.87 is its upper 1e-6 tail.
  assert np.sum((counts - 20000 * mu0) ** 2 / (20000 * mu0)) < 48.87
  harness_mdp, _ = _harness_case()
  assert int(ro.reset(jax.random.key(7), harness_mdp)) == 0  # a page starts in its state 0


def test_jit_and_vmap():
  mdp, policy = _random_case(False)
  s = jnp.arange(12)
  a = jnp.zeros(12, jnp.int32)
  key = jax.random.key(8)
  eager = ro.step(key, mdp, s, a)
  jitted = jax.jit(ro.step)(key, mdp, s, a)
  for x, y in zip(eager, jitted):
    np.testing.assert_array_equal(x, y)
  # vmap over single environments, each with its own key.
  keys = jax.random.split(key, 12)
  mapped = jax.vmap(ro.step, in_axes=(0, None, 0, 0))(keys, mdp, s, a)
  assert mapped[0].shape == (12,)
  # vmap over a batch of MDPs, jit around the rollout.
  mdps = hx.stack([mdp, mdp.replace(rewards=2.0 * mdp.rewards)])
  run = jax.jit(jax.vmap(functools.partial(ro.rollout, num_envs=256, num_steps=40),
                         in_axes=(None, 0, None)))
  out = run(jax.random.key(9), mdps, policy)
  assert out.returns.shape == (2, 256)
  # Same key, rewards doubled: the same trajectories with doubled returns.
  np.testing.assert_array_equal(out.states[0], out.states[1])
  np.testing.assert_allclose(out.returns[1], 2.0 * out.returns[0], rtol=1e-5)
  init = jax.vmap(lambda k, m: ro.reset(k, m, num_envs=3))(jax.random.split(key, 2), mdps)
  assert init.shape == (2, 3)


def test_out_of_range_under_jit_propagates_nan():
  mdp, _ = _random_case(True)
  nxt, reward, done = jax.jit(ro.step)(jax.random.key(10), mdp, jnp.array([0, 0, 12]),
                                       jnp.array([1, 4, 0]))
  assert int(nxt[0]) >= 0 and np.isfinite(reward[0]) and not np.isnan(reward[0])
  np.testing.assert_array_equal(nxt[1:], [-1, -1])
  assert np.all(np.isnan(reward[1:])) and np.all(done[1:])


def test_bad_input_raises():
  mdp, policy = _random_case(False)
  key = jax.random.key(11)
  with pytest.raises(ValueError, match=r"action: expected action indices in \[0, 4\), got 4"):
    ro.step(key, mdp, 0, 4)
  with pytest.raises(ValueError, match="action"):
    ro.step(key, mdp, jnp.array([0, 1]), jnp.array([0, -1]))
  with pytest.raises(ValueError, match=r"state: expected state indices in \[0, 12\)"):
    ro.step(key, mdp, 12, 0)
  with pytest.raises(ValueError, match="action: expected integer"):
    ro.step(key, mdp, 0, 1.0)
  with pytest.raises(ValueError, match="action: expected the shape of state"):
    ro.step(key, mdp, jnp.array([0, 1]), jnp.array([0, 1, 2]))
  with pytest.raises(ValueError, match="mdp: expected one MDP"):
    ro.step(key, hx.stack([mdp, mdp]), 0, 0)
  with pytest.raises(ValueError, match="mdp"):
    ro.reset(key, np.ones((3, 2, 3)))
  with pytest.raises(ValueError, match="policy: expected shape"):
    ro.rollout(key, mdp, policy[:, :3], num_envs=4, num_steps=4)
  with pytest.raises(ValueError, match="policy"):
    ro.rollout(key, mdp, 2.0 * policy, num_envs=4, num_steps=4)
  with pytest.raises(ValueError, match="num_envs"):
    ro.rollout(key, mdp, policy, num_envs=0, num_steps=4)
  with pytest.raises(ValueError, match="num_steps"):
    ro.rollout(key, mdp, policy, num_envs=4, num_steps=True)
  with pytest.raises(ValueError, match="num_envs"):
    ro.reset(key, mdp, num_envs=2.5)
