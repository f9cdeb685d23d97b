"""The HAD evaluation metrics against hand-worked traces, a brute-force reading of their
definitions (docs/text_eval.md), and scipy's Wilson interval."""

import numpy as np
import pytest
from scipy import stats

from harnax.studies import text_metrics as tm


def _trace(won, stalled, accepted=None, consistent=None):
  stalled = np.asarray(stalled, bool)
  n = stalled.shape[0]
  accepted = np.ones(n, bool) if accepted is None else np.asarray(accepted, bool)
  consistent = np.ones(n, bool) if consistent is None else np.asarray(consistent, bool)
  return tm.EpisodeTrace(won=won, accepted=accepted, consistent=consistent, stalled=stalled)


def test_hand_worked_episodes():
  eps = [
      # enters at 1, leaves at 3: one escape within 2.
      _trace(False, [0, 1, 1, 0, 0], accepted=[1, 0, 1, 1, 1], consistent=[1, 1, 0, 1, 1]),
      # enters at 0 and never leaves: no escape.
      _trace(False, [1, 1, 1, 1]),
      # no stall, won.
      _trace(True, [0, 0, 0]),
      # enters at 2 and wins at its last turn (3) while stalled: escapes by winning.
      _trace(True, [0, 0, 1, 1]),
  ]
  assert tm.success(eps).successes == 2 and tm.success(eps).trials == 4
  assert (tm.stall_prevention(eps).successes, tm.stall_prevention(eps).trials) == (1, 4)
  esc = tm.stall_escape(eps, within=2)
  assert (esc.successes, esc.trials) == (2, 3)
  util = tm.harness_utilization(eps)
  assert (util.successes, util.trials) == (14, 16)
  # Within 1 turn the first episode's stall (turns 1-2) is not left in time.
  assert tm.stall_escape(eps, within=1).successes == 1


def _escape_reference(stalled, won, within):
  """A second reading of the definition: walk the turns, track runs of stalled turns."""
  entries = escapes = 0
  n = len(stalled)
  t = 0
  while t < n:
    if stalled[t]:
      entries += 1
      end = t
      while end + 1 < n and stalled[end + 1]:
        end += 1
      run_length = end - t + 1            # the run covers turns t..end
      if end + 1 < n and run_length <= within:
        escapes += 1                        # turn end+1 is a non-stalled turn within reach
      elif end + 1 == n and won and (n - 1) - t <= within:
        escapes += 1                        # the episode was won at its last turn, in reach
      t = end + 1
    else:
      t += 1
  return entries, escapes


def test_random_traces_against_reference():
  rng = np.random.default_rng(0)
  eps = []
  for _ in range(200):
    n = int(rng.integers(1, 15))
    eps.append(_trace(bool(rng.random() < 0.4), rng.random(n) < 0.5,
                      accepted=rng.random(n) < 0.8, consistent=rng.random(n) < 0.9))
  for within in (1, 2, 5):
    ref = [_escape_reference(list(ep.stalled), ep.won, within) for ep in eps]
    got = tm.stall_escape(eps, within=within)
    assert got.trials == sum(e for e, _ in ref)
    assert got.successes == sum(s for _, s in ref)
  util = tm.harness_utilization(eps)
  total = sum(len(ep.stalled) for ep in eps)
  good = sum(int(a and c) for ep in eps for a, c in zip(ep.accepted, ep.consistent))
  assert (util.successes, util.trials) == (good, total)


@pytest.mark.parametrize("k,n", [(0, 5), (3, 10), (10, 10), (57, 90)])
def test_wilson_interval_matches_scipy(k, n):
  lo, hi = tm.Rate(k, n).interval()
  ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
  np.testing.assert_allclose([lo, hi], [ref.low, ref.high], atol=1e-6)


def test_summary_and_empty():
  out = tm.summarize([_trace(True, [0, 1, 0])], within=1)
  assert set(out) == {"success", "harness_utilization", "stall_prevention", "stall_escape"}
  assert str(tm.Rate(0, 0)) == "n/a" and np.isnan(tm.Rate(0, 0).value)
  assert str(tm.Rate(1, 4)) == "25.0% (1/4)"


def test_bad_inputs():
  with pytest.raises(ValueError, match="accepted"):
    tm.EpisodeTrace(won=True, accepted=np.ones(3), consistent=np.ones(3, bool),
                    stalled=np.zeros(3, bool))
  with pytest.raises(ValueError, match="one length"):
    tm.EpisodeTrace(won=True, accepted=np.ones(3, bool), consistent=np.ones(2, bool),
                    stalled=np.zeros(3, bool))
  with pytest.raises(ValueError, match="within"):
    tm.stall_escape([], within=0)
  with pytest.raises(ValueError, match=r"episodes\[0\]"):
    tm.success([{"won": True}])


def _won(k, n):
  return [_trace(i < k, [0]) for i in range(n)]


def test_seed_bootstrap_with_one_seed_is_the_episode_bootstrap():
  # 120 of 400 won: the bootstrap's percentile interval approaches the normal one,
  # p ± 1.96 sqrt(p (1 - p) / n) = 0.3 ± 0.0449.
  value, lo, hi = tm.seed_bootstrap([_won(120, 400)], samples=4000, seed=1)
  half = 1.959964 * np.sqrt(0.3 * 0.7 / 400)
  assert value == 0.3
  assert abs(lo - (0.3 - half)) < 0.01 and abs(hi - (0.3 + half)) < 0.01
  assert tm.seed_bootstrap([_won(120, 400)], samples=300, seed=5) == tm.seed_bootstrap(
      [_won(120, 400)], samples=300, seed=5)


def test_seed_bootstrap_widens_the_interval_by_the_seed_to_seed_spread():
  # One seed wins all 50 games, the other none. Pooled: 50 %, Wilson [40, 60] %. Drawing the
  # two seeds with replacement gives {A, A} (success 1), {B, B} (0) each with probability 1/4,
  # so the 95 % interval is [0, 1].
  groups = [_won(50, 50), _won(0, 50)]
  value, lo, hi = tm.seed_bootstrap(groups, samples=2000, seed=0)
  assert value == 0.5 and lo == 0.0 and hi == 1.0
  wilson = tm.success(groups[0] + groups[1]).interval()
  assert 0.39 < wilson[0] < wilson[1] < 0.61
  # Seeds that agree exactly: nothing to widen; all won: the interval is the point.
  assert tm.seed_bootstrap([_won(4, 4)] * 3) == (1.0, 1.0, 1.0)
  value, lo, hi = tm.seed_bootstrap([_won(10, 20)] * 3, samples=2000)
  one = tm.seed_bootstrap([_won(30, 60)], samples=2000)
  assert value == 0.5 and abs(lo - one[1]) < 0.03 and abs(hi - one[2]) < 0.03


def test_seed_bootstrap_empty_and_bad_inputs():
  assert all(np.isnan(x) for x in tm.seed_bootstrap([[], []]))
  with pytest.raises(ValueError, match="samples"):
    tm.seed_bootstrap([_won(1, 2)], samples=0)
  with pytest.raises(ValueError, match="level"):
    tm.seed_bootstrap([_won(1, 2)], level=1.0)
  with pytest.raises(ValueError, match=r"episodes\[0\]"):
    tm.seed_bootstrap([[{"won": True}]])


def _wins(flags):
  return [_trace(bool(w), [0]) for w in flags]


def test_paired_wins_by_hand():
  before = _wins([1, 1, 0, 0, 1, 0, 0])
  after = _wins([1, 0, 1, 1, 1, 0, 1])
  p = tm.paired_wins(before, after)
  assert (p.gained, p.lost, p.both, p.neither) == (3, 1, 2, 1)
  # n = 4 discordant, min = 1: 2 * (C(4,0) + C(4,1)) / 16 = 10 / 16.
  assert p.p_value == pytest.approx(10 / 16)
  # Nothing differs: no evidence of change.
  same = tm.paired_wins(before, before)
  assert (same.gained, same.lost, same.p_value) == (0, 0, 1.0)
  # 5 lost, none gained: 2 / 32.
  assert tm.paired_wins(_wins([1] * 5), _wins([0] * 5)).p_value == pytest.approx(2 / 32)


@pytest.mark.parametrize("gained,lost", [(0, 0), (0, 1), (3, 3), (1, 9), (12, 4), (0, 20),
                                         (7, 30)])
def test_mcnemar_exact_matches_scipy_binomtest(gained, lost):
  n = gained + lost
  expected = 1.0 if n == 0 else stats.binomtest(min(gained, lost), n, 0.5).pvalue
  assert tm.mcnemar_exact(gained, lost) == pytest.approx(expected, rel=1e-12)
  assert tm.mcnemar_exact(lost, gained) == tm.mcnemar_exact(gained, lost)


def test_mcnemar_exact_by_enumeration():
  # The definition, independently: every one of the 2^n equally likely splits of n discordant
  # pairs, counting those at least as far from n/2 as the observed one.
  rng = np.random.default_rng(0)
  for n in range(1, 13):
    outcomes = np.array(np.meshgrid(*[[0, 1]] * n)).reshape(n, -1).sum(0)
    gained = int(rng.integers(0, n + 1))
    far = np.abs(outcomes - n / 2) >= abs(gained - n / 2) - 1e-12
    assert tm.mcnemar_exact(gained, n - gained) == pytest.approx(min(1.0, far.mean()))


def test_paired_wins_bad_inputs():
  with pytest.raises(ValueError, match="after: expected the 2 episodes"):
    tm.paired_wins(_wins([1, 0]), _wins([1]))
  with pytest.raises(ValueError, match=r"episodes\[0\]"):
    tm.paired_wins([0.5], [0.5])
  for bad in (-1, 1.5, True, None):
    with pytest.raises(ValueError, match="gained: expected a count"):
      tm.mcnemar_exact(bad, 2)


def _sign_flip_by_enumeration(scores):
  # The definition, independently: all 2^m sign patterns of the non-zero scores, float64.
  d = np.array([s for s in scores if s], float)
  if d.size == 0:
    return 1.0
  signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * d.size)).reshape(d.size, -1)
  totals = np.abs((signs * np.abs(d)[:, None]).sum(0))
  return float(np.mean(totals >= abs(d.sum()) - 1e-9))


def test_sign_flip_p_value_by_enumeration():
  rng = np.random.default_rng(1)
  for m in range(0, 13):
    scores = rng.integers(-3, 4, size=m).tolist()
    assert tm.sign_flip_p_value(scores) == pytest.approx(_sign_flip_by_enumeration(scores),
                                                         rel=1e-12)


@pytest.mark.parametrize("gained,lost", [(0, 0), (0, 3), (4, 4), (2, 11), (25, 9)])
def test_sign_flip_on_unit_scores_is_mcnemar(gained, lost):
  n = gained + lost
  expected = 1.0 if n == 0 else stats.binomtest(min(gained, lost), n, 0.5).pvalue
  scores = [1] * gained + [-1] * lost + [0] * 5
  assert tm.sign_flip_p_value(scores) == pytest.approx(expected, rel=1e-12)


def test_pooled_paired_wins_by_hand():
  # Two seeds, five tasks. d = after - before summed over seeds: [+2, 0, -1, +1, 0].
  before = [_wins([0, 1, 1, 0, 1]), _wins([0, 0, 1, 0, 0])]
  after = [_wins([1, 0, 0, 0, 1]), _wins([1, 1, 1, 1, 0])]
  p = tm.pooled_paired_wins(before, after)
  assert (p.gained, p.lost, p.ahead, p.behind, p.seeds) == (4, 2, 2, 1, 2)
  # Non-zero |d| = (2, 1, 1), observed |total| = 2: the totals ±2±1±1 are
  # 4, 2, 2, 0, 0, -2, -2, -4; six of the eight have |total| >= 2.
  assert p.p_value == pytest.approx(6 / 8)
  # Swapping the methods swaps the counts and keeps the p-value.
  q = tm.pooled_paired_wins(after, before)
  assert (q.gained, q.lost, q.ahead, q.behind, q.p_value) == (2, 4, 1, 2, p.p_value)


def test_pooled_paired_wins_with_one_seed_is_paired_wins():
  rng = np.random.default_rng(2)
  for _ in range(5):
    b, a = _wins(rng.integers(0, 2, 30)), _wins(rng.integers(0, 2, 30))
    one, pooled = tm.paired_wins(b, a), tm.pooled_paired_wins([b], [a])
    assert (pooled.gained, pooled.lost, pooled.ahead, pooled.behind) == (
        one.gained, one.lost, one.gained, one.lost)
    assert pooled.p_value == pytest.approx(one.p_value, rel=1e-12)


def test_pooling_keeps_the_task_as_the_unit():
  # Three seeds that all win the same 4 tasks the other method loses: 12 discordant pairs, but
  # only 4 tasks of evidence. A McNemar test on the pooled pairs would say 2 / 2^12; the
  # task-level test says 2 / 2^4.
  before = [_wins([0, 0, 0, 0, 1, 0])] * 3
  after = [_wins([1, 1, 1, 1, 1, 0])] * 3
  p = tm.pooled_paired_wins(before, after)
  assert (p.gained, p.lost, p.ahead) == (12, 0, 4)
  assert tm.mcnemar_exact(12, 0) == pytest.approx(2 / 2 ** 12)
  assert p.p_value == pytest.approx(2 / 2 ** 4)


def test_pooled_paired_wins_bad_inputs():
  with pytest.raises(ValueError, match="before: expected at least one seed"):
    tm.pooled_paired_wins([], [])
  with pytest.raises(ValueError, match="after: expected 2 seeds"):
    tm.pooled_paired_wins([_wins([1])] * 2, [_wins([1])])
  with pytest.raises(ValueError, match=r"after\[1\]: expected the 2 episodes"):
    tm.pooled_paired_wins([_wins([1, 0])] * 2, [_wins([1, 0]), _wins([1])])
  with pytest.raises(ValueError, match=r"before\[1\]: expected the 2 episodes"):
    tm.pooled_paired_wins([_wins([1, 0]), _wins([1, 0, 1])], [_wins([1, 0])] * 2)
  for bad in (1.5, True, None):
    with pytest.raises(ValueError, match=r"scores\[1\]: expected an int"):
      tm.sign_flip_p_value([1, bad])
