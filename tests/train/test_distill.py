"""Distillation losses against float64 NumPy written here, the expectation identity of the
sampled reverse-KL estimator, HAD's preference term on hand-worked pairs, and lambda."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax.train import distill

pytestmark = pytest.mark.x64


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_full_reverse_kl_matches_numpy_and_names_its_direction():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 3, 5)) * 2
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  loss, per = distill.reverse_kl_full(jnp.asarray(s), jnp.asarray(t), jnp.asarray(mask))
  ref = np.zeros((2, 3))
  for b in range(2):
    for i in range(3):
      if mask[b, i]:
        ls, lt = _log_softmax(s[b, i]), _log_softmax(t[b, i])
        ref[b, i] = sum(np.exp(ls[v]) * (ls[v] - lt[v]) for v in range(5))
  np.testing.assert_allclose(per, ref, rtol=1e-10)
  np.testing.assert_allclose(loss, ref[mask].mean(), rtol=1e-10)
  # KL(teacher || student) is a different number: the direction matters.
  swapped, _ = distill.reverse_kl_full(jnp.asarray(t), jnp.asarray(s), jnp.asarray(mask))
  assert abs(float(swapped) - float(loss)) > 1e-3
  same, _ = distill.reverse_kl_full(jnp.asarray(s), jnp.asarray(s), jnp.asarray(mask))
  assert abs(float(same)) < 1e-12
  with pytest.raises(ValueError, match="teacher_logits"):
    distill.reverse_kl_full(jnp.asarray(s), jnp.asarray(t[..., :4]), jnp.asarray(mask))


def test_sampled_estimator_gradient_is_unbiased_for_the_full_form():
  # One position, vocabulary 6: the expectation over y ~ pi_S of the surrogate's gradient
  # (enumerated exactly) equals the gradient of the full reverse KL.
  rng = np.random.default_rng(1)
  s_logits = jnp.asarray(rng.normal(size=6))
  t_lp = jnp.asarray(_log_softmax(rng.normal(size=6)))

  def surrogate(logits, y):
    lp = jax.nn.log_softmax(logits)
    out, _ = distill.reverse_kl_sampled(lp[y][None, None], t_lp[y][None, None],
                                        jnp.ones((1, 1), bool))
    return out

  p = jax.nn.softmax(s_logits)
  expected = sum(p[y] * jax.grad(surrogate)(s_logits, y) for y in range(6))
  full = jax.grad(lambda l: distill.reverse_kl_full(l[None, None], t_lp[None, None],
                                                    jnp.ones((1, 1), bool))[0])(s_logits)
  np.testing.assert_allclose(expected, full, atol=1e-12)
  # Its value is the k1 estimate.
  lp_s, lp_t = jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -0.5]])
  _, k1 = distill.reverse_kl_sampled(lp_s, lp_t, jnp.array([[True, True]]))
  np.testing.assert_allclose(k1, np.mean([-1.0 + 1.5, -2.0 + 0.5]))


def test_mean_action_logprob_and_preference_on_hand_worked_pairs():
  lp = jnp.array([[-1.0, -3.0, -0.5, 0.0], [-2.0, -2.0, -2.0, -2.0], [-0.1, -0.2, -0.3, -0.4]])
  action = jnp.array([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  means = distill.mean_action_logprob(lp, action)
  np.testing.assert_allclose(means, [-1.75, -2.0, 0.0])
  pos, neg = jnp.array([-0.5, -1.0, -2.0, -0.3]), jnp.array([-1.5, -1.0, -0.1, -3.0])
  differ = jnp.array([True, False, True, True])
  valid = jnp.array([True, True, True, False])
  loss, active = distill.action_preference_loss(pos, neg, differ, valid, beta=2.0)
  # Pairs 1 (same action) and 3 (invalid) contribute nothing; 0 and 2 are -log sigmoid(2 m).
  ref = (np.log1p(np.exp(-2.0 * 1.0)) + np.log1p(np.exp(-2.0 * -1.9))) / 4
  np.testing.assert_allclose(loss, ref, rtol=1e-12)
  assert int(active) == 2
  g_pos, g_neg = jax.grad(lambda a, b: distill.action_preference_loss(a, b, differ, valid)[0],
                          argnums=(0, 1))(pos, neg)
  assert float(g_pos[1]) == float(g_neg[1]) == float(g_pos[3]) == float(g_neg[3]) == 0.0
  assert float(g_pos[0]) < 0 < float(g_neg[0])      # descending raises a+ and lowers a-
  with pytest.raises(ValueError, match="beta"):
    distill.action_preference_loss(pos, neg, differ, valid, beta=0.0)


def test_preference_is_zero_when_no_pair_is_active_even_with_infinite_margins():
  pos = jnp.array([-jnp.inf, 0.0])
  neg = jnp.array([0.0, -jnp.inf])
  loss, active = distill.action_preference_loss(pos, neg, jnp.array([True, False]),
                                                jnp.array([False, True]))
  g = jax.grad(lambda a: distill.action_preference_loss(a, neg, jnp.array([True, False]),
                                                        jnp.array([False, True]))[0])(pos)
  assert float(loss) == 0.0 and int(active) == 0
  assert np.all(np.asarray(g) == 0.0)


def test_lambda_is_the_gradient_norm_ratio_and_balances_the_terms():
  params = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(0.3)}

  def rd(p):
    return jnp.sum(p["w"] ** 2) + 3.0 * p["b"]

  def pref(p):
    return 0.1 * jnp.sum(p["w"]) + p["b"] ** 2

  grads, aux = distill.balanced_gradient(rd, pref, params)
  g_rd, g_pref = jax.grad(rd)(params), jax.grad(pref)(params)
  n = lambda g: np.sqrt(sum(np.sum(np.asarray(x) ** 2) for x in jax.tree.leaves(g)))
  np.testing.assert_allclose(aux["lambda"], n(g_rd) / n(g_pref), rtol=1e-12)
  np.testing.assert_allclose(aux["lambda"] * n(g_pref), n(g_rd), rtol=1e-12)
  for k in params:
    np.testing.assert_allclose(grads[k], g_rd[k] + aux["lambda"] * g_pref[k], rtol=1e-12)
  zero = distill.gradient_norm_ratio(g_rd, jax.tree.map(jnp.zeros_like, g_pref))
  assert float(zero) == 0.0
  jitted = jax.jit(lambda p: distill.balanced_gradient(rd, pref, p)[1]["loss"])
  np.testing.assert_allclose(jitted(params), aux["loss"], rtol=1e-12)
