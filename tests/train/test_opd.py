"""The baselines' weights and turn mixing (harnax.train.opd) against values computed by hand."""

import jax
import numpy as np
import pytest

from harnax.train import opd

pytestmark = pytest.mark.x64


def test_turn_weights_renormalize_to_the_mean_of_one_per_token():
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  w = np.asarray(opd.renormalize_turn_weights(np.array([1.0, 3.0]), mask))
  # u = (1, 3), n = (2, 1): scale = N / sum(u n) = 3 / 5.
  np.testing.assert_allclose(w, [[0.6, 0.6, 0.0], [1.8, 0.0, 0.0]])
  assert w.sum() == pytest.approx(mask.sum())
  # Equal turn weights give OPD's weights exactly.
  np.testing.assert_allclose(opd.renormalize_turn_weights(np.array([2.0, 2.0]), mask), mask)
  # All-zero weights (no confident turn) give zero, not NaN.
  np.testing.assert_array_equal(opd.renormalize_turn_weights(np.zeros(2), mask), 0.0)


def test_weighted_kl_by_hand():
  kl = np.array([[0.5, 1.0, 7.0], [2.0, 9.0, 9.0]])
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  w = opd.renormalize_turn_weights(np.array([1.0, 3.0]), mask)
  assert float(opd.weighted_kl(kl, w, mask)) == pytest.approx((0.6 * 0.5 + 0.6 * 1.0 + 1.8 * 2.0)
                                                              / 3)
  # Unit weights: the plain masked mean (OPD).
  assert float(opd.weighted_kl(kl, mask.astype(float), mask)) == pytest.approx(3.5 / 3)


def test_sage_confidence_is_the_mean_action_token_probability():
  lp = np.log(np.array([[0.9, 0.5, 0.25], [0.3, 0.2, 0.1]]))
  action = np.array([[0, 1, 1], [0, 0, 0]], bool)
  np.testing.assert_allclose(opd.sage_confidence(lp, action), [0.375, 0.0])


def test_sopd_weights_fall_with_the_turn_divergence():
  kl = np.array([[1.0, 3.0], [0.0, 5.0]])
  mask = np.array([[1, 1], [1, 0]], bool)
  np.testing.assert_allclose(opd.sopd_turn_weights(kl, mask, temperature=2.0),
                             [np.exp(-1.0), 1.0])
  with pytest.raises(ValueError, match="temperature"):
    opd.sopd_turn_weights(kl, mask, temperature=0.0)
  # No gradient flows through the weights.
  g = jax.grad(lambda k: opd.sopd_turn_weights(k, mask).sum())(kl)
  np.testing.assert_array_equal(g, 0.0)


def test_guided_schedule_is_linear_to_zero():
  probs = [opd.guided_teacher_prob(s, 10, p0=0.5, anneal_fraction=0.5) for s in range(10)]
  np.testing.assert_allclose(probs, [0.5, 0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0, 0], atol=1e-12)
  for bad in (dict(p0=1.5, anneal_fraction=0.5), dict(p0=0.5, anneal_fraction=0.0)):
    with pytest.raises(ValueError, match="p0|anneal_fraction"):
      opd.guided_teacher_prob(0, 10, **bad)
  rng = np.random.default_rng(0)
  assert not opd.guided_choices(50, 0.0, rng).any() and opd.guided_choices(50, 1.0, rng).all()
  assert 300 < opd.guided_choices(1000, 0.4, rng).sum() < 500


def test_positive_only_loss_acts_on_active_states_only():
  pos = np.array([-1.0, -2.0, -np.inf])
  loss, active = opd.positive_only_loss(pos, np.array([True, True, False]),
                                        np.array([True, False, True]))
  assert float(loss) == pytest.approx(1.0 / 3) and int(active) == 1
  g = jax.grad(lambda p: opd.positive_only_loss(p, np.array([True, True, False]),
                                                np.array([True, False, True]))[0])(pos)
  np.testing.assert_allclose(g, [-1 / 3, 0.0, 0.0])
