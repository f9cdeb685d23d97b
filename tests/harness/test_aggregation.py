"""Semantic aggregation of output policies: both invalid-output rules, in log space."""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax import harness as hh
from harnax.envs import checkbox
from tests.harness import reference as ref


def _output_probs(rng, s, o, *, zeros=0.0):
  p = rng.dirichlet(np.ones(o), size=s)
  p = np.where(rng.uniform(size=(s, o)) < zeros, 0.0, p)
  p[np.arange(s), rng.integers(0, o, s)] += 0.1  # keep every row nonzero
  return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("invalid", ["renormalize", "noop"])
def test_matches_loop_reference(invalid):
  rng = np.random.default_rng(0)
  s, a, o = 7, 4, 9
  table = rng.integers(-1, a, size=(s, o)).astype(np.int32)
  table[:, 0] = rng.integers(0, a, size=s)  # a valid output in every state
  probs = _output_probs(rng, s, o, zeros=0.2)
  want = ref.aggregate(probs, table, a, invalid, noop_action=2)
  got = hh.aggregate_probs(probs, table, num_actions=a, invalid=invalid, noop_action=2)
  np.testing.assert_allclose(got, want, atol=1e-14)
  log_probs = np.log(np.where(probs > 0, probs, 1.0)) + np.where(probs > 0, 0.0, -np.inf)
  got_log = hh.aggregate_log_probs(log_probs, table, num_actions=a, invalid=invalid,
                                   noop_action=2)
  with np.errstate(divide="ignore"):
    np.testing.assert_allclose(got_log, np.log(want), atol=1e-12)


def test_log_space_keeps_precision_far_below_underflow():
  # Two outputs decode to action 0 with log-probabilities around -800, far
  # below exp underflow: the log-space sum is exact, the naive one is 0.
  logp = np.array([[-800.0, -800.0 - np.log(3.0), np.log1p(-np.exp(-1.0)) * 0.0]])
  logp[0, 2] = 0.0
  logp = logp - np.logaddexp.reduce(logp, axis=-1, keepdims=True)
  table = np.array([[0, 0, 1]], np.int32)
  got = hh.aggregate_log_probs(logp, table, num_actions=2, invalid="noop", noop_action=1)
  np.testing.assert_allclose(got[0, 0], -800.0 + np.log(4.0 / 3.0), rtol=1e-14)
  assert float(jnp.exp(got[0, 0])) == 0.0  # what a probability-space sum would give


def test_several_outputs_decoding_to_one_action_add_up():
  probs = np.array([[0.1, 0.2, 0.3, 0.4]])
  table = np.array([[1, 1, -1, 0]], np.int32)
  np.testing.assert_allclose(hh.aggregate_probs(probs, table, num_actions=2), [[4 / 7, 3 / 7]])
  np.testing.assert_allclose(
      hh.aggregate_probs(probs, table, num_actions=2, invalid="noop", noop_action=0),
      [[0.7, 0.3]])


@hypothesis.settings(deadline=None, max_examples=25)
@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  shape=st.sampled_from([(1, 1, 1), (3, 2, 5), (5, 4, 7)]),
                  invalid=st.sampled_from(["renormalize", "noop"]))
def test_semantic_policy_is_a_distribution_matching_the_reference(seed, shape, invalid):
  # A few fixed shapes (one compile each); values, decode tables and modes vary.
  s, a, o = shape
  rng = np.random.default_rng(seed)
  table = rng.integers(-1, a, size=(s, o)).astype(np.int32)
  table[:, 0] = rng.integers(0, a, size=s)
  logits = rng.normal(scale=3.0, size=(s, o))
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  got = np.asarray(hh.aggregate_log_probs(logp, table, num_actions=a, invalid=invalid,
                                          noop_action=0))
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-12)
  want = ref.aggregate(np.exp(logp), table, a, invalid, noop_action=0)
  np.testing.assert_allclose(np.exp(got), want, atol=1e-12)


def test_jit_vmap_and_gradients():
  rng = np.random.default_rng(1)
  s, a, o, b = 4, 3, 6, 5
  table = rng.integers(-1, a, size=(s, o)).astype(np.int32)
  table[:, 0] = 0
  logits = rng.normal(size=(b, s, o))

  def policy(lg, mode):
    return jnp.exp(hh.aggregate_log_probs(jax.nn.log_softmax(lg), table, num_actions=a,
                                          invalid=mode, noop_action=1))

  for mode in ("renormalize", "noop"):
    batched = jax.jit(jax.vmap(lambda lg, m=mode: policy(lg, m)))(logits)
    for i in range(b):
      p = np.exp(logits[i]) / np.exp(logits[i]).sum(-1, keepdims=True)
      np.testing.assert_allclose(batched[i], ref.aggregate(p, table, a, mode, 1), atol=1e-12)
    # Gradient of one aggregated probability vs central finite differences.
    f = jax.jit(lambda lg, m=mode: policy(lg, m)[2, 0])
    g = jax.jit(jax.grad(f))(logits[0])
    assert np.all(np.isfinite(g))
    eps = 1e-6
    e = np.zeros_like(logits[0])
    e[2, 3] = eps
    fd = (f(logits[0] + e) - f(logits[0] - e)) / (2 * eps)
    np.testing.assert_allclose(g[2, 3], fd, atol=1e-8)


def test_gradient_is_finite_with_minus_inf_outputs():
  logp = jnp.array([[0.0, -jnp.inf, -jnp.inf]])
  table = np.array([[0, 1, -1]], np.int32)
  g = jax.grad(lambda x: hh.aggregate_log_probs(x, table, num_actions=2)[0, 0])(logp)
  assert np.all(np.isfinite(g))


def test_semantic_policy_of_a_harness_is_usable_by_the_core():
  h = checkbox.checkbox_harness("base")
  logp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(2).normal(size=(9, 10))))
  for mode in ("renormalize", "noop"):
    pol = hh.semantic_policy(h, logp, invalid=mode)
    np.testing.assert_allclose(pol, jnp.exp(hh.semantic_log_policy(h, logp, invalid=mode)))
    np.testing.assert_allclose(pol.sum(-1), 1.0, atol=1e-12)
  # Under noop the invalid outputs (scroll down, click delta) land on `wait`.
  p = np.exp(np.asarray(logp))
  wait = h.action_names.index("wait")
  extra = p[:, list(h.output_names).index("scroll down")] + p[:, list(h.output_names).index(
      "click delta")]
  np.testing.assert_allclose(hh.semantic_policy(h, logp, invalid="noop")[:, wait],
                             p[:, list(h.output_names).index("wait")] + extra, atol=1e-12)


# --- bad input ---------------------------------------------------------------

def test_probabilities_not_summing_to_one_are_rejected():
  table = np.array([[0, 1]], np.int32)
  with pytest.raises(ValueError, match="output_probs: expected probabilities summing to 1"):
    hh.aggregate_probs(np.array([[0.5, 0.4]]), table, num_actions=2)
  with pytest.raises(ValueError, match="output_probs: expected non-negative"):
    hh.aggregate_probs(np.array([[1.2, -0.2]]), table, num_actions=2)
  with pytest.raises(ValueError, match=r"output_log_probs: .*state 0 has log-sum-exp"):
    hh.aggregate_log_probs(np.log(np.array([[0.5, 0.4]])), table, num_actions=2)
  with pytest.raises(ValueError, match="output_log_probs: expected finite"):
    hh.aggregate_log_probs(np.array([[np.nan, 0.0]]), table, num_actions=2)
  with pytest.raises(ValueError, match=r"output_log_probs: expected shape \[1, 2\]"):
    hh.aggregate_log_probs(np.zeros((1, 3)), table, num_actions=2)


def test_out_of_range_decode_ids_are_rejected():
  with pytest.raises(ValueError, match="decode_table: expected action ids in"):
    hh.aggregate_probs(np.array([[0.5, 0.5]]), np.array([[0, 2]], np.int32), num_actions=2)


def test_all_invalid_state_under_renormalize_is_an_error():
  probs = np.array([[0.5, 0.5], [0.3, 0.7]])
  table = np.array([[0, 1], [-1, -1]], np.int32)
  with pytest.raises(ValueError, match="in state 1 every output decodes to INVALID"):
    hh.aggregate_probs(probs, table, num_actions=2)
  # Valid outputs exist but carry no probability: also an error, not a silent 0/0.
  table2 = np.array([[0, 1], [0, -1]], np.int32)
  with pytest.raises(ValueError, match="in state 1 every valid output has probability 0"):
    hh.aggregate_probs(np.array([[0.5, 0.5], [0.0, 1.0]]), table2, num_actions=2)
  # The no-op rule is defined there.
  got = hh.aggregate_probs(probs, table, num_actions=2, invalid="noop", noop_action=1)
  np.testing.assert_allclose(got, [[0.5, 0.5], [0.0, 1.0]])
  # Under jit the row is NaN (documented), not garbage that looks valid.
  f = jax.jit(lambda lp: hh.aggregate_log_probs(lp, table, num_actions=2))
  out = np.asarray(f(jnp.log(probs)))
  assert np.all(np.isnan(out[1])) and np.all(np.isfinite(out[0]))


def test_mode_and_noop_options_are_validated():
  probs, table = np.array([[1.0]]), np.array([[0]], np.int32)
  with pytest.raises(ValueError, match="invalid: expected one of"):
    hh.aggregate_probs(probs, table, num_actions=1, invalid="drop")
  with pytest.raises(ValueError, match="noop_action: invalid='noop' needs"):
    hh.aggregate_probs(probs, table, num_actions=1, invalid="noop")
  with pytest.raises(ValueError, match=r"noop_action: expected an action id in \[0, 1\)"):
    hh.aggregate_probs(probs, table, num_actions=1, invalid="noop", noop_action=1)


def test_float32_inputs_stay_float32_and_agree_with_float64():
  rng = np.random.default_rng(4)
  table = rng.integers(-1, 3, size=(5, 6)).astype(np.int32)
  table[:, 0] = 1
  logits = rng.normal(size=(5, 6))
  logp64 = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  want = hh.aggregate_log_probs(logp64, table, num_actions=3, invalid="noop", noop_action=1)
  with jax.enable_x64(False):
    got = hh.aggregate_log_probs(logp64.astype(np.float32), table, num_actions=3,
                                 invalid="noop", noop_action=1)
    assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, atol=1e-5)
