"""harnax.train.fit: optax ascent on an exact return."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import harnax as hx
from harnax import train

pytestmark = pytest.mark.x64

TAU = 0.5


@pytest.fixture(scope="module")
def problem():
  mdp = hx.random_dense_mdp(jax.random.key(0), 6, 3, discount=0.8)
  pi_ref = hx.random_reference(jax.random.key(1), 6, 3, unavailable_fraction=0.2)
  return mdp, pi_ref


def _tabular_return(logits, data):
  mdp, pi_ref = data
  return hx.evaluate_policy(mdp, hx.softmax_policy(logits, pi_ref), pi_ref, TAU).value


def test_converges_to_the_soft_optimum(problem):
  mdp, pi_ref = problem
  out = train.fit(_tabular_return, jnp.zeros((6, 3)), problem, optimizer=optax.adam(0.2),
                  num_steps=600)
  sol = hx.solve_soft_bellman(mdp, pi_ref, TAU, tol=1e-12)
  c = float(hx.ceiling(mdp, pi_ref, TAU, solution=sol))
  # J <= C always (J = C - M); the tabular softmax reaches the optimum.
  assert float(out.final_value) <= c + 1e-12
  assert c - float(out.final_value) < 1e-6
  np.testing.assert_allclose(hx.softmax_policy(out.params, pi_ref), sol.policy, atol=1e-3)
  np.testing.assert_allclose(out.final_value, _tabular_return(out.params, problem), rtol=1e-12)
  assert out.values.shape == (600,)


def test_one_sgd_step_is_an_ascent_step_on_the_exact_gradient(problem):
  mdp, pi_ref = problem
  theta = jax.random.normal(jax.random.key(2), (6, 3))
  lr = 0.3
  out = train.fit(_tabular_return, theta, problem, optimizer=optax.sgd(lr), num_steps=1)
  # The closed form of the softmax policy gradient (policy-gradient theorem).
  g = hx.softmax_policy_gradient(mdp, theta, pi_ref, TAU)
  np.testing.assert_allclose(out.params, theta + lr * g, atol=1e-10)
  np.testing.assert_allclose(out.values[0], _tabular_return(theta, problem), rtol=1e-12)


def test_keep_best_never_ends_below_the_start(problem):
  theta = 3.0 * jax.random.normal(jax.random.key(3), (6, 3))
  start = float(_tabular_return(theta, problem))
  # A step size far too large: plain SGD overshoots, keep_best returns the best seen.
  out = train.fit(_tabular_return, theta, problem, optimizer=optax.sgd(1e3), num_steps=5,
                  keep_best=True)
  assert float(out.final_value) >= start
  assert float(out.final_value) >= float(np.max(out.values)) - 1e-12
  np.testing.assert_allclose(out.final_value, _tabular_return(out.params, problem), rtol=1e-12)


def test_zero_steps_and_bad_options(problem):
  theta = jnp.ones((6, 3))
  out = train.fit(_tabular_return, theta, problem, optimizer=optax.adam(0.1), num_steps=0)
  np.testing.assert_array_equal(out.params, theta)
  assert out.values.shape == (0,)
  with pytest.raises(ValueError, match="num_steps: expected a non-negative int"):
    train.fit(_tabular_return, theta, problem, optimizer=optax.adam(0.1), num_steps=-1)
  with pytest.raises(ValueError, match="optimizer: expected an optax"):
    train.fit(_tabular_return, theta, problem, optimizer="adam", num_steps=1)
  with pytest.raises(ValueError, match="objective: expected a callable"):
    train.fit(None, theta, problem, optimizer=optax.adam(0.1), num_steps=1)


def test_keep_path_records_the_parameters_before_every_step(problem):
  mdp, pi_ref = problem
  theta = jax.random.normal(jax.random.key(4), (6, 3))
  lr = 0.2
  out = train.fit(_tabular_return, theta, problem, optimizer=optax.sgd(lr), num_steps=4,
                  keep_path=True)
  assert out.path.shape == (4, 6, 3)
  # Independent reference: SGD steps on the closed-form softmax policy gradient.
  expected = [np.asarray(theta)]
  for _ in range(4):
    expected.append(expected[-1] + lr * np.asarray(
        hx.softmax_policy_gradient(mdp, jnp.asarray(expected[-1]), pi_ref, TAU)))
  np.testing.assert_allclose(out.path, np.stack(expected[:4]), atol=1e-10)
  np.testing.assert_allclose(out.params, expected[4], atol=1e-10)
  for k in range(4):
    np.testing.assert_allclose(out.values[k], _tabular_return(out.path[k], problem), rtol=1e-12)
  # Without the option: the same run, no path.
  plain = train.fit(_tabular_return, theta, problem, optimizer=optax.sgd(lr), num_steps=4)
  assert plain.path is None
  np.testing.assert_allclose(plain.params, out.params, rtol=1e-12)
  # A pytree of parameters keeps its structure, each leaf stacked on the step axis.
  tree = train.fit(lambda p, d: _tabular_return(p["w"], d), {"w": theta}, problem,
                   optimizer=optax.sgd(lr), num_steps=3, keep_path=True, keep_best=True)
  assert tree.path["w"].shape == (3, 6, 3)
  np.testing.assert_allclose(tree.path["w"], np.stack(expected[:3]), atol=1e-10)
