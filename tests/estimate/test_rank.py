"""Spearman and Kendall tau-b (with ties) against scipy.stats."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import numpy as np
import pytest
import scipy.stats

from harnax.estimate import rank

vectors = st.sampled_from([2, 3, 7]).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-3, 3), min_size=n, max_size=n),
    st.lists(st.integers(-3, 3), min_size=n, max_size=n)))


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
@settings(max_examples=80, deadline=None, derandomize=True)
@given(vectors)
def test_matches_scipy_with_ties(xy):
  x, y = (np.asarray(v, float) for v in xy)
  want_s = scipy.stats.spearmanr(x, y).statistic
  want_k = scipy.stats.kendalltau(x, y, variant="b").statistic
  got_s, got_k = float(rank.spearman(x, y)), float(rank.kendall_tau_b(x, y))
  if np.isnan(want_s):
    assert np.isnan(got_s)
  else:
    assert got_s == pytest.approx(want_s, abs=1e-12)
  if np.isnan(want_k):
    assert np.isnan(got_k)
  else:
    assert got_k == pytest.approx(want_k, abs=1e-12)


def test_average_ranks_match_scipy():
  x = np.array([3.0, 1.0, 3.0, 2.0, 3.0])
  np.testing.assert_allclose(rank.average_ranks(x), scipy.stats.rankdata(x))


def test_perfect_and_reversed_orders():
  x = np.arange(6.0)
  assert float(rank.spearman(x, 2 * x + 1)) == pytest.approx(1.0)
  assert float(rank.kendall_tau_b(x, -x)) == pytest.approx(-1.0)


def test_jit_and_vmap():
  xs = np.random.default_rng(0).normal(size=(4, 7))
  ys = np.random.default_rng(1).normal(size=(4, 7))
  out = jax.jit(jax.vmap(rank.kendall_tau_b))(xs, ys)
  for i in range(4):
    assert float(out[i]) == pytest.approx(scipy.stats.kendalltau(xs[i], ys[i]).statistic)


def test_bad_input_raises():
  with pytest.raises(ValueError, match="y"):
    rank.spearman([1.0, 2.0], [1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match="at least 2"):
    rank.kendall_tau_b([1.0], [1.0])
  with pytest.raises(ValueError, match="x"):
    rank.spearman([1.0, np.nan], [1.0, 2.0])
