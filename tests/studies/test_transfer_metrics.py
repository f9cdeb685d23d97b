"""The study's reported quantities against brute force and float64 NumPy references.

Selection rule, wins, error-matrix reading and rankings on hand-made matrices (loops written
here); the three-way decomposition on real MiniWoB++ instances (click-checkboxes under H0 and
H3, padded): the parts add up to the error, the readout drift and the target shift match a
NumPy computation (soft value iteration written here), and states without a counterpart
contribute nothing.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax.core import solvers
from harnax.envs import miniwob as mw
from harnax.studies import families
from harnax.studies import miniwob
from harnax.studies import transfer_metrics as tm

pytestmark = pytest.mark.x64
TAU = 0.1

# -- selection ------------------------------------------------------------------------------


def _random_frozen(n, seed):
  rng = np.random.default_rng(seed)
  return rng.normal(size=n), rng.uniform(0, 0.5, size=n), rng.normal(size=(n, n))


def test_swap_quantities_and_selection_by_loops():
  names = tuple(f"H{k}" for k in range(6))
  c, m, v = _random_frozen(6, 0)
  dc, t, fz = (np.asarray(x) for x in tm.swap_quantities(c, m, v))
  want = []
  for i, j in itertools.product(range(6), range(6)):
    assert dc[i, j] == pytest.approx(c[j] - c[i])
    assert t[i, j] == pytest.approx(c[j] - c[i] + m[i])
    assert fz[i, j] == pytest.approx(v[i, j] - v[i, i])
    if i != j and v[i, j] - v[i, i] < 0 and c[j] - c[i] + m[i] > 0:
      want.append((names[i], names[j]))
  got = tm.select_swaps(c, m, v, names)
  assert got == tuple(want) and 0 < len(got) < 30
  # A cap keeps those with the largest T, in the same (row-major) order.
  capped = tm.select_swaps(c, m, v, names, max_swaps=3)
  by_t = sorted(want, key=lambda p: -t[names.index(p[0]), names.index(p[1])])[:3]
  assert set(capped) == set(by_t) and list(capped) == [p for p in want if p in by_t]
  assert tm.select_swaps(c, m, v, names, max_swaps=0) == ()


def test_selection_bad_input():
  c, m, v = _random_frozen(3, 1)
  with pytest.raises(ValueError, match=r"frozen_value: expected shape \[2, 2\]"):
    tm.select_swaps(c, m, v, ("H0", "H1"))
  with pytest.raises(ValueError, match="max_swaps: expected None or a non-negative int"):
    tm.select_swaps(c, m, v, ("H0", "H1", "H2"), max_swaps=-1)


def test_swap_wins_split_by_the_sign_of_delta_c():
  nan = np.nan
  rows = [dict(delta_ceiling=+0.1, selected=True, realized_gain=+0.2, gain_vs_continued=+0.1),
          dict(delta_ceiling=+0.2, selected=True, realized_gain=+0.1, gain_vs_continued=-0.1),
          dict(delta_ceiling=+0.3, selected=True, realized_gain=nan, gain_vs_continued=nan),
          dict(delta_ceiling=+0.3, selected=False, realized_gain=+1.0, gain_vs_continued=1.0),
          dict(delta_ceiling=-0.1, selected=True, realized_gain=-0.2, gain_vs_continued=nan),
          dict(delta_ceiling=0.0, selected=True, realized_gain=+0.3, gain_vs_continued=nan)]
  w = tm.swap_wins(rows)
  assert w["raises_C"] == {"selected": 3, "adapted": 2, "wins": 2, "with_control": 2,
                           "wins_vs_control": 1}
  # ΔC = 0 counts as not raising the ceiling.
  assert w["lowers_C"] == {"selected": 2, "adapted": 2, "wins": 1, "with_control": 0,
                           "wins_vs_control": 0}


# -- error matrix and rankings --------------------------------------------------------------


def test_error_summary_reads_rows_and_columns():
  e = np.array([[0.1, 0.3, 0.2],
                [0.05, 0.2, 0.4],
                [0.3, 0.3, 0.25]])
  base = np.array([0.5, 0.4, 0.25])
  out = tm.error_summary(e, base)
  np.testing.assert_allclose(out["reduction"], [0.8, 0.5, 0.0])
  assert out["own_lowest_in_row"].tolist() == [True, False, True]
  assert out["own_lowest_in_column"].tolist() == [False, True, False]
  with pytest.raises(ValueError, match=r"errors: expected shape \[3, 3\]"):
    tm.error_summary(e[:2], base)


def _numpy_spearman(x, y):
  rx, ry = (np.argsort(np.argsort(a)).astype(float) for a in (x, y))   # no ties here
  return np.corrcoef(rx, ry)[0, 1]


def test_ranking_agreement_only_the_difference_is_exact():
  # C and M each misorder the harnesses, C − M orders them as the realized outcome.
  c = np.array([1.0, 2.0, 3.0, 4.0])
  m = np.array([0.5, 1.8, 2.9, 2.0])      # C − M = 0.5, 0.2, 0.1, 2.0
  realized = np.array([0.6, 0.3, 0.2, 0.9])
  out = tm.ranking_agreement(c, m, realized)
  assert out["C − M"]["exact"] and out["C − M"]["discordant"] == 0
  assert not out["C"]["exact"] and not out["M"]["exact"]
  for name, pred in (("C − M", c - m), ("C", c), ("M", -m)):
    assert out[name]["spearman"] == pytest.approx(_numpy_spearman(pred, realized))
    pairs = list(itertools.combinations(range(4), 2))
    conc = sum(np.sign(pred[a] - pred[b]) * np.sign(realized[a] - realized[b]) > 0
               for a, b in pairs)
    disc = sum(np.sign(pred[a] - pred[b]) * np.sign(realized[a] - realized[b]) < 0
               for a, b in pairs)
    assert out[name]["discordant"] == disc
    assert out[name]["kendall"] == pytest.approx((conc - disc) / len(pairs))


def test_discordant_pairs_ties_in_the_outcome_allow_either_order():
  assert tm.discordant_pairs([1.0, 2.0, 3.0], [0.5, 0.5, 1.0]) == 0
  assert tm.discordant_pairs([2.0, 1.0, 3.0], [0.5, 0.6, 1.0]) == 1
  # Float noise is no order: equal to 9 places is a tie.
  assert tm.discordant_pairs([1.0, 1.0 + 1e-13, 2.0], [0.5 + 1e-14, 0.5, 1.0]) == 0
  noisy = tm.ranking_agreement([1.0, 1.0 + 1e-13, 2.0], [0.0, 0.0, 0.0],
                               [0.5 + 1e-14, 0.5, 1.0])
  assert noisy["C"]["exact"] and noisy["C"]["spearman"] == pytest.approx(1.0)
  const = tm.ranking_agreement([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.1, 0.2, 0.3])
  assert np.isnan(const["C"]["spearman"]) and not const["C"]["exact"]


# -- the decomposition on real MiniWoB++ instances ------------------------------------------


def _soft_scores(h):
  """`F* = Q* + tau log pi_ref` by float64 soft value iteration (-inf where unavailable)."""
  p, r = (np.asarray(x, np.float64) for x in (h.mdp.transitions, h.mdp.rewards))
  gamma, ref = float(h.mdp.discount), np.asarray(h.pi_ref, np.float64)
  avail = ref > 0
  v = np.zeros(p.shape[0])
  for _ in range(600):
    q = r + gamma * p @ v
    f = np.where(avail, q + TAU * np.log(np.where(avail, ref, 1.0)), -np.inf)
    top = f.max(-1, keepdims=True)
    v = top[:, 0] + TAU * np.log(np.exp((f - top) / TAU).sum(-1))
  return f


def _centred(x, mask):
  mean = np.where(mask, x, 0.0).sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True),
                                                                     1)
  return np.where(mask, x - mean, 0.0)


@pytest.fixture(scope="module")
def checkbox_swap():
  tasks = [mw.CheckboxesTask(labels=("ab", "cd"), targets=(True, False)),
           mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(False, True, True))]
  src = [mw.compile_harness(t, "H0") for t in tasks]
  tgt = [mw.compile_harness(t, "H3") for t in tasks]
  shape = miniwob.batch_shape(src + tgt)
  bs, bt = miniwob.pad_batch(src, shape), miniwob.pad_batch(tgt, shape)
  theta = jax.random.normal(jax.random.key(3), (mw.features.NUM_FEATURES,), jnp.float64)
  fam = families.LogLinearFamily()
  lp_s, lp_t = (tm.semantic_log_policy(fam, theta, b) for b in (bs, bt))
  solve = jax.vmap(lambda m, r: solvers.solve_soft_bellman(m, r, TAU, tol=1e-12).scores)
  maps = np.stack([tm.action_map(a.harness.action_names, b.harness.action_names, shape[1])
                   for a, b in zip(src, tgt)])
  dec = tm.batch_decomposition(solve(bs.mdp, bs.pi_ref), solve(bt.mdp, bt.pi_ref), lp_s, lp_t,
                               bs.pi_ref, bt.pi_ref, maps, TAU)
  return dict(src=src, tgt=tgt, bs=bs, bt=bt, lp_s=lp_s, lp_t=lp_t, maps=maps, dec=dec)


def test_action_map_by_name_with_gaps_and_padding(checkbox_swap):
  a, b = checkbox_swap["src"][0], checkbox_swap["tgt"][0]
  amap = checkbox_swap["maps"][0]
  for k, name in enumerate(b.harness.action_names):
    want = a.harness.action_names.index(name) if name in a.harness.action_names else -1
    assert amap[k] == want
  assert b.harness.action_names[-1] == "verify" and amap[len(b.harness.action_names) - 1] == -1
  assert np.all(amap[len(b.harness.action_names):] == -1)
  with pytest.raises(ValueError, match="num_actions: expected at least"):
    tm.action_map(a.harness.action_names, b.harness.action_names, 2)


def test_parts_add_up_to_the_error(checkbox_swap):
  d = checkbox_swap["dec"]
  np.testing.assert_allclose(np.asarray(d.target_shift + d.learning_residual + d.readout_drift),
                             np.asarray(d.error), atol=1e-12)
  assert float(np.max(np.abs(np.asarray(d.readout_drift)))) > 1e-3      # not trivially 0


def test_readout_drift_and_target_shift_against_numpy(checkbox_swap):
  q = checkbox_swap
  d = q["dec"]
  for n, (a, b) in enumerate(zip(q["src"], q["tgt"])):
    amap = q["maps"][n]
    idx = np.where(amap >= 0, amap, 0)
    src_ref, tgt_ref = np.asarray(q["bs"].pi_ref[n]), np.asarray(q["bt"].pi_ref[n])
    common = (amap >= 0)[None, :] & (tgt_ref > 0) & (src_ref[:, idx] > 0)
    lp_s, lp_t = np.asarray(q["lp_s"][n]), np.asarray(q["lp_t"][n])
    diff = np.where(common, lp_t, 0.0) - np.where(common, lp_s[:, idx], 0.0)
    drift = _centred(TAU * diff, common)
    np.testing.assert_allclose(np.asarray(d.readout_drift[n]), drift, atol=1e-12)
    # Target shift on the real pages: unverified page k is state k of both harnesses.
    pages = a.task.num_page_states
    f_s, f_t = _soft_scores(a.harness), _soft_scores(b.harness)
    a_s, a_t = a.harness.num_actions, b.harness.num_actions
    m = amap[:a_t]
    mask = common[:pages, :a_t]
    shift = _centred(np.where(mask, f_s[:pages][:, np.where(m >= 0, m, 0)] - f_t[:pages], 0.0),
                     mask)
    assert a_s < a_t and np.max(np.abs(shift)) > 1e-5     # the verification tool moves F*
    np.testing.assert_allclose(np.asarray(d.target_shift[n, :pages, :a_t]), shift, atol=1e-8)
    # Verified pages, the end state and padding have no counterpart: every part is 0.
    for part in (d.error, d.target_shift, d.learning_residual, d.readout_drift):
      assert np.all(np.asarray(part[n, pages:]) == 0.0)


def test_summary_weights_and_bad_input(checkbox_swap):
  q = checkbox_swap
  d = q["dec"]
  w = np.asarray(tm.occupancies(q["bt"].mdp, jnp.exp(q["lp_t"])))
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-10)
  got = tm.decomposition_summary(d, w)
  err = np.asarray(d.error)
  count = np.maximum(np.asarray(d.common).sum(-1), 1)
  want = np.mean(np.sqrt(np.sum(w * (err ** 2).sum(-1) / count, -1)))
  assert got["error"] == pytest.approx(want, rel=1e-10)
  with pytest.raises(ValueError, match="action_maps: expected 2 instances"):
    tm.batch_decomposition(*(x for x in (d.error, d.error, q["lp_s"], q["lp_t"])),
                           q["bs"].pi_ref, q["bt"].pi_ref, q["maps"][:1], TAU)
