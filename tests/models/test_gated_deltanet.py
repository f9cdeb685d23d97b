"""The gated delta rule (chunked WY/UT form and recurrent form) and the causal convolution,
against plain float64 numpy loops written here from the recurrence's definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax.models import gated_deltanet as gdn

chunked = jax.jit(gdn.chunked_gated_delta_rule, static_argnames="chunk_size")
recurrent = jax.jit(gdn.recurrent_gated_delta_rule)
causal_conv = jax.jit(gdn.causal_conv)


def numpy_delta_rule(q, k, v, g, beta, state):
  """S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,  o_t = S_t^T q_t (float64)."""
  q, k, v, g, beta, s = (np.asarray(x, np.float64) for x in (q, k, v, g, beta, state))
  b, t, h, _ = k.shape
  s = s.copy()
  out = np.zeros(v.shape)
  for i in range(b):
    for hh in range(h):
      for step in range(t):
        kk, vv = k[i, step, hh], v[i, step, hh]
        decayed = np.exp(g[i, step, hh]) * s[i, hh]
        s[i, hh] = (decayed - beta[i, step, hh] * np.outer(kk, kk @ decayed)
                    + beta[i, step, hh] * np.outer(kk, vv))
        out[i, step, hh] = s[i, hh].T @ q[i, step, hh]
  return out, s


def random_inputs(seed, b=2, t=19, h=3, dk=5, dv=4, dtype=np.float32):
  rng = np.random.RandomState(seed)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = unit(rng.randn(b, t, h, dk)) * dk ** -0.5
  k = unit(rng.randn(b, t, h, dk))
  v = rng.randn(b, t, h, dv)
  g = -rng.uniform(0.0, 2.0, (b, t, h))  # includes strong decay (exp(-2) per step)
  beta = rng.uniform(0.05, 0.95, (b, t, h))
  state = 0.5 * rng.randn(b, h, dk, dv)
  return tuple(x.astype(dtype) for x in (q, k, v, g, beta, state))


@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
def test_chunked_equals_numpy_recurrence_float64(chunk):
  args = random_inputs(0, dtype=np.float64)
  ref_out, ref_state = numpy_delta_rule(*args)
  with jax.enable_x64(True):
    out, state = chunked(*map(jnp.asarray, args), chunk_size=chunk)
    rec_out, rec_state = recurrent(*map(jnp.asarray, args))
    assert out.dtype == jnp.float64
  np.testing.assert_allclose(np.asarray(out), ref_out, rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(state), ref_state, rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(rec_out), ref_out, rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(rec_state), ref_state, rtol=0, atol=1e-12)


def test_float32_forms_close_to_float64_reference():
  args = random_inputs(1, t=150)  # several 64-token chunks and a partial one
  ref_out, ref_state = numpy_delta_rule(*args)
  out, state = chunked(*map(jnp.asarray, args))
  np.testing.assert_allclose(np.asarray(out), ref_out, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state), ref_state, atol=2e-5)


def test_chunked_prefill_then_recurrent_decode_equals_one_pass():
  args = random_inputs(2, t=23)
  full_out, full_state = chunked(*map(jnp.asarray, args), chunk_size=8)
  q, k, v, g, beta, s0 = map(jnp.asarray, args)
  out1, s = chunked(q[:, :15], k[:, :15], v[:, :15], g[:, :15],
                                         beta[:, :15], s0, chunk_size=8)
  outs = [out1]
  for t in range(15, 23):
    o, s = recurrent(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                                          g[:, t:t + 1], beta[:, t:t + 1], s)
    outs.append(o)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), np.asarray(full_out), atol=1e-5)
  np.testing.assert_allclose(np.asarray(s), np.asarray(full_state), atol=1e-5)


def test_identity_steps_leave_the_state_unchanged():
  q, k, v, g, beta, s0 = map(jnp.asarray, random_inputs(3, t=10))
  g, beta = g.at[:, 3:7].set(0.0), beta.at[:, 3:7].set(0.0)
  _, with_pads = chunked(q, k, v, g, beta, s0, chunk_size=4)
  keep = np.r_[0:3, 7:10]
  _, without = chunked(q[:, keep], k[:, keep], v[:, keep], g[:, keep],
                                            beta[:, keep], s0, chunk_size=4)
  np.testing.assert_allclose(np.asarray(with_pads), np.asarray(without), atol=1e-5)


def numpy_conv(x, valid, window, weight):
  """Each real input's output: the taps over it and the K-1 real inputs before it."""
  b, t, c = x.shape
  kw = weight.shape[-1]
  out = np.zeros((b, t, c))
  new_window = np.zeros(window.shape)
  for i in range(b):
    seq = list(window[i])
    for step in range(t):
      if valid[i, step]:
        seq.append(x[i, step])
        out[i, step] = sum(weight[:, m] * seq[len(seq) - kw + m] for m in range(kw))
    new_window[i] = np.asarray(seq[len(seq) - (kw - 1):])
  return out, new_window


def test_causal_conv_skips_padding_anywhere():
  rng = np.random.RandomState(4)
  b, t, c, kw = 3, 9, 5, 4
  x = rng.randn(b, t, c).astype(np.float32)
  window = rng.randn(b, kw - 1, c).astype(np.float32)
  weight = rng.randn(c, kw).astype(np.float32)
  valid = np.ones((b, t), bool)
  valid[1, :4] = False          # left padding
  valid[2, [0, 3, 4, 8]] = False  # holes, and only 5 real tokens
  out, new_window = causal_conv(jnp.asarray(x), jnp.asarray(valid), jnp.asarray(window),
                                    jnp.asarray(weight))
  ref, ref_window = numpy_conv(x, valid, window, weight)
  np.testing.assert_allclose(np.asarray(out)[valid], ref[valid], atol=1e-5)
  np.testing.assert_allclose(np.asarray(new_window), ref_window, atol=1e-6)
  # A row with fewer real tokens than the window keeps the older window inputs.
  few = np.zeros((1, t), bool)
  few[0, -1] = True
  _, w1 = causal_conv(jnp.asarray(x[:1]), jnp.asarray(few), jnp.asarray(window[:1]),
                          jnp.asarray(weight))
  np.testing.assert_allclose(np.asarray(w1)[0], np.concatenate([window[0, 1:], x[0, -1:]]))


def test_l2_normalize():
  x = jnp.asarray([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(np.asarray(gdn.l2_normalize(x)),
                             [[0.6, 0.8], [0.0, 0.0]], atol=1e-6)
