"""Swap analysis: ceilings, threshold T, frozen and adapted returns; J = C - M across harnesses."""

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from harnax.policies import log_linear
from tests.harness import reference as ref

TOL = 1e-12  # solver tolerance: float64 references agree to ~1e-10


def _harness(p, name):
  mdp = hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])
  return hh.TabularHarness(mdp=mdp, pi_ref=p["pi_ref"], decode_table=p["table"], name=name)


def _policy(rng, pi_ref, sharp=1.0):
  z = np.where(pi_ref > 0, rng.normal(scale=sharp, size=pi_ref.shape), -np.inf)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _pair_problem(seed):
  rng = np.random.default_rng(seed)
  # The checkbox family's shapes (S = 9, A = 5 and 8), so solver compiles are shared.
  src = ref.random_harness_arrays(rng, 9, 5, 4, unavailable=0.2)
  tgt = ref.random_harness_arrays(rng, 9, 8, 5, unavailable=0.2)
  tgt["mu0"] = src["mu0"]  # the same environment start
  return src, tgt, _policy(rng, src["pi_ref"]), _policy(rng, tgt["pi_ref"]), _policy(
      rng, tgt["pi_ref"], sharp=3.0)


def _reference_c_m_j(p, policy, tau):
  v_star, _, pi_star = ref.soft_optimum(p["P"], p["r"], p["gamma"], p["pi_ref"], tau)
  v, _ = ref.evaluate(p["P"], p["r"], p["gamma"], policy, p["pi_ref"], tau)
  d = ref.occupancy(p["P"], p["gamma"], p["mu0"], policy)
  m = tau / (1 - p["gamma"]) * d @ ref.kl_rows(policy, pi_star)
  return p["mu0"] @ v_star, m, p["mu0"] @ v


def test_swap_pair_matches_reference_and_the_identity():
  src, tgt, pi, frozen, adapted = _pair_problem(0)
  tau = 0.3
  pair = hh.swap_pair(_harness(src, "H"), _harness(tgt, "H'"), pi, frozen, adapted, tau=tau,
                      tol=TOL)
  c_h, m_h, j_h = _reference_c_m_j(src, pi, tau)
  c_t, m_f, j_f = _reference_c_m_j(tgt, frozen, tau)
  _, m_a, j_a = _reference_c_m_j(tgt, adapted, tau)
  want = dict(source_ceiling=c_h, target_ceiling=c_t, delta_ceiling=c_t - c_h, source_return=j_h,
              source_mismatch=m_h, threshold=c_t - c_h + m_h, frozen_return=j_f,
              frozen_mismatch=m_f, frozen_change=j_f - j_h, adapted_return=j_a,
              adapted_mismatch=m_a, realized_gain=j_a - j_h)
  for name, value in want.items():
    np.testing.assert_allclose(getattr(pair, name), value, atol=1e-9, err_msg=name)
  # J_H'(pi') - J_H(pi) = T - M_H'(pi'), for the frozen and the adapted policy alike.
  np.testing.assert_allclose(pair.realized_gain, pair.threshold - pair.adapted_mismatch,
                             atol=1e-10)
  np.testing.assert_allclose(pair.frozen_change, pair.threshold - pair.frozen_mismatch,
                             atol=1e-10)
  np.testing.assert_allclose(hh.swap_threshold(c_h, c_t, m_h), pair.threshold, atol=1e-9)


@hypothesis.settings(deadline=None, max_examples=15)
@hypothesis.given(seed=st.integers(0, 2**31 - 1), tau=st.floats(0.05, 2.0))
def test_adapted_beats_the_original_pair_iff_its_mismatch_is_below_t(seed, tau):
  src, tgt, pi, frozen, adapted = _pair_problem(seed)
  pair = hh.swap_pair(_harness(src, "H"), _harness(tgt, "H'"), pi, frozen, adapted, tau=tau,
                      tol=TOL)
  gain, t, m = float(pair.realized_gain), float(pair.threshold), float(pair.adapted_mismatch)
  assert abs(gain - (t - m)) < 1e-10 * max(1.0, abs(t), abs(m))
  if abs(gain) > 1e-9:  # away from the tie the two comparisons agree exactly
    assert (gain > 0) == (m < t)


def test_swap_pair_under_jit():
  src, tgt, pi, frozen, adapted = _pair_problem(1)
  hs, ht = _harness(src, "H"), _harness(tgt, "H'")
  eager = hh.swap_pair(hs, ht, pi, frozen, adapted, tau=0.5, tol=TOL)
  jitted = jax.jit(lambda a, b, x, y, z: hh.swap_pair(a, b, x, y, z, tau=0.5, tol=TOL))(
      hs, ht, pi, frozen, adapted)
  for x, y in zip(eager, jitted):
    np.testing.assert_allclose(x, y, atol=1e-10)
  missing = hh.swap_pair(hs, ht, pi, frozen, None, 0.5)
  assert np.isnan(float(missing.realized_gain)) and np.isnan(float(missing.adapted_mismatch))


@pytest.fixture(scope="module")
def checkbox_swaps(checkbox_models):
  m = checkbox_models
  names = list(m["harnesses"])
  h, f = m["harnesses"], m["features"]

  def read(theta, j):
    return log_linear.harness_semantic_policy(theta, f[j], h[j])

  policies = [read(m["theta"][i], i) for i in names]
  frozen = [[read(m["theta"][i], j) for j in names] for i in names]
  adapted = [[None if i == j else read(m["adapted"][i, j], j) for j in names] for i in names]
  return names, hh.swap_analysis([h[k] for k in names], policies, frozen, adapted,
                                 tau=m["tau"], tol=TOL)


def test_checkbox_swap_analysis(checkbox_swaps):
  names, res = checkbox_swaps
  assert names == ["H0", "H1", "H2"]
  p = res.pairs
  assert p.delta_ceiling.shape == (3, 3)
  np.testing.assert_array_equal(np.diag(p.delta_ceiling), 0.0)
  np.testing.assert_array_equal(np.diag(p.frozen_change), 0.0)
  np.testing.assert_allclose(np.diag(p.threshold), np.diag(p.source_mismatch))
  # H2 only reorders fields: the same MDP, the same ceiling, exactly.
  assert float(p.delta_ceiling[0, 2]) == 0.0 and float(p.delta_ceiling[2, 0]) == 0.0
  assert float(p.delta_ceiling[0, 1]) > 0  # batch clicks raise the ceiling
  # ... while the frozen H0 model loses return when its fields are reversed.
  assert float(p.frozen_change[0, 2]) < 0
  # The identity on every pair, frozen and adapted.
  off = ~np.eye(3, dtype=bool)
  np.testing.assert_allclose(p.realized_gain[off], (p.threshold - p.adapted_mismatch)[off],
                             atol=1e-10)
  np.testing.assert_allclose(p.frozen_change, p.threshold - p.frozen_mismatch, atol=1e-10)
  np.testing.assert_array_equal(res.adapted_wins[off], res.predicted_win[off])
  np.testing.assert_array_equal(res.rejected_but_positive,
                                (np.asarray(p.frozen_change) < 0) & (np.asarray(p.threshold) > 0))
  assert res.rejected_but_positive.any()


def test_swap_table_renders_every_off_diagonal_pair(checkbox_swaps):
  names, res = checkbox_swaps
  table = hh.swap_table(res, names)
  lines = table.splitlines()
  assert lines[0].startswith("| swap | ΔC |") and len(lines) == 2 + 6
  assert any(line.startswith("| H0 → H2 | +0.000 |") for line in lines)
  with pytest.raises(ValueError, match="names: expected 3 names"):
    hh.swap_table(res, names[:2])


def test_swap_analysis_without_adaptation_and_bad_input():
  src, tgt, pi, frozen, _ = _pair_problem(2)
  hs = _harness(src, "H")
  ht = _harness(dict(tgt, P=tgt["P"]), "H'")
  pi_t = _policy(np.random.default_rng(3), tgt["pi_ref"])
  res = hh.swap_analysis([hs, ht], [pi, pi_t], [[None, frozen], [pi, None]], None, 0.5)
  assert np.isnan(np.asarray(res.pairs.realized_gain)).all()
  assert not np.asarray(res.adapted_wins).any()
  assert "—" in hh.swap_table(res, ["H", "H'"])
  with pytest.raises(ValueError, match="policies: expected 2 entries"):
    hh.swap_analysis([hs, ht], [pi], [[None, frozen], [pi, None]], None, 0.5)
  with pytest.raises(ValueError, match=r"frozen\[1\]: expected 2 entries"):
    hh.swap_analysis([hs, ht], [pi, pi_t], [[None, frozen], [pi]], None, 0.5)
  with pytest.raises(ValueError, match=r"frozen\[0\]\[1\]: expected the policy"):
    hh.swap_analysis([hs, ht], [pi, pi_t], [[None, None], [pi, None]], None, 0.5)
  with pytest.raises(ValueError, match="adapted: expected a 2 x 2"):
    hh.swap_analysis([hs, ht], [pi, pi_t], [[None, frozen], [pi, None]], [[None]], tau=0.5)
  with pytest.raises(ValueError, match="policy"):  # a source policy in the target's shape
    hh.swap_pair(hs, ht, frozen, frozen, None, 0.5)


def test_checkbox_swaps_show_the_documented_pattern(checkbox_swaps):
  """The pattern of the table in docs/harness.md §6."""
  _, res = checkbox_swaps
  p = res.pairs
  np.testing.assert_allclose(p.delta_ceiling[0, 1], 0.5636 - 0.4903, atol=2e-4)
  # H0 -> H2 reorders the fields only: no target shift, yet the frozen model loses return
  # (readout drift), while the ceiling stays put.
  assert float(p.frozen_change[0, 2]) < -0.1
  np.testing.assert_allclose(p.delta_ceiling[0, 2], 0.0, atol=1e-12)
  np.testing.assert_array_equal(res.rejected_but_positive,
                                [[False, False, True], [True, False, True], [True, True, False]])
  # Ceiling-raising swaps win after adaptation; ceiling-lowering ones do not.
  assert bool(res.adapted_wins[0, 1]) and bool(res.adapted_wins[2, 1])
  assert not bool(res.adapted_wins[1, 0]) and not bool(res.adapted_wins[1, 2])
