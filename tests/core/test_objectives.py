"""Ceiling, mismatch and the identity J = C - M."""

import jax
import numpy as np
import pytest

import harnax as hx
from tests.core import reference as ref


def _dense(p):
  return hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("gamma,unavailable", [(0.5, 0.0), (0.9, 0.3), (0.99, 0.2)])
def test_performance_identity_j_equals_c_minus_m(kind, gamma, unavailable):
  p = ref.random_problem(np.random.default_rng(int(gamma * 100)), 20, 4, unavailable=unavailable,
                         gamma=gamma, sparse_k=None if kind == "dense" else 3)
  tau = 0.4
  mdp = _dense(p) if kind == "dense" else hx.to_sparse(_dense(p))
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, tol=1e-12)
  c = hx.ceiling(mdp, p["pi_ref"], tau, solution=sol)
  m = hx.mismatch(mdp, p["policy"], p["pi_ref"], tau, solution=sol)
  j = hx.regularized_return(mdp, p["policy"], p["pi_ref"], tau)
  scale = 1.0 / (1 - gamma)
  assert abs(float(j) - (float(c) - float(m))) < 1e-11 * scale
  # ... and against the independent reference, term by term.
  v_star, _, pi_star = ref.soft_optimum(p["P"], p["r"], gamma, p["pi_ref"], tau)
  d = ref.occupancy(p["P"], gamma, p["mu0"], p["policy"])
  m_ref = tau / (1 - gamma) * d @ ref.kl_rows(p["policy"], pi_star)
  np.testing.assert_allclose(c, p["mu0"] @ v_star, atol=1e-9)
  np.testing.assert_allclose(m, m_ref, atol=1e-9)


def test_identity_in_float32_holds_to_float_precision():
  with jax.enable_x64(False):
    mdp = hx.random_dense_mdp(jax.random.key(0), 32, 4, discount=0.9)
    pi_ref = hx.random_reference(jax.random.key(1), 32, 4, unavailable_fraction=0.25)
    pol = hx.random_policy(jax.random.key(2), pi_ref)
    c = hx.ceiling(mdp, pi_ref, 0.5)
    m = hx.mismatch(mdp, pol, pi_ref, 0.5)
    j = hx.regularized_return(mdp, pol, pi_ref, 0.5)
    assert abs(float(j) - float(c - m)) < 20 * np.finfo(np.float32).eps * abs(float(c))


def test_mismatch_is_zero_at_the_optimum_and_positive_elsewhere():
  p = ref.random_problem(np.random.default_rng(4), 12, 3, unavailable=0.2)
  mdp = _dense(p)
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], 0.5, tol=1e-12)
  assert abs(float(hx.mismatch(mdp, sol.policy, p["pi_ref"], 0.5, solution=sol))) < 1e-12
  assert float(hx.mismatch(mdp, p["policy"], p["pi_ref"], 0.5, solution=sol)) > 1e-3
  per_state = hx.mismatch_per_state(mdp, p["policy"], p["pi_ref"], 0.5, solution=sol)
  assert per_state.shape == (12,) and np.all(np.asarray(per_state) >= 0)


def test_centered_scores_equal_the_centred_log_optimum():
  p = ref.random_problem(np.random.default_rng(5), 6, 4, unavailable=0.3)
  mdp = _dense(p)
  tau = 0.5
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, tol=1e-12)
  avail = p["pi_ref"] > 0
  cs = np.asarray(hx.centered_scores(sol.scores, p["pi_ref"]))
  assert np.all(cs[~avail] == 0)
  # pi* = softmax(F*/tau), so tau log pi* is F* up to a per-state constant: centred
  # over the available actions (in NumPy, from the reference optimum) they agree.
  _, _, pi_star = ref.soft_optimum(p["P"], p["r"], p["gamma"], p["pi_ref"], tau)
  x = np.where(avail, tau * np.log(np.where(avail, pi_star, 1.0)), 0.0)
  want = np.where(avail, x - x.sum(-1, keepdims=True) / avail.sum(-1, keepdims=True), 0.0)
  np.testing.assert_allclose(cs, want, atol=1e-9)
