"""Layers shared by every model family: RMSNorm, RoPE, attention, gated MLP, routed MoE.

Each layer is a thin NNX module around a pure function that does the math, so the math can be
tested and reused (e.g. by a later linear-attention layer) without the module. Parameters keep
Hugging Face semantics and layout (the checkpoint mapping is a renaming): linear kernels are
stored ``[out, in]`` like ``nn.Linear.weight``, which XLA's CPU matmuls also read fastest
(10-20 % over ``[in, out]`` for decode-sized inputs, measured); norm weights as in the checkpoint
(Gemma's ``1 + w`` is applied in the forward pass, never folded in).

Every ``nnx.Param`` carries ``axes``: its logical axis names, read by ``harnax.parallel``.
Norms, softmaxes and RoPE angles are computed in float32 whatever the parameter dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from harnax.models.config import RopeConfig
from harnax.parallel import constrain

Array = jax.Array
_INIT_STD = 0.02


def _normal(rngs: nnx.Rngs, shape, dtype) -> Array:
  return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------
def rms_norm(x: Array, weight: Array, *, eps: float, style: str) -> Array:
  """Root-mean-square norm over the last axis, computed in float32.

  Args:
    x: [..., D] activations (any float dtype; the result has the same dtype).
    weight: [D] scale.
    eps: added to the mean square before the reciprocal square root.
    style: ``"scale"`` multiplies by ``w`` (Qwen/Llama); ``"one_plus_scale"`` by ``1 + w``
      (Gemma, whose weights are stored zero-centred).
  """
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  w = weight.astype(jnp.float32)
  scale = 1.0 + w if style == "one_plus_scale" else w
  return (normed * scale).astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm with one weight vector ``[dim]`` (HF ``*.weight``)."""

  def __init__(self, dim: int, *, eps: float, style: str, dtype=jnp.float32):
    init = jnp.zeros if style == "one_plus_scale" else jnp.ones  # both mean "identity"
    self.weight = nnx.Param(init((dim,), dtype), axes=("norm",))
    self.eps = eps
    self.style = style

  def __call__(self, x: Array) -> Array:
    return rms_norm(x, self.weight[...], eps=self.eps, style=self.style)


# ---------------------------------------------------------------------------------------------
# Linear / embedding
# ---------------------------------------------------------------------------------------------
class Linear(nnx.Module):
  """``y = x @ kernel.T (+ bias)``; ``kernel`` is ``[out, in]`` (the HF ``nn.Linear`` weight).

  ``axes`` names the (input, output) axes; the kernel's own axes are their reverse.
  """

  def __init__(self, d_in: int, d_out: int, *, axes: tuple[str, str], use_bias: bool = False,
               dtype=jnp.float32, rngs: nnx.Rngs):
    self.kernel = nnx.Param(_normal(rngs, (d_out, d_in), dtype), axes=(axes[1], axes[0]))
    self.bias = nnx.Param(jnp.zeros((d_out,), dtype), axes=(axes[1],)) if use_bias else None

  def __call__(self, x: Array) -> Array:
    y = jnp.einsum("...i,oi->...o", x, self.kernel[...])
    if self.bias is not None:
      y = y + self.bias[...]
    return y


class Embed(nnx.Module):
  """Token embedding table ``[vocab, hidden]`` (HF ``embed_tokens.weight``)."""

  def __init__(self, vocab: int, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.embedding = nnx.Param(_normal(rngs, (vocab, dim), dtype), axes=("vocab", "embed"))

  def __call__(self, ids: Array) -> Array:
    return jnp.take(self.embedding[...], ids, axis=0)

  def attend(self, x: Array) -> Array:
    """Tied output projection: ``x @ embedding.T`` with float32 accumulation -> [..., vocab]."""
    return jnp.einsum("...d,vd->...v", x, self.embedding[...], preferred_element_type=jnp.float32)


# ---------------------------------------------------------------------------------------------
# Rotary position embeddings
# ---------------------------------------------------------------------------------------------
def rope_frequencies(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
  """Inverse frequencies ``[head_dim // 2]`` and the cos/sin multiplier of a RoPE variant.

  Implements HF ``rope_type`` semantics: ``default``; ``linear`` (positions divided by
  ``factor``); ``llama3`` (wavelength-dependent interpolation between ``low_freq_factor`` and
  ``high_freq_factor``); ``yarn`` (NTK-by-parts ramp between ``beta_fast``/``beta_slow``
  rotations, with ``attention_factor`` scaling cos and sin).
  """
  dim = head_dim
  exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
  inv_freq = 1.0 / (rope.theta ** exponents)
  scaling = 1.0
  if rope.rope_type == "linear":
    inv_freq = inv_freq / rope.factor
  elif rope.rope_type == "llama3":
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor -
                                                           rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv_freq = np.where(medium, smoothed, scaled)
  elif rope.rope_type == "yarn":
    inv_freq, scaling = _yarn(rope, dim)
  return inv_freq.astype(np.float32), float(scaling)


def _yarn(rope: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
  factor, base = rope.factor, rope.theta
  old_len = rope.original_max_position_embeddings

  def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  if rope.attention_factor is not None:
    attention_factor = rope.attention_factor
  elif rope.mscale and rope.mscale_all_dim:
    attention_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
  else:
    attention_factor = mscale(factor)
  beta_fast = rope.beta_fast or 32
  beta_slow = rope.beta_slow or 1

  def correction_dim(rotations):
    return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if rope.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # avoid a zero-width ramp
  ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
  extrapolation_weight = 1 - ramp
  pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
  inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1 / pos_freqs) * extrapolation_weight
  return inv_freq, attention_factor


def rope_cos_sin(positions: Array, inv_freq: np.ndarray, scaling: float) -> tuple[Array, Array]:
  """cos and sin tables ``[B, T, head_dim]`` (float32) for integer ``positions [B, T]``."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles) * scaling, jnp.sin(angles) * scaling


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotates ``x [B, T, heads, head_dim]`` (half-split pairing, as HF ``rotate_half``)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------
def attention_mask(q_pos: Array, k_pos: Array, k_valid: Array, *, window: int | None) -> Array:
  """Boolean mask ``[B, T, S]``: query t may attend key s.

  Causality and the sliding window are decided on *positions* (not array slots), so left
  padding, right padding after a completion and a partly filled KV cache all work the same.

  Args:
    q_pos: [B, T] positions of the queries.
    k_pos: [B, S] positions of the keys.
    k_valid: [B, S] whether key s is a real token (not padding / an empty cache slot).
    window: if set, a key is visible only when ``q_pos - k_pos < window`` (HF semantics).
  """
  diff = q_pos[:, :, None] - k_pos[:, None, :]
  mask = (diff >= 0) & k_valid[:, None, :]
  if window is not None:
    mask &= diff < window
  return mask


def attend(q: Array, k: Array, v: Array, mask: Array, *, scale: float,
           softcap: float | None = None) -> Array:
  """Grouped-query softmax attention.

  Args:
    q: [B, T, H, D] queries.
    k, v: [B, K, S, D] keys and values, heads-major (the KV cache's layout, so attending
      over the cache needs no transpose of it), with K dividing H (query head h uses kv
      head h // (H/K)).
    mask: [B, T, S] boolean.
    scale: multiplier of q·k.
    softcap: if set, logits become ``softcap * tanh(logits / softcap)`` before masking.

  Returns:
    [B, T, H, D]. A query with no visible key (a padding slot) gets the mean of the values,
    never NaN.
  """
  b, t, h, d = q.shape
  kv_heads, s = k.shape[1], k.shape[2]
  g = h // kv_heads
  n = b * kv_heads
  # One merged (batch, kv head) axis n for both matmuls: the KV cache is stored as [n, S, D]
  # (see model.AttentionCache), so attending over it is a plain batched matmul on the stored
  # buffer, with no reshape between the cache update and the matmul.
  qn = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4).reshape(n, g * t, d)
  kn, vn = k.reshape(n, s, d), v.reshape(n, s, d)
  logits = jnp.einsum("nqd,nsd->nqs", qn, kn, preferred_element_type=jnp.float32) * scale
  if softcap is not None:
    logits = softcap * jnp.tanh(logits / softcap)
  mask = jnp.broadcast_to(mask[:, None, None], (b, kv_heads, g, t, s)).reshape(n, g * t, s)
  # A finite floor rather than -inf keeps fully masked rows (padding queries) NaN-free.
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum("nqs,nsd->nqd", probs, vn)
  return out.reshape(b, kv_heads, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class Attention(nnx.Module):
  """Multi-head attention with GQA, optional q/k RMSNorm, sliding window and logit soft-cap.

  The layer is stateless: the caller passes keys/values to attend over (the cache logic lives
  in the model), so a different mixer (e.g. linear attention) can replace it per layer type.
  """

  def __init__(self, cfg, layer_type: str, *, dtype, rngs: nnx.Rngs):
    h, kv, d, hidden = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    bias = cfg.attention_bias
    self.q_proj = Linear(hidden, h * d, axes=("embed", "q_heads"), use_bias=bias, dtype=dtype, rngs=rngs)
    self.k_proj = Linear(hidden, kv * d, axes=("embed", "kv_heads"), use_bias=bias, dtype=dtype, rngs=rngs)
    self.v_proj = Linear(hidden, kv * d, axes=("embed", "kv_heads"), use_bias=bias, dtype=dtype, rngs=rngs)
    self.o_proj = Linear(h * d, hidden, axes=("q_heads", "embed"), use_bias=bias, dtype=dtype, rngs=rngs)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
      self.k_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
    self.scale = cfg.attention_scale
    self.softcap = cfg.attn_logit_softcapping
    self.window = cfg.window_for(layer_type)
    inv_freq, self.rope_scaling = rope_frequencies(cfg.rope_for(layer_type), d)
    self.inv_freq = tuple(float(f) for f in inv_freq)  # static, hashable

  def project_qkv(self, x: Array, positions: Array) -> tuple[Array, Array, Array]:
    """[B, T, hidden] -> rotated q [B, T, H, D], rotated k and v [B, K, T, D] (heads-major)."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = rope_cos_sin(positions, np.asarray(self.inv_freq, np.float32), self.rope_scaling)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q = constrain(q, ("batch", "seq", "act_heads", None))
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

  def attend_and_project(self, q: Array, k: Array, v: Array, q_pos: Array, k_pos: Array,
                         k_valid: Array) -> Array:
    """Attention over keys/values [B, K, S, D], then the output projection -> [B, T, hidden]."""
    mask = attention_mask(q_pos, k_pos, k_valid, window=self.window)
    out = attend(q, k, v, mask, scale=self.scale, softcap=self.softcap)
    b, t = out.shape[:2]
    return self.o_proj(out.reshape(b, t, -1))


# ---------------------------------------------------------------------------------------------
# Feed-forward: gated MLP and routed mixture of experts
# ---------------------------------------------------------------------------------------------
def activation(name: str):
  if name == "silu":
    return jax.nn.silu
  if name == "gelu_pytorch_tanh":
    return lambda x: jax.nn.gelu(x, approximate=True)
  raise ValueError(f"activation: expected 'silu' or 'gelu_pytorch_tanh', got {name!r}")


class GatedMLP(nnx.Module):
  """``down(act(gate(x)) * up(x))`` (HF ``gate_proj``/``up_proj``/``down_proj``)."""

  def __init__(self, hidden: int, intermediate: int, *, act: str, dtype, rngs: nnx.Rngs):
    self.gate_proj = Linear(hidden, intermediate, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
    self.up_proj = Linear(hidden, intermediate, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
    self.down_proj = Linear(intermediate, hidden, axes=("mlp", "embed"), dtype=dtype, rngs=rngs)
    self.act = act

  def __call__(self, x: Array) -> Array:
    h = activation(self.act)(self.gate_proj(x)) * self.up_proj(x)
    h = constrain(h, ("batch", "seq", "act_mlp"))
    return self.down_proj(h)


def route_top_k(router_logits: Array, k: int, *, normalize: bool) -> tuple[Array, Array]:
  """Qwen3-MoE routing: softmax over all experts (float32), keep the top k.

  Args:
    router_logits: [N, E].
    k: experts per token.
    normalize: ``norm_topk_prob``: renormalize the k kept probabilities to sum to one.

  Returns:
    weights [N, k] float32 and expert indices [N, k] int32.
  """
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if normalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


# Grouped matmul against [E, out, in] weights: row block g of lhs [M, in] times rhs[g].T.
_GROUPED_DIMS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])


def _grouped_matmul(lhs: Array, rhs: Array, group_sizes: Array) -> Array:
  return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, _GROUPED_DIMS)


def experts_ragged(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, act) -> Array:
  """Routed expert MLPs computed only for the chosen (token, expert) pairs.

  Sorts the N*k assignments by expert and runs one grouped matmul per projection
  (``lax.ragged_dot_general``), so the cost is k expert MLPs per token, not E.

  Args:
    x: [N, hidden]; weights: [N, k]; experts: [N, k] int.
    gate, up: [E, I, hidden]; down: [E, hidden, I] (per expert, the HF ``[out, in]`` layout).
  Returns:
    [N, hidden]: sum over the k chosen experts of weight * expert_mlp(x).
  """
  n, k = experts.shape
  num_experts = gate.shape[0]
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  token = order // k
  xs = jnp.take(x, token, axis=0)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  h = act(_grouped_matmul(xs, gate, sizes)) * _grouped_matmul(xs, up, sizes)
  y = _grouped_matmul(h, down, sizes)
  y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
  return jnp.zeros_like(x).at[token].add(y)


def _expert_mlp(x: Array, gate: Array, up: Array, down: Array, act) -> Array:
  """One expert's gated MLP on rows ``x [M, hidden]``; weights ``[out, in]``."""
  h = act(jnp.einsum("mh,ih->mi", x, gate)) * jnp.einsum("mh,ih->mi", x, up)
  return jnp.einsum("mi,hi->mh", h, down)


def experts_sorted(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, act, *, capacity: int | None = None, block: int = 64) -> Array:
  """Same result as :func:`experts_ragged`, as a sort-by-expert grouped matmul without
  ``ragged_dot``: the CPU path for long inputs, where ``ragged_dot`` lowers to a slow loop.

  The N*k assignments are sorted by expert. The first ``capacity`` rows of every expert's
  segment go to a slot ``[E, capacity]`` and all experts run as one batched matmul (no
  per-expert weight copies); the rows beyond (an expert routed more than ``capacity``
  tokens) run in a loop over experts in chunks of ``block`` rows, skipped by ``lax.cond``
  for experts that fit; an overflowing expert's weights are indexed (on CPU: copied) once,
  not once per chunk. Nothing is dropped, so the result is exact; the cost is about
  ``E * capacity`` rows plus the overflow. Static trip counts keep it reverse-differentiable.

  Args:
    x: [N, hidden]; weights: [N, k]; experts: [N, k] int.
    gate, up: [E, I, hidden]; down: [E, hidden, I].
    capacity: slots per expert; by default 1.25 times the mean segment length N*k/E rounded
      up to a multiple of 8 (measured fastest among 1.0, 1.25, 1.5 for a 512-token prefill of
      a 16-expert, top-4 model), at most N (an expert receives each token at most once).
    block: rows per overflow chunk (64 measured faster than 32 and 256, like 128, on the
      benchmark's 512-token prefill, whose random router overflows 1.25x capacity by 30-450
      rows per layer).
  Returns:
    [N, hidden].
  """
  n, k = experts.shape
  num_experts, hidden = gate.shape[0], gate.shape[2]
  m = n * k
  if capacity is None:
    capacity = -(-int(math.ceil(1.25 * m / num_experts)) // 8) * 8
  capacity = max(1, min(capacity, n))
  block = max(1, min(block, n))
  slots = num_experts * capacity

  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sorted_experts = flat[order]
  token = order // k
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  starts = jnp.cumsum(sizes) - sizes
  rank = jnp.arange(m, dtype=jnp.int32) - starts[sorted_experts]  # position in its segment
  # Overflow rows are parked in one extra slot that is dropped.
  slot = jnp.where(rank < capacity, sorted_experts * capacity + rank, slots)
  xs = jnp.take(x, token, axis=0)  # [m, hidden], sorted by expert
  x_slots = jnp.zeros((slots + 1, hidden), x.dtype).at[slot].set(xs)[:slots]
  x_slots = x_slots.reshape(num_experts, capacity, hidden)
  h = act(jnp.einsum("ech,eih->eci", x_slots, gate)) * jnp.einsum("ech,eih->eci", x_slots, up)
  y_slots = jnp.einsum("eci,ehi->ech", h, down).reshape(slots, hidden)
  ys = jnp.take(y_slots, jnp.minimum(slot, slots - 1), axis=0)  # overflow rows: filled below

  max_chunks = -(-(n - capacity) // block)
  if max_chunks > 0:
    pad = jnp.zeros((block, hidden), x.dtype)  # the last chunk may run past the end
    xs, ys = jnp.concatenate([xs, pad]), jnp.concatenate([ys, pad])

    def per_expert(e, ys):
      overflow = sizes[e] - capacity

      def expert_overflow(ys):
        # Indexing a stacked weight copies it (on CPU): once per overflowing expert, not
        # once per chunk.
        ge, ue, de = gate[e], up[e], down[e]

        def chunk(j, ys):
          def compute(ys):
            row = starts[e] + capacity + j * block
            xc = jax.lax.dynamic_slice_in_dim(xs, row, block)
            yc = _expert_mlp(xc, ge, ue, de, act)
            # Rows past this segment belong to other experts: keep them.
            mine = (j * block + jnp.arange(block)) < overflow
            old = jax.lax.dynamic_slice_in_dim(ys, row, block)
            return jax.lax.dynamic_update_slice_in_dim(
                ys, jnp.where(mine[:, None], yc.astype(ys.dtype), old), row, 0)
          return jax.lax.cond(j * block < overflow, compute, lambda ys: ys, ys)

        return jax.lax.fori_loop(0, max_chunks, chunk, ys)

      return jax.lax.cond(overflow > 0, expert_overflow, lambda ys: ys, ys)

    ys = jax.lax.fori_loop(0, num_experts, per_expert, ys)[:m]

  # Unsort by a scatter of the permutation (cheaper than a second argsort).
  inverse = jnp.zeros((m,), jnp.int32).at[order].set(jnp.arange(m, dtype=jnp.int32))
  y = jnp.take(ys, inverse, axis=0).reshape(n, k, hidden)
  return jnp.einsum("nkh,nk->nh", y, weights.astype(y.dtype))


def experts_dense(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                  down: Array, act) -> Array:
  """Same result as :func:`experts_ragged`, computing every expert on every token.

  E/k times the FLOPs, but only batched einsums over the expert axis: the layout that shards
  trivially over experts, and on CPU the fastest choice for a few tokens (a batch of decode
  steps), where all experts' weights are read anyway. The matmuls are batched over a leading
  expert axis with the weights as the left operand (``W @ x.T``, tokens as the short minor
  dimension): on CPU about 25 % faster for 8 tokens than ``x @ W.T``, measured.
  """
  num_experts = gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32) * weights[..., None],
                    axis=1)  # [N, E]
  xt = jnp.broadcast_to(x.T[None], (num_experts,) + x.T.shape)  # [E, hidden, N]
  h = act(jnp.einsum("eih,ehn->ein", gate, xt)) * jnp.einsum("eih,ehn->ein", up, xt)
  y = jnp.einsum("ehi,ein->ehn", down, h)
  return jnp.einsum("ehn,ne->nh", y, combine.astype(y.dtype))


def experts_gather(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, act) -> Array:
  """Same result as :func:`experts_ragged`, gathering the routed experts' weights.

  The N*k routed experts' weights are gathered once per projection (``[N*k, out, in]``) and
  every assignment runs as one batched matrix-vector product. It reads only the routed
  experts, so it is the memory-bound choice for decoding a few tokens. On CPU a gather (or
  dynamic slice) of weights is a copy, so its cost grows with N*k: past about E assignments,
  :func:`experts_dense` reads less.
  """
  n, k = experts.shape
  flat = experts.reshape(-1)
  xs = jnp.repeat(x, k, axis=0)  # [N*k, hidden]: assignment j belongs to token j // k
  h = (act(jnp.einsum("aih,ah->ai", jnp.take(gate, flat, axis=0), xs))
       * jnp.einsum("aih,ah->ai", jnp.take(up, flat, axis=0), xs))
  y = jnp.einsum("ahi,ai->ah", jnp.take(down, flat, axis=0), h)
  y = y * weights.reshape(-1, 1).astype(y.dtype)
  return jnp.sum(y.reshape(n, k, -1), axis=1)


MOE_IMPLS = {"ragged": experts_ragged, "sorted": experts_sorted, "dense": experts_dense,
             "gather": experts_gather}


def choose_moe_impl(impl: str, num_tokens: int, k: int, num_experts: int) -> str:
  """Resolves ``"auto"``: grouped matmuls (``ragged``) on accelerators. On CPU, where
  ``ragged_dot`` lowers poorly, by the number of (token, expert) assignments N*k (crossovers
  measured on a 16-expert, top-4 model like the one in ``benchmarks/lm_throughput.py``):
  ``gather`` below E (a few decoded tokens read only their experts' weights), ``dense`` up to
  8E (a batch of decoded tokens touches most experts anyway, and batched matmuls beat the
  sorted loop's per-chunk overhead), ``sorted`` beyond (prefill)."""
  if impl != "auto":
    return impl
  if jax.default_backend() != "cpu":
    return "ragged"
  assignments = num_tokens * k
  if assignments < num_experts:
    return "gather"
  return "dense" if assignments <= 8 * num_experts else "sorted"


class MoE(nnx.Module):
  """Top-k routed experts with Qwen3-MoE semantics (no shared expert).

  Parameters: ``router [E, hidden]`` (HF ``mlp.gate.weight``) and per-expert projections
  stacked on a leading expert axis, each in the HF ``[out, in]`` layout
  (HF ``mlp.experts.{e}.*_proj.weight``): gate and up ``[E, I, hidden]``, down ``[E, hidden, I]``.
  """

  def __init__(self, cfg, *, dtype, rngs: nnx.Rngs, impl: str = "auto"):
    if impl != "auto" and impl not in MOE_IMPLS:
      raise ValueError(f"moe_impl: expected 'auto' or one of {sorted(MOE_IMPLS)}, got {impl!r}")
    e, hdim, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    self.router = nnx.Param(_normal(rngs, (e, hdim), dtype), axes=(None, "embed"))
    self.gate_proj = nnx.Param(_normal(rngs, (e, i, hdim), dtype), axes=("experts", "mlp", "embed"))
    self.up_proj = nnx.Param(_normal(rngs, (e, i, hdim), dtype), axes=("experts", "mlp", "embed"))
    self.down_proj = nnx.Param(_normal(rngs, (e, hdim, i), dtype), axes=("experts", "embed", "mlp"))
    self.k = cfg.num_experts_per_tok
    self.normalize = cfg.norm_topk_prob
    self.act = cfg.activation
    self.impl = impl

  def __call__(self, x: Array) -> Array:
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    router_logits = jnp.einsum("nh,eh->ne", flat, self.router[...])
    weights, experts = route_top_k(router_logits, self.k, normalize=self.normalize)
    fn = MOE_IMPLS[choose_moe_impl(self.impl, flat.shape[0], self.k, self.gate_proj.shape[0])]
    out = fn(flat, weights, experts, self.gate_proj[...], self.up_proj[...], self.down_proj[...],
             activation(self.act))
    return out.reshape(shape)
