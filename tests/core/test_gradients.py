"""Exact policy gradients: autodiff, the policy-gradient theorem, finite differences."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from tests.core import reference as ref


@pytest.fixture(scope="module", params=["dense", "sparse"])
def problem(request):
  p = ref.random_problem(np.random.default_rng(21), 10, 3, unavailable=0.25, gamma=0.9,
                         sparse_k=None if request.param == "dense" else 2)
  mdp = hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=0.9, initial=p["mu0"])
  if request.param == "sparse":
    mdp = hx.to_sparse(mdp)
  logits = np.random.default_rng(22).normal(size=(10, 3))
  return mdp, p, logits


def _tabular(pi_ref):
  return lambda theta: hx.softmax_policy(theta, pi_ref)


def test_autodiff_matches_policy_gradient_theorem(problem):
  mdp, p, logits = problem
  with jax.enable_x64(True):
    j_auto, g_auto = hx.policy_gradient(mdp, logits, _tabular(p["pi_ref"]), p["pi_ref"], 0.3)
    j_thm, g_thm = hx.analytic_policy_gradient(mdp, logits, _tabular(p["pi_ref"]), p["pi_ref"],
                                               0.3)
  np.testing.assert_allclose(g_auto, g_thm, atol=1e-9)
  # Both return the exact return J(pi) first.
  pol = np.where(p["pi_ref"] > 0, np.exp(logits), 0.0)
  pol /= pol.sum(-1, keepdims=True)
  v, _ = ref.evaluate(p["P"], p["r"], 0.9, pol, p["pi_ref"], 0.3)
  want = float(p["mu0"] @ v)
  np.testing.assert_allclose([float(j_auto), float(j_thm)], [want, want], rtol=1e-10)


def test_softmax_closed_form_matches_autodiff(problem):
  mdp, p, logits = problem
  _, g_auto = hx.policy_gradient(mdp, logits, _tabular(p["pi_ref"]), p["pi_ref"], 0.3)
  g_closed = hx.softmax_policy_gradient(mdp, logits, p["pi_ref"], 0.3)
  np.testing.assert_allclose(g_auto, g_closed, atol=1e-9)
  assert np.all(np.asarray(g_closed)[p["pi_ref"] == 0] == 0)


def test_gradient_matches_central_finite_differences(problem):
  mdp, p, logits = problem
  tau = 0.3

  def j_of(theta):
    pol = hx.softmax_policy(theta, p["pi_ref"])
    return float(hx.regularized_return(mdp, pol, p["pi_ref"], tau))

  _, g = hx.policy_gradient(mdp, logits, _tabular(p["pi_ref"]), p["pi_ref"], tau)
  eps = 1e-6
  fd = np.zeros_like(logits)
  for idx in zip(*np.nonzero(p["pi_ref"] > 0)):
    e = np.zeros_like(logits)
    e[idx] = eps
    fd[idx] = (j_of(logits + e) - j_of(logits - e)) / (2 * eps)
  np.testing.assert_allclose(g, fd, atol=1e-7)


def test_neural_policy_map(problem):
  """A differentiable non-tabular map theta -> policy (linear features + softmax)."""
  mdp, p, _ = problem
  feats = jnp.asarray(np.random.default_rng(3).normal(size=(10, 3, 5)))
  w = jnp.asarray(np.random.default_rng(4).normal(size=(5,)))

  def policy_fn(params):
    return hx.softmax_policy(feats @ params["w"] + params["b"], p["pi_ref"])

  params = {"w": w, "b": jnp.zeros(3)}
  _, g_auto = hx.policy_gradient(mdp, params, policy_fn, p["pi_ref"], 0.3)
  _, g_thm = hx.analytic_policy_gradient(mdp, params, policy_fn, p["pi_ref"], 0.3)
  chex.assert_trees_all_equal_shapes(g_thm, params)
  chex.assert_trees_all_close(g_auto, g_thm, atol=1e-9)


def test_gradient_of_mismatch_is_minus_gradient_of_return(problem):
  mdp, p, logits = problem
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], 0.3, tol=1e-12)

  def m_of(theta):
    pol = hx.softmax_policy(theta, p["pi_ref"])
    return hx.mismatch(mdp, pol, p["pi_ref"], 0.3, solution=sol)

  _, g_j = hx.policy_gradient(mdp, logits, _tabular(p["pi_ref"]), p["pi_ref"], 0.3)
  np.testing.assert_allclose(jax.grad(m_of)(logits), -np.asarray(g_j), atol=1e-8)


def test_gradient_ascent_reaches_the_ceiling():
  mdp = hx.random_dense_mdp(jax.random.key(0), 8, 3, discount=0.8)
  pi_ref = hx.uniform_reference(8, 3)
  tau = 0.5
  c = float(hx.ceiling(mdp, pi_ref, tau, tol=1e-12))
  theta = jnp.zeros((8, 3))
  step = jax.jit(lambda th: hx.policy_gradient(mdp, th, _tabular(pi_ref), pi_ref, tau))
  for _ in range(300):
    j, g = step(theta)
    theta = theta + 2.0 * g
  assert c - float(j) < 1e-6
