"""Property tests (hypothesis) over random MDPs, references and policies."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np

import harnax as hx
from tests.core import reference as ref

PROFILE = settings(max_examples=25, deadline=None, derandomize=True)

problems = st.builds(
    lambda seed, s, a, unavail, gamma, tau: (
        ref.random_problem(np.random.default_rng(seed), s, a, unavailable=unavail, gamma=gamma),
        tau),
    seed=st.integers(0, 2**31 - 1),
    s=st.sampled_from([2, 5, 9]),
    a=st.sampled_from([2, 4]),
    unavail=st.sampled_from([0.0, 0.5]),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.97]),
    tau=st.sampled_from([0.05, 0.5, 3.0]),
)


def _mdp(p):
  return hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])


@PROFILE
@given(problems)
def test_identity_holds_for_random_policies(case):
  p, tau = case
  mdp = _mdp(p)
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, tol=1e-12)
  c = float(hx.ceiling(mdp, p["pi_ref"], tau, solution=sol))
  m = float(hx.mismatch(mdp, p["policy"], p["pi_ref"], tau, solution=sol))
  j = float(hx.regularized_return(mdp, p["policy"], p["pi_ref"], tau))
  scale = (1 + np.abs(p["r"]).max() + tau * 10) / (1 - p["gamma"])
  assert abs(j - (c - m)) <= 1e-9 * scale
  assert m >= -1e-10 * scale


@PROFILE
@given(problems)
def test_occupancy_is_a_distribution(case):
  p, _ = case
  d = np.asarray(hx.occupancy(_mdp(p), p["policy"]))
  assert np.all(d >= -1e-13)
  assert abs(d.sum() - 1) < 1e-10


@PROFILE
@given(problems)
def test_return_never_exceeds_ceiling(case):
  p, tau = case
  mdp = _mdp(p)
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, tol=1e-12)
  c = float(hx.ceiling(mdp, p["pi_ref"], tau, solution=sol))
  j = float(hx.regularized_return(mdp, p["policy"], p["pi_ref"], tau))
  j_star = float(hx.regularized_return(mdp, sol.policy, p["pi_ref"], tau))
  scale = 1 / (1 - p["gamma"])
  assert j <= c + 1e-10 * scale
  assert abs(j_star - c) <= 1e-9 * scale * (1 + np.abs(p["r"]).max())


@PROFILE
@given(problems)
def test_solvers_agree(case):
  p, tau = case
  mdp = _mdp(p)
  vs = [np.asarray(hx.solve_soft_bellman(mdp, p["pi_ref"], tau, method=m, tol=1e-10).v)
        for m in ("value_iteration", "anderson", "policy_iteration")]
  np.testing.assert_allclose(vs[0], vs[1], atol=3e-10)
  np.testing.assert_allclose(vs[0], vs[2], atol=3e-10)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(problems)
def test_small_temperature_approaches_hard_value_iteration(case):
  p, _ = case
  mdp = _mdp(p)
  uniform = np.full(p["pi_ref"].shape, 1.0 / p["pi_ref"].shape[1])
  v_hard = ref.hard_optimum(p["P"], p["r"], p["gamma"], uniform)
  tau = 1e-3
  v = np.asarray(hx.solve_soft_bellman(mdp, uniform, tau, tol=1e-11).v)
  slack = tau * np.log(uniform.shape[1]) / (1 - p["gamma"])
  assert np.all(v <= v_hard + 1e-9) and np.all(v >= v_hard - slack - 1e-9)
