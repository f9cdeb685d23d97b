"""Gated DeltaNet: the linear-attention mixer of Qwen3.5, its two forms and its cache state.

The layer keeps, per value head, a matrix state ``S [Dk, Dv]`` updated once per token by the
gated delta rule (Yang et al. 2024, "Gated Delta Networks"):

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,      o_t = S_t^T q_t,

with decay ``a_t = exp(g_t)`` (``g_t <= 0``), write strength ``b_t in (0, 1)`` and L2-normalized
``q_t``, ``k_t``. Two exact forms of the same recurrence:

* :func:`chunked_gated_delta_rule` (prefill, training): chunks of ``C`` tokens. Inside a chunk
  the ``C`` rank-one updates are condensed by the WY/UT transform into one triangular solve
  and a few matmuls; a scan over chunks carries ``S``. Cost linear in the length.
* :func:`recurrent_gated_delta_rule` (decode): one token at a time, constant-size state.

Before the recurrence, ``q|k|v`` pass a depthwise causal convolution of width ``K`` over the
sequence (:func:`causal_conv`); its cache state is the last ``K - 1`` inputs.

Padding (``mask`` False) is an identity step everywhere: the convolution skips padded slots
(it convolves the real inputs in order, so a padded row equals the unpadded row wherever the
pads are) and a padded token has ``g = 0``, ``b = 0``, which leaves ``S`` unchanged.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from harnax import pytree
from harnax.models.layers import Linear
from harnax.models.layers import accum_dtype
from harnax.models.layers import normal_init

Array = jax.Array
L2_EPS = 1e-6  # inside the rsqrt of the q/k L2 norm, as the reference kernels


@pytree.container
class DeltaNetCache:
  """Decoding state of one Gated DeltaNet layer; its size does not grow with the context.

  Attributes:
    conv: [B, K-1, C] the last ``K - 1`` real inputs of the causal convolution (oldest first;
      zeros before the first token), in the parameter dtype.
    state: [B, Hv, Dk, Dv] the recurrent state ``S`` of every value head (float32, or
      float64 for a float64 model).
  """

  conv: Array
  state: Array


def l2_normalize(x: Array, eps: float = L2_EPS) -> Array:
  """``x / sqrt(sum(x^2) + eps)`` over the last axis."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


# ---------------------------------------------------------------------------------------------
# The delta rule, recurrent and chunked
# ---------------------------------------------------------------------------------------------
def recurrent_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array,
                               state: Array) -> tuple[Array, Array]:
  """The gated delta rule one token at a time.

  Args:
    q, k: [B, T, H, Dk] queries and keys (already normalized and scaled as wanted).
    v: [B, T, H, Dv] values.
    g: [B, T, H] log decay (``<= 0``); beta: [B, T, H] write strength.
    state: [B, H, Dk, Dv] initial state.

  Returns:
    (outputs [B, T, H, Dv], final state [B, H, Dk, Dv]), in the dtype of ``state``.
  """
  dt = state.dtype

  def step(s, xs):
    q_t, k_t, v_t, g_t, b_t = xs
    s = s * jnp.exp(g_t)[..., None, None]
    kv_mem = jnp.einsum("bhkv,bhk->bhv", s, k_t)
    delta = (v_t - kv_mem) * b_t[..., None]
    s = s + k_t[..., :, None] * delta[..., None, :]
    return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

  xs = tuple(jnp.moveaxis(x.astype(dt), 1, 0) for x in (q, k, v, g, beta))
  state, out = jax.lax.scan(step, state, xs)
  return jnp.moveaxis(out, 0, 1), state


def chunked_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array,
                             state: Array, *, chunk_size: int = 64) -> tuple[Array, Array]:
  """The gated delta rule in chunks of ``chunk_size`` tokens (WY/UT form); same arguments and
  results as :func:`recurrent_gated_delta_rule`.

  Inside a chunk, with ``G_i`` the cumulative log decay up to token ``i`` and
  ``A_ij = b_i k_i.k_j exp(G_i - G_j)`` for ``j < i``, the UT transform ``T = (I + A)^-1``
  gives the chunk's corrected values ``u = T (b v)`` and decayed keys
  ``w = T (b k exp(G))``; then, with the state ``S`` at the chunk start,

      v' = u - w S,   o = (q exp(G)) S + [(q k^T) exp(G_i - G_j)]_{j<=i} v',
      S <- exp(G_C) S + (k exp(G_C - G))^T v'.

  The length is padded to a multiple of the chunk with identity steps (``g = b = 0``).
  """
  dt = state.dtype
  b, t, h, dk = k.shape
  dv = v.shape[-1]
  c = chunk_size
  pad = (-t) % c
  if pad:
    widen = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    q, k, v, g, beta = map(widen, (q, k, v, g, beta))
  n = (t + pad) // c
  # [B, H, N, C, ...]
  split = lambda x: jnp.moveaxis(x.astype(dt).reshape((b, n, c) + x.shape[2:]), 3, 1)
  q, k, v, g, beta = map(split, (q, k, v, g, beta))
  cum = jnp.cumsum(g, axis=-1)                                       # [B, H, N, C]
  lower = jnp.tril(jnp.ones((c, c), bool))
  diff = cum[..., :, None] - cum[..., None, :]
  # Mask before the exponential: above the diagonal the difference is positive and may overflow.
  decay = jnp.where(lower, jnp.exp(jnp.where(lower, diff, 0.0)), 0.0)  # [B, H, N, C, C]
  kb = k * beta[..., None]
  strict = jnp.tril(jnp.ones((c, c), bool), -1)
  a = jnp.where(strict, jnp.einsum("...ik,...jk->...ij", kb, k) * decay, 0.0)
  eye = jnp.eye(c, dtype=dt)
  rhs = jnp.concatenate([v * beta[..., None], kb * jnp.exp(cum)[..., None]], axis=-1)
  solved = jax.lax.linalg.triangular_solve(eye + a, rhs, left_side=True, lower=True,
                                           unit_diagonal=True)
  u, w = solved[..., :dv], solved[..., dv:]
  intra = jnp.einsum("...ik,...jk->...ij", q, k) * decay
  q_dec = q * jnp.exp(cum)[..., None]
  last = cum[..., -1:]
  k_dec = k * jnp.exp(last - cum)[..., None]
  chunk_decay = jnp.exp(last)[..., None]                             # [B, H, N, 1, 1]

  def step(s, xs):
    u_i, w_i, q_i, k_i, intra_i, d_i = xs
    v_new = u_i - jnp.einsum("bhck,bhkv->bhcv", w_i, s)
    o = jnp.einsum("bhck,bhkv->bhcv", q_i, s) + jnp.einsum("bhcj,bhjv->bhcv", intra_i, v_new)
    s = s * d_i + jnp.einsum("bhck,bhcv->bhkv", k_i, v_new)
    return s, o

  xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u, w, q_dec, k_dec, intra, chunk_decay))
  state, out = jax.lax.scan(step, state, xs)                         # out [N, B, H, C, Dv]
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
  return out.transpose(0, 2, 1, 3), state


# ---------------------------------------------------------------------------------------------
# Causal depthwise convolution over the real tokens
# ---------------------------------------------------------------------------------------------
def causal_conv(x: Array, valid: Array, window: Array, weight: Array) -> tuple[Array, Array]:
  """Depthwise causal convolution of the real inputs, continuing from a window.

  Padded slots are skipped, not convolved as zeros: the real inputs are compacted in order
  (after the ``K - 1`` window inputs), convolved, and the outputs gathered back, so a padded
  row gives the unpadded row's numbers wherever the pads are.

  Args:
    x: [B, T, C] inputs; valid: [B, T] bool, real tokens.
    window: [B, K-1, C] the previous ``K - 1`` real inputs, oldest first (zeros at the start).
    weight: [C, K] filter taps (HF ``conv1d.weight [C, 1, K]`` without its middle axis); tap
      ``K - 1`` multiplies the current input.

  Returns:
    (outputs [B, T, C] (padded slots: meaningless finite values), the new window [B, K-1, C]).
  """
  b, t, ch = x.shape
  kw = weight.shape[-1]
  x = jnp.where(valid[..., None], x, 0).astype(window.dtype)
  xs = jnp.concatenate([window, x], axis=1)                            # [B, K-1+T, C]
  vs = jnp.concatenate([jnp.ones((b, kw - 1), bool), valid], axis=1)
  length = kw - 1 + t
  slots = jnp.arange(length)
  order = jnp.argsort(jnp.where(vs, slots, length + slots), axis=1)   # real slots first, in order
  xc = jnp.take_along_axis(xs, order[..., None], axis=1)
  acc = accum_dtype(x.dtype)
  w = weight.astype(acc)
  yc = sum(xc[:, m:m + t].astype(acc) * w[:, m] for m in range(kw))    # compacted slot K-1+i
  real_index = jnp.cumsum(valid, axis=1) - 1                           # [B, T]
  out = jnp.take_along_axis(yc, jnp.clip(real_index, 0)[..., None], axis=1)
  count = jnp.sum(valid, axis=1)                                       # real inputs after window
  new_window = jnp.take_along_axis(xc, (count[:, None] + jnp.arange(kw - 1))[..., None], axis=1)
  return out.astype(x.dtype), new_window


# ---------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------
class GatedRMSNorm(nnx.Module):
  """``w * rmsnorm(x) * silu(z)`` over the head dimension (HF ``linear_attn.norm``; plain
  ``w``, initialised to ones)."""

  def __init__(self, dim: int, *, eps: float, dtype):
    self.weight = nnx.Param(jnp.ones((dim,), dtype), axes=("norm",))
    self.eps = eps

  def __call__(self, x: Array, z: Array) -> Array:
    acc = accum_dtype(x.dtype)
    x32 = x.astype(acc)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    # The reference rounds to the input dtype before the weight, then gates in float32.
    y = self.weight[...] * normed.astype(x.dtype)
    return (y.astype(acc) * jax.nn.silu(z.astype(acc))).astype(x.dtype)


class GatedDeltaNet(nnx.Module):
  """Qwen3.5's linear-attention mixer (HF ``Qwen3_5GatedDeltaNet``), stateless like
  :class:`~harnax.models.layers.Attention`: the caller passes and receives the cache.

  Parameters (HF names under ``linear_attn.``): ``in_proj_qkv [2*Hk*Dk + Hv*Dv, hidden]``,
  ``in_proj_z [Hv*Dv, hidden]``, ``in_proj_b``/``in_proj_a [Hv, hidden]``,
  ``conv1d.weight [C, 1, K]``, ``dt_bias``/``A_log [Hv]``, ``norm.weight [Dv]``,
  ``out_proj [hidden, Hv*Dv]``. Value head ``h`` reads key head ``h // (Hv / Hk)``.
  """

  def __init__(self, cfg, *, dtype, rngs: nnx.Rngs):
    hidden = cfg.hidden_size
    self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    self.conv_kernel = cfg.linear_conv_kernel_dim
    self.chunk_size = cfg.linear_chunk_size
    key_dim = self.num_k_heads * self.head_k_dim
    value_dim = self.num_v_heads * self.head_v_dim
    self.conv_dim = 2 * key_dim + value_dim
    proj = lambda d_in, d_out, axes: Linear(d_in, d_out, axes=axes, dtype=dtype, rngs=rngs)
    # The q|k|v and z outputs are not split over devices: q, k and v are slices of one
    # projection and the convolution runs over all of them (FSDP shards the input side).
    self.in_proj_qkv = proj(hidden, self.conv_dim, ("embed", None))
    self.in_proj_z = proj(hidden, value_dim, ("embed", None))
    self.in_proj_b = proj(hidden, self.num_v_heads, ("embed", None))
    self.in_proj_a = proj(hidden, self.num_v_heads, ("embed", None))
    self.conv_weight = nnx.Param(normal_init(rngs, (self.conv_dim, 1, self.conv_kernel), dtype),
                                 axes=(None, None, None))
    self.dt_bias = nnx.Param(jnp.ones((self.num_v_heads,), dtype), axes=(None,))
    # A = exp(A_log) in [1, 16) at init, as the reference initialisation's range.
    a_init = jnp.log(jnp.linspace(1.0, 16.0, self.num_v_heads, dtype=jnp.float32))
    self.A_log = nnx.Param(a_init.astype(dtype), axes=(None,))
    self.norm = GatedRMSNorm(self.head_v_dim, eps=cfg.rms_norm_eps, dtype=dtype)
    self.out_proj = proj(value_dim, hidden, (None, "embed"))

  def init_cache(self, batch_size: int, *, dtype) -> DeltaNetCache:
    """Zero state (no tokens yet) for ``batch_size`` rows."""
    conv = jnp.zeros((batch_size, self.conv_kernel - 1, self.conv_dim), dtype)
    state = jnp.zeros((batch_size, self.num_v_heads, self.head_k_dim, self.head_v_dim),
                      accum_dtype(dtype))
    return DeltaNetCache(conv=conv, state=state)

  def __call__(self, x: Array, mask: Array, cache: DeltaNetCache | None = None
               ) -> tuple[Array, DeltaNetCache]:
    """[B, T, hidden] (and its mask [B, T]) -> ([B, T, hidden], the state after the tokens).

    Without ``cache`` the state starts at zero. One token per row (T == 1) runs the recurrent
    form, longer inputs the chunked form; both are exact.
    """
    b, t, _ = x.shape
    acc = accum_dtype(x.dtype)
    if cache is None:
      cache = self.init_cache(b, dtype=x.dtype)
    x = jnp.where(mask[..., None], x, 0).astype(x.dtype)
    qkv = self.in_proj_qkv(x)
    z = self.in_proj_z(x).reshape(b, t, self.num_v_heads, self.head_v_dim)
    beta = jax.nn.sigmoid(self.in_proj_b(x).astype(acc))
    a = self.in_proj_a(x).astype(acc)
    conv, window = causal_conv(qkv, mask, cache.conv, self.conv_weight[...][:, 0, :])
    conv = jax.nn.silu(conv.astype(acc))
    kd = self.num_k_heads * self.head_k_dim
    q = conv[..., :kd].reshape(b, t, self.num_k_heads, self.head_k_dim)
    k = conv[..., kd:2 * kd].reshape(b, t, self.num_k_heads, self.head_k_dim)
    v = conv[..., 2 * kd:].reshape(b, t, self.num_v_heads, self.head_v_dim)
    g = -jnp.exp(self.A_log[...].astype(acc)) * jax.nn.softplus(a + self.dt_bias[...].astype(acc))
    # Padding is an identity step of the recurrence: no decay, no write.
    g = jnp.where(mask[..., None], g, 0.0)
    beta = jnp.where(mask[..., None], beta, 0.0)
    q = l2_normalize(q) * self.head_k_dim ** -0.5
    k = l2_normalize(k)
    rep = self.num_v_heads // self.num_k_heads
    if rep > 1:
      q, k = jnp.repeat(q, rep, axis=2), jnp.repeat(k, rep, axis=2)
    if t == 1:
      out, state = recurrent_gated_delta_rule(q, k, v, g, beta, cache.state)
    else:
      out, state = chunked_gated_delta_rule(q, k, v, g, beta, cache.state,
                                            chunk_size=self.chunk_size)
    out = self.norm(out.astype(x.dtype), z)
    return self.out_proj(out.reshape(b, t, -1)), DeltaNetCache(conv=window, state=state)
