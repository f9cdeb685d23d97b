"""Layers shared by every model family: RMSNorm, RoPE, attention, gated MLP, embeddings.

Each layer is a thin NNX module around a pure function that does the math, so the math can be
tested and reused (e.g. by a later linear-attention layer) without the module. Parameters keep
Hugging Face semantics and layout (the checkpoint mapping is a renaming): linear kernels are
stored ``[out, in]`` like ``nn.Linear.weight``, which is also the layout XLA's CPU matmuls read
fastest (docs/models.md); norm weights as in the checkpoint (Gemma's ``1 + w`` is applied in the
forward pass, never folded in). The routed mixture of experts lives in
:mod:`harnax.models.moe`.

Every ``nnx.Param`` carries ``axes``: its logical axis names, read by ``harnax.parallel``.
Norms, softmaxes and RoPE angles are computed in float32 whatever the parameter dtype (float64
for float64 parameters: `accum_dtype`).
"""

from __future__ import annotations

import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax.models.config import RopeConfig
from harnax.parallel import constrain

Array = jax.Array
_INIT_STD = 0.02


def accum_dtype(dtype) -> jnp.dtype:
  """float32 for float32 and narrower (bfloat16) parameters, float64 for float64 ones: the
  precision of norms, softmaxes, RoPE angles and logits, so a float64 model (gradient
  checks) is float64 throughout."""
  return jnp.promote_types(dtype, jnp.float32)


def normal_init(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> Array:
  """Random parameter of ``shape``: normal with standard deviation 0.02, drawn in float32 and
  cast to ``dtype`` (so a bfloat16 model draws the same numbers as a float32 one)."""
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
  acc = accum_dtype(x.dtype)
  x32 = x.astype(acc)
  normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  w = weight.astype(acc)
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
    self.kernel = nnx.Param(normal_init(rngs, (d_out, d_in), dtype), axes=(axes[1], axes[0]))
    self.bias = nnx.Param(jnp.zeros((d_out,), dtype), axes=(axes[1],)) if use_bias else None

  def __call__(self, x: Array) -> Array:
    y = jnp.einsum("...i,oi->...o", x, self.kernel[...])
    if self.bias is not None:
      y = y + self.bias[...]
    return y


class Embed(nnx.Module):
  """Token embedding table ``[vocab, hidden]`` (HF ``embed_tokens.weight``)."""

  def __init__(self, vocab: int, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.embedding = nnx.Param(normal_init(rngs, (vocab, dim), dtype), axes=("vocab", "embed"))

  def __call__(self, ids: Array) -> Array:
    return jnp.take(self.embedding[...], ids, axis=0)

  def attend(self, x: Array) -> Array:
    """Tied output projection: ``x @ embedding.T`` with float32 accumulation -> [..., vocab]."""
    emb = self.embedding[...]
    return jnp.einsum("...d,vd->...v", x, emb, preferred_element_type=accum_dtype(emb.dtype))


# ---------------------------------------------------------------------------------------------
# Rotary position embeddings
# ---------------------------------------------------------------------------------------------
def rope_frequencies(rope: RopeConfig, *, head_dim: int) -> tuple[np.ndarray, float]:
  """Inverse frequencies ``[head_dim // 2]`` and the cos/sin multiplier of a RoPE variant.

  Implements HF ``rope_type`` semantics: ``default``; ``linear`` (positions divided by
  ``factor``); ``llama3`` (wavelength-dependent interpolation between ``low_freq_factor`` and
  ``high_freq_factor``); ``yarn`` (NTK-by-parts ramp between ``beta_fast``/``beta_slow``
  rotations, with ``attention_factor`` scaling cos and sin); ``proportional`` (the first
  ``partial_rotary_factor`` of the frequencies, the rest zero, all divided by ``factor``).
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
  elif rope.rope_type == "proportional":
    # Gemma 4: exponents over the full head_dim, only the first `angles` frequencies kept; the
    # zero frequencies leave their dimension pairs unrotated (cos 1, sin 0).
    prf = 1.0 if rope.partial_rotary_factor is None else rope.partial_rotary_factor
    angles = int(prf * dim // 2)
    inv_freq = np.where(np.arange(dim // 2) < angles, inv_freq, 0.0) / (rope.factor or 1.0)
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
  inv_freq = ((1 / (factor * pos_freqs)) * (1 - extrapolation_weight)
              + (1 / pos_freqs) * extrapolation_weight)
  return inv_freq, attention_factor


def rope_cos_sin(positions: Array, inv_freq: np.ndarray, *, scaling: float,
                 dtype=jnp.float32) -> tuple[Array, Array]:
  """cos and sin tables ``[B, T, head_dim]`` (``dtype``, float32 by default) for integer
  ``positions [B, T]``."""
  angles = positions.astype(dtype)[..., None] * jnp.asarray(inv_freq, dtype)[None, None, :]
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
  acc = accum_dtype(q.dtype)
  logits = jnp.einsum("nqd,nsd->nqs", qn, kn, preferred_element_type=acc) * scale
  if softcap is not None:
    logits = softcap * jnp.tanh(logits / softcap)
  mask = jnp.broadcast_to(mask[:, None, None], (b, kv_heads, g, t, s)).reshape(n, g * t, s)
  # A finite floor rather than -inf keeps fully masked rows (padding queries) NaN-free.
  logits = jnp.where(mask, logits, jnp.finfo(acc).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum("nqs,nsd->nqd", probs, vn)
  return out.reshape(b, kv_heads, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def attend_blocks(q: Array, blocks, *, scale: float, softcap: float | None = None) -> Array:
  """Grouped-query attention over several blocks of keys, in one softmax.

  The keys of a query are the union of the blocks, each with its own mask: a tree of
  continuations packed after a prompt attends over the prompt block (all of it) and the tree
  block (its ancestors only), so the prompt slots never compute the always-masked block of
  the tree, and the joint softmax is written out without concatenating the logits.

  Args:
    q: [B, T, H, D] queries.
    blocks: a sequence of ``(k, v, mask)``: keys and values [B, K, S_i, D] (heads-major, as
      `attend`) and a boolean mask [B, T, S_i].
    scale, softcap: as `attend`.

  Returns:
    [B, T, H, D], equal to `attend` over the concatenated blocks. A query with nothing
    visible gets a finite mean of the values, never NaN.
  """
  b, t, h, d = q.shape
  kv_heads = blocks[0][0].shape[1]
  g = h // kv_heads
  acc = accum_dtype(q.dtype)
  floor = jnp.finfo(acc).min
  # [B, K, G*T, D]: (batch, kv head) are the matmuls' batch dimensions, as in `attend`.
  qk = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, d)
  logits = []
  for k, _, mask in blocks:
    x = jnp.einsum("bkqd,bksd->bkqs", qk, k, preferred_element_type=acc) * scale
    if softcap is not None:
      x = softcap * jnp.tanh(x / softcap)
    m = jnp.broadcast_to(mask[:, None, None], (b, kv_heads, g) + mask.shape[1:])
    logits.append(jnp.where(m.reshape(b, kv_heads, g * t, -1), x, floor))
  # The shift cancels exactly: no gradient flows through it (nor the cost of one).
  top = jax.lax.stop_gradient(
      functools.reduce(jnp.maximum, [jnp.max(x, -1, keepdims=True) for x in logits]))
  exps = [jnp.exp(x - top) for x in logits]
  denom = functools.reduce(jnp.add, [jnp.sum(e, -1, keepdims=True) for e in exps])
  # Normalized after the value matmuls: D divisions per query instead of one per key.
  out = functools.reduce(jnp.add, [
      jnp.einsum("bkqs,bksd->bkqd", e.astype(v.dtype), v, preferred_element_type=acc)
      for e, (_, v, _) in zip(exps, blocks)])
  out = (out / denom).astype(q.dtype)
  return out.reshape(b, kv_heads, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class Attention(nnx.Module):
  """Multi-head attention with GQA, optional q/k RMSNorm, sliding window and logit soft-cap.

  The layer is stateless: the caller passes keys/values to attend over (the cache logic lives
  in the model), so a different mixer (e.g. linear attention) can replace it per layer type.
  """

  def __init__(self, cfg, layer_type: str, *, dtype, rngs: nnx.Rngs):
    h, kv, d, hidden = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    bias = cfg.attention_bias
    proj = lambda d_in, d_out, axes: Linear(d_in, d_out, axes=axes, use_bias=bias, dtype=dtype,
                                            rngs=rngs)
    self.q_proj = proj(hidden, h * d, ("embed", "q_heads"))
    self.k_proj = proj(hidden, kv * d, ("embed", "kv_heads"))
    self.v_proj = proj(hidden, kv * d, ("embed", "kv_heads"))
    self.o_proj = proj(h * d, hidden, ("q_heads", "embed"))
    if cfg.qk_norm:
      self.q_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
      self.k_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
    self.scale = cfg.attention_scale
    self.softcap = cfg.attn_logit_softcapping
    self.window = cfg.window_for(layer_type)
    inv_freq, self.rope_scaling = rope_frequencies(cfg.rope_for(layer_type), head_dim=d)
    self.inv_freq = tuple(float(f) for f in inv_freq)  # static, hashable

  def project_qkv(self, x: Array, positions: Array) -> tuple[Array, Array, Array]:
    """[B, T, hidden] -> rotated q [B, T, H, D], rotated k and v [B, K, T, D] (heads-major)."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    acc = accum_dtype(x.dtype)
    cos, sin = rope_cos_sin(positions, np.asarray(self.inv_freq, acc), scaling=self.rope_scaling,
                            dtype=acc)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q = constrain(q, ("batch", "seq", "act_heads", None))
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

  def attend_and_project(self, q: Array, k: Array, v: Array, q_pos: Array, k_pos: Array,
                         k_valid: Array, pair_mask: Array | None = None) -> Array:
    """Attention over keys/values [B, K, S, D], then the output projection -> [B, T, hidden].

    ``pair_mask`` [B, T, S], when given, further restricts which key each query sees (e.g. a
    tree of continuations packed after one prompt, each seeing only its own ancestors)."""
    mask = attention_mask(q_pos, k_pos, k_valid, window=self.window)
    if pair_mask is not None:
      mask = mask & pair_mask
    out = attend(q, k, v, mask, scale=self.scale, softcap=self.softcap)
    b, t = out.shape[:2]
    return self.o_proj(out.reshape(b, t, -1))


  def tree_attend_and_project(self, prompt_qkv, node_qkv, prompt_query_pos: Array,
                              prompt_pos: Array, prompt_valid: Array, node_pos: Array,
                              ancestors: Array) -> tuple[Array, Array]:
    """Attention of a prompt and the prefix tree of its continuations, then the output
    projection: ``(prompt out [B, Tq, hidden], node out [B, N, hidden])``.

    Prompt slots attend causally over the prompt only: the always-masked prompt-to-tree
    block is never computed. A tree node attends over the prompt and, in the same softmax,
    over its ancestors in the tree (`attend_blocks`). Prompt and tree are separate arrays
    throughout, so no keys are sliced out of a packed row.

    Args:
      prompt_qkv: queries [B, Tq, H, D] of the prompt slots whose output is needed (the
        last ``Tq`` of them), keys and values [B, K, Tp, D] of all of them.
      node_qkv: queries [B, N, H, D], keys and values [B, K, N, D] of the tree nodes.
      prompt_query_pos: [B, Tq]; prompt_pos, prompt_valid: [B, Tp]; node_pos: [B, N].
      ancestors: [B, N, N] boolean, node m is node n's ancestor (or n itself).
    """
    qp, kp, vp = prompt_qkv
    qn, kn, vn = node_qkv
    mask = attention_mask(prompt_query_pos, prompt_pos, prompt_valid, window=self.window)
    out_p = attend(qp, kp, vp, mask, scale=self.scale, softcap=self.softcap)
    tree_mask = ancestors
    if self.window is not None:
      tree_mask &= node_pos[:, :, None] - node_pos[:, None, :] < self.window
    blocks = [(kp, vp, attention_mask(node_pos, prompt_pos, prompt_valid, window=self.window)),
              (kn, vn, tree_mask)]
    out_n = attend_blocks(qn, blocks, scale=self.scale, softcap=self.softcap)
    return tuple(self.o_proj(o.reshape(o.shape[:2] + (-1,))) for o in (out_p, out_n))


# ---------------------------------------------------------------------------------------------
# Feed-forward: gated MLP (the routed mixture of experts is in harnax.models.moe)
# ---------------------------------------------------------------------------------------------
def activation(name: str):
  """The elementwise activation of a config's ``activation`` name (HF ``hidden_act``)."""
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
