"""Exact policy evaluation and occupancy against float64 references and the literature."""

import numpy as np
import pytest

import harnax as hx
from tests.core import reference as ref


def _mdps(p):
  dense = hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])
  succ, probs = ref.sparse_arrays(p["P"])
  sparse = hx.SparseTabularMDP(successors=succ, probabilities=probs, rewards=p["r"],
                               discount=p["gamma"], initial=p["mu0"])
  return dense, sparse


@pytest.mark.parametrize("s,a,unavailable,gamma,k", [(3, 2, 0.0, 0.5, None), (15, 4, 0.3, 0.9, 3),
                                                     (40, 3, 0.2, 0.99, 2)])
def test_evaluation_and_occupancy_match_reference(s, a, unavailable, gamma, k):
  p = ref.random_problem(np.random.default_rng(s), s, a, unavailable=unavailable, gamma=gamma,
                         sparse_k=k)
  tau = 0.3
  v, q = ref.evaluate(p["P"], p["r"], gamma, p["policy"], p["pi_ref"], tau)
  d = ref.occupancy(p["P"], gamma, p["mu0"], p["policy"])
  for mdp in _mdps(p):
    ev = hx.evaluate_policy(mdp, p["policy"], p["pi_ref"], tau)
    np.testing.assert_allclose(ev.v, v, atol=1e-9, rtol=0)
    np.testing.assert_allclose(ev.q, q, atol=1e-9, rtol=0)
    np.testing.assert_allclose(ev.value, p["mu0"] @ v, atol=1e-9)
    occ = hx.occupancy(mdp, p["policy"])
    np.testing.assert_allclose(occ, d, atol=1e-10)
    assert float(np.sum(occ)) == pytest.approx(1.0, abs=1e-10)


# Sutton & Barto (2018), Figure 3.2 (Example 3.5): the equiprobable random policy, gamma = 0.9.
GRIDWORLD_VALUES = np.array([
    [3.3, 8.8, 4.4, 5.3, 1.5],
    [1.5, 3.0, 2.3, 1.9, 0.5],
    [0.1, 0.7, 0.7, 0.4, -0.4],
    [-1.0, -0.4, -0.4, -0.6, -1.2],
    [-1.9, -1.3, -1.2, -1.4, -2.0],
])


@pytest.mark.parametrize("dense", [False, True])
def test_gridworld_golden_values(dense):
  mdp = hx.gridworld_5x5(discount=0.9)
  if dense:
    mdp = hx.to_dense(mdp)
  uniform = np.full((25, 4), 0.25)
  # With pi = pi_ref the KL term vanishes for any tau: the classical value.
  ev = hx.evaluate_policy(mdp, uniform, uniform, 1.0)
  np.testing.assert_allclose(np.asarray(ev.v).reshape(5, 5), GRIDWORLD_VALUES, atol=0.05 + 1e-9)
  # The published table is rounded to one decimal; ours must round to it.
  np.testing.assert_array_equal(np.round(np.asarray(ev.v).reshape(5, 5), 1), GRIDWORLD_VALUES)


def test_sparse_evaluation_on_a_long_deterministic_cycle():
  # A single 500-state cycle with a near-deterministic policy: Krylov methods
  # stall here; the certified iteration must not.
  n = 500
  succ = np.stack([(np.arange(n) + 1) % n, np.arange(n)], axis=1)
  r = np.random.default_rng(0).normal(size=(n, 2))
  mdp = hx.SparseTabularMDP(successors=succ, rewards=r, discount=0.99, initial=np.ones(n) / n)
  pol = np.tile([[0.999, 0.001]], (n, 1))
  pi_ref = np.full((n, 2), 0.5)
  v, _ = ref.evaluate(np.asarray(hx.to_dense(mdp).transitions), r, 0.99, pol, pi_ref, 0.2)
  np.testing.assert_allclose(hx.evaluate_policy(mdp, pol, pi_ref, 0.2).v, v, atol=1e-8)
  d = ref.occupancy(np.asarray(hx.to_dense(mdp).transitions), 0.99, np.ones(n) / n, pol)
  np.testing.assert_allclose(hx.occupancy(mdp, pol), d, atol=1e-9)


def test_policy_with_mass_on_unavailable_action_is_rejected():
  p = ref.random_problem(np.random.default_rng(1), 4, 3, unavailable=0.5)
  dense, _ = _mdps(p)
  bad = np.full((4, 3), 1 / 3)
  s, a = np.argwhere(p["pi_ref"] == 0)[0]
  with pytest.raises(ValueError, match=f"policy: puts mass .* on action {a} in state {s}"):
    hx.evaluate_policy(dense, bad, p["pi_ref"], 1.0)


def test_bad_policy_shapes_and_values():
  p = ref.random_problem(np.random.default_rng(2), 4, 3)
  dense, _ = _mdps(p)
  with pytest.raises(ValueError, match=r"policy: expected shape \[4, 3\]"):
    hx.evaluate_policy(dense, np.full((4, 2), 0.5), p["pi_ref"], 1.0)
  with pytest.raises(ValueError, match="policy: expected probabilities summing to 1"):
    hx.occupancy(dense, np.full((4, 3), 0.5))
  with pytest.raises(ValueError, match="policy: expected finite"):
    hx.evaluate_policy(dense, np.full((4, 3), np.nan), p["pi_ref"], 1.0)
  with pytest.raises(ValueError, match="mdp: expected a TabularMDP"):
    hx.evaluate_policy(p["P"], p["policy"], p["pi_ref"], 1.0)
