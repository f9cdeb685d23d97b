"""Readout scores, action maps and the exact transfer-error decomposition."""

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from harnax import policies
from harnax.envs import checkbox
from tests.harness import reference as ref


def _log(p):
  with np.errstate(divide="ignore"):
    return np.log(p)


def test_readout_scores_match_the_reference():
  rng = np.random.default_rng(0)
  p = ref.random_harness_arrays(rng, 6, 4, 5, unavailable=0.3)
  pol = np.where(p["pi_ref"] > 0, rng.uniform(0.1, 1, size=(6, 4)), 0.0)
  pol /= pol.sum(-1, keepdims=True)
  tau = 0.3
  want = ref.centered(tau * _log(pol), p["pi_ref"] > 0)
  np.testing.assert_allclose(hh.readout_scores(_log(pol), p["pi_ref"], tau), want, atol=1e-14)
  # A per-state constant in the log-policy (unnormalized log-probabilities) cancels.
  shifted = _log(pol) + rng.normal(size=(6, 1))
  np.testing.assert_allclose(hh.readout_scores(shifted, p["pi_ref"], tau), want, atol=1e-12)


def test_score_error_vanishes_exactly_at_the_optimum_only():
  rng = np.random.default_rng(1)
  p = ref.random_harness_arrays(rng, 8, 3, 4, unavailable=0.3)
  mdp = hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])
  tau = 0.5
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, tol=1e-12)
  _, scores, pi_star = ref.soft_optimum(p["P"], p["r"], p["gamma"], p["pi_ref"], tau)
  np.testing.assert_allclose(hh.score_error(_log(pi_star), scores, p["pi_ref"], tau), 0,
                             atol=1e-10)
  err = np.asarray(hh.score_error(_log(p["pi_ref"]), sol.scores, p["pi_ref"], tau))
  with np.errstate(invalid="ignore"):
    want = ref.centered(tau * _log(p["pi_ref"]) - scores, p["pi_ref"] > 0)
  np.testing.assert_allclose(err, want, atol=1e-10)
  assert np.abs(err).max() > 1e-3


def _random_pair(rng, s, a, a2):
  """Source/target pi_ref, scores and log-policies, and an action map with gaps."""
  def ref_policy(n):
    avail = rng.uniform(size=(s, n)) > 0.2
    avail[:, 0] = True
    return avail / avail.sum(-1, keepdims=True)

  src_ref, tgt_ref = ref_policy(a), ref_policy(a2)
  # Action 0 (always available) is common everywhere; others map injectively or not at all.
  amap = np.full(a2, -1, np.int32)
  amap[0] = 0
  others = rng.permutation(np.arange(1, a))
  for k in range(1, min(a, a2)):
    if rng.uniform() < 0.8:
      amap[k] = others[k - 1]
  with np.errstate(invalid="ignore"):
    f_src = np.where(src_ref > 0, rng.normal(size=(s, a)), -np.inf)
    f_tgt = np.where(tgt_ref > 0, rng.normal(size=(s, a2)), -np.inf)

  def log_policy(mask):
    z = np.where(mask, rng.normal(scale=2, size=mask.shape), -np.inf)
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)

  return dict(src_ref=src_ref, tgt_ref=tgt_ref, amap=amap, f_src=f_src, f_tgt=f_tgt,
              l_src=log_policy(src_ref > 0), l_tgt=log_policy(tgt_ref > 0))


@hypothesis.settings(deadline=None, max_examples=30)
@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  shape=st.sampled_from([(4, 3, 3), (6, 3, 5), (5, 4, 2)]),
                  tau=st.floats(0.01, 10.0))
def test_decomposition_is_exact_and_matches_reference(seed, shape, tau):
  s, a, a2 = shape
  q = _random_pair(np.random.default_rng(seed), s, a, a2)
  dec = hh.transfer_decomposition(
      source_scores=q["f_src"], target_scores=q["f_tgt"], source_log_policy=q["l_src"],
      target_log_policy=q["l_tgt"], source_pi_ref=q["src_ref"], target_pi_ref=q["tgt_ref"],
      action_map=q["amap"], tau=tau)
  # Reference, written out per entry on the common set.
  m = q["amap"]
  common = np.zeros((s, a2), bool)
  for st_ in range(s):
    for k in range(a2):
      common[st_, k] = m[k] >= 0 and q["tgt_ref"][st_, k] > 0 and q["src_ref"][st_, m[k]] > 0
  np.testing.assert_array_equal(dec.common, common)
  idx = np.where(m >= 0, m, 0)
  with np.errstate(invalid="ignore"):
    parts = dict(
        error=tau * q["l_tgt"] - q["f_tgt"],
        target_shift=q["f_src"][:, idx] - q["f_tgt"],
        learning_residual=tau * q["l_src"][:, idx] - q["f_src"][:, idx],
        readout_drift=tau * q["l_tgt"] - tau * q["l_src"][:, idx])
  scale = max(1.0, tau) * 10
  for name, x in parts.items():
    np.testing.assert_allclose(getattr(dec, name), ref.centered(np.where(common, x, 0), common),
                               atol=1e-12 * scale, err_msg=name)
  total = dec.target_shift + dec.learning_residual + dec.readout_drift
  np.testing.assert_allclose(total, dec.error, rtol=0, atol=8 * np.finfo(np.float64).eps * scale)
  np.testing.assert_allclose(np.where(common, 0, np.asarray(dec.error)), 0)  # 0 off the set


def test_decomposition_under_jit_and_vmap():
  qs = [_random_pair(np.random.default_rng(i), 4, 3, 3) for i in range(3)]
  qs = [dict(q, amap=qs[0]["amap"]) for q in qs]

  def run(f_src, f_tgt, l_src, l_tgt, src_ref, tgt_ref):
    return hh.transfer_decomposition(source_scores=f_src, target_scores=f_tgt,
                                     source_log_policy=l_src, target_log_policy=l_tgt,
                                     source_pi_ref=src_ref, target_pi_ref=tgt_ref,
                                     action_map=qs[0]["amap"], tau=0.7)

  keys = ("f_src", "f_tgt", "l_src", "l_tgt", "src_ref", "tgt_ref")
  stacked = [np.stack([q[k] for q in qs]) for k in keys]
  batched = jax.jit(jax.vmap(run))(*stacked)
  for i, q in enumerate(qs):
    one = run(*(q[k] for k in keys))
    for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(batched)):
      np.testing.assert_allclose(x, y[i], atol=1e-13)


def _decompose(models, source, target, action_map=None):
  h, f, th = models["harnesses"], models["features"], models["theta"]
  l_src = hh.semantic_log_policy(h[source], policies.output_log_probs(th[source], f[source]),
                                 invalid="noop")
  l_tgt = hh.semantic_log_policy(h[target], policies.output_log_probs(th[source], f[target]),
                                 invalid="noop")
  return hh.harness_transfer_decomposition(h[source], h[target], l_src, l_tgt,
                                           tau=models["tau"], action_map=action_map,
                                           tol=1e-12), l_src, l_tgt


def test_representation_only_change_has_exactly_zero_target_shift(checkbox_models):
  """Reversing the observation fields (H0 -> H2): the target does not move at all."""
  dec, l_src, l_tgt = _decompose(checkbox_models, "H0", "H2")
  assert np.all(np.asarray(dec.target_shift) == 0.0)
  np.testing.assert_allclose(dec.learning_residual + dec.readout_drift, dec.error, atol=1e-14)
  norms = hh.decomposition_norms(dec)
  assert float(norms.target_shift) == 0.0
  assert float(norms.readout_drift) > 0.1  # the same weights read the flipped text differently
  assert float(norms.error) > float(norms.learning_residual)
  h = checkbox_models["harnesses"]
  flips = np.asarray(hh.decision_flips(l_src, l_tgt, hh.identity_action_map(5), h["H0"].pi_ref,
                                       h["H2"].pi_ref))
  assert flips.any()


def test_execution_change_moves_the_target(checkbox_models):
  """The batch harness (H0 -> H1): a new action, and F* moves on the common ones."""
  h = checkbox_models["harnesses"]
  batch = [n for n in h["H1"].action_names if "+" in n]
  amap = hh.match_actions(h["H0"], h["H1"], only_in_target=batch)
  np.testing.assert_array_equal(amap, [0, 1, 2, 3, 4, -1, -1, -1])
  dec, _, _ = _decompose(checkbox_models, "H0", "H1", amap)
  assert not np.asarray(dec.common)[:, 5:].any()
  total = dec.target_shift + dec.learning_residual + dec.readout_drift
  np.testing.assert_allclose(total, dec.error, atol=1e-14)
  assert float(hh.decomposition_norms(dec).target_shift) > 1e-3
  # F* itself against the NumPy reference.
  tau = checkbox_models["tau"]
  for name in ("H0", "H1"):
    mdp = h[name].mdp
    _, scores, _ = ref.soft_optimum(np.asarray(mdp.transitions), np.asarray(mdp.rewards),
                                    float(mdp.discount), np.asarray(h[name].pi_ref), tau)
    sol = hx.solve_soft_bellman(mdp, h[name].pi_ref, tau, tol=1e-12)
    np.testing.assert_allclose(sol.scores, scores, atol=1e-9)


def test_decomposition_norms_weights():
  q = _random_pair(np.random.default_rng(3), 4, 3, 3)
  dec = hh.transfer_decomposition(
      source_scores=q["f_src"], target_scores=q["f_tgt"], source_log_policy=q["l_src"],
      target_log_policy=q["l_tgt"], source_pi_ref=q["src_ref"], target_pi_ref=q["tgt_ref"],
      action_map=q["amap"], tau=1.0)
  w = np.array([0.1, 0.2, 0.3, 0.4])
  c = np.asarray(dec.common)
  x = np.asarray(dec.readout_drift)
  want = np.sqrt(sum(w[i] * np.mean(x[i][c[i]] ** 2) for i in range(4)))
  np.testing.assert_allclose(hh.decomposition_norms(dec, weights=w).readout_drift, want)


# --- action maps and bad input ----------------------------------------------------

def test_match_actions_by_name_renames_and_explicit_gaps():
  src, tgt = ("a", "b", "c"), ("b", "x", "a2")
  m = hh.match_actions(src, tgt, renames={"a2": "a"}, only_in_source=["c"],
                       only_in_target=["x"])
  np.testing.assert_array_equal(m, [1, -1, 0])


def test_unmapped_actions_are_errors():
  with pytest.raises(ValueError, match="target action 'x' is unmapped"):
    hh.match_actions(("a", "b"), ("a", "b", "x"))
  with pytest.raises(ValueError, match="source action 'b' is unmapped"):
    hh.match_actions(("a", "b"), ("a",))
  with pytest.raises(ValueError, match=r"only_in_target: unknown action names \['zz'\]"):
    hh.match_actions(("a",), ("a",), only_in_target=["zz"])
  with pytest.raises(ValueError, match="only_in_source: 'a' is listed as unmatched"):
    hh.match_actions(("a", "b"), ("a",), only_in_source=["a", "b"])


def test_bad_action_maps_are_rejected():
  with pytest.raises(ValueError, match="action_map: expected length 3"):
    hh.check_action_map([0, 1], num_source=3, num_target=3)
  with pytest.raises(ValueError, match="target action 1 maps to 5"):
    hh.check_action_map([0, 5, 1], num_source=3, num_target=3)
  with pytest.raises(ValueError, match=r"target actions \[0, 2\] all map to source action 1"):
    hh.check_action_map([1, 0, 1], num_source=3, num_target=3)
  with pytest.raises(ValueError, match="expected integer"):
    hh.check_action_map([0.0, 1.0], num_source=2, num_target=2)
  q = _random_pair(np.random.default_rng(5), 4, 3, 3)
  kw = dict(source_scores=q["f_src"], target_scores=q["f_tgt"], source_log_policy=q["l_src"],
            target_log_policy=q["l_tgt"], source_pi_ref=q["src_ref"],
            target_pi_ref=q["tgt_ref"], tau=1.0)
  with pytest.raises(ValueError, match="action_map: expected length 3"):
    hh.transfer_decomposition(action_map=np.array([0, 1]), **kw)
  with pytest.raises(ValueError, match="state 0 has no common action"):
    hh.transfer_decomposition(action_map=np.array([-1, -1, -1]), **kw)
  with pytest.raises(ValueError, match=r"target_scores: expected shape \[4, 3\]"):
    hh.transfer_decomposition(action_map=q["amap"], **dict(kw, target_scores=q["f_tgt"][:, :2]))
  h = checkbox.checkbox_harnesses()
  with pytest.raises(ValueError, match="pass an action map"):
    hh.harness_transfer_decomposition(h["H0"], h["H1"], np.zeros((9, 5)), np.zeros((9, 8)),
                                      tau=0.1)


def test_zero_probability_on_a_common_action_is_an_error():
  q = _random_pair(np.random.default_rng(6), 4, 3, 3)
  l_tgt = q["l_tgt"].copy()
  l_tgt[2, 0] = -np.inf  # action 0 is common in every state
  with pytest.raises(ValueError, match="target_log_policy: action 0 in state 2 is a common "
                     "action but has no finite score"):
    hh.transfer_decomposition(
        source_scores=q["f_src"], target_scores=q["f_tgt"], source_log_policy=q["l_src"],
        target_log_policy=l_tgt, source_pi_ref=q["src_ref"], target_pi_ref=q["tgt_ref"],
        action_map=q["amap"], tau=1.0)
