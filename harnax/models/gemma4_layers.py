"""Gemma 4 text modules on the shared layers: attention, MoE block, decoder layer, causal LM.

:class:`Gemma4CausalLM` is a :class:`~harnax.models.model.CausalLM` (same methods, same
:class:`~harnax.models.model.Cache`, so the sampler, ``forward`` and the scoring functions work
unchanged); only the layer stack and its inputs differ.

KV sharing: a shared layer (one of the last ``num_kv_shared_layers``) has no key/value
projections and no cache of its own; its entry in ``Cache.layers`` is ``None``. It attends over
the keys and values its source layer (``Gemma4Config.kv_source``) has just written, with its own
mask (the source has the same attention type, so the same window). Without a cache the source's
fresh keys and values are passed on the same way, so generation with the cache equals teacher
forcing. As the shared layers write nothing, a prefill (which returns the last position's
logits only) runs them on the last position alone
(:meth:`Gemma4CausalLM.last_hidden_state_with_cache`).
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax.models.gemma4 import Gemma4Config
from harnax.models.layers import Embed
from harnax.models.layers import GatedMLP
from harnax.models.layers import Linear
from harnax.models.layers import RMSNorm
from harnax.models.layers import accum_dtype
from harnax.models.layers import activation
from harnax.models.layers import apply_rope
from harnax.models.layers import attend
from harnax.models.layers import attend_blocks
from harnax.models.layers import attention_mask
from harnax.models.layers import normal_init
from harnax.models.layers import rms_norm
from harnax.models.layers import rope_cos_sin
from harnax.models.layers import rope_frequencies
from harnax.models.model import AttentionCache
from harnax.models.model import Cache
from harnax.models.model import CausalLM
from harnax.models.moe import MOE_IMPLS
from harnax.models.moe import check_moe_impl
from harnax.models.moe import choose_moe_impl
from harnax.parallel import constrain

Array = jax.Array


def unit_rms_norm(x: Array, *, eps: float) -> Array:
  """RMSNorm without a weight (HF ``Gemma4RMSNorm(with_scale=False)``), float32 inside."""
  return rms_norm(x, jnp.ones((x.shape[-1],), accum_dtype(x.dtype)), eps=eps, style="scale")


class Gemma4Attention(nnx.Module):
  """Attention of one Gemma 4 layer: its own head dim and KV heads, q/k norms, a weightless v
  norm, scale 1; no k/v projections in a KV-shared layer, no ``v_proj`` where keys are values.
  """

  def __init__(self, cfg: Gemma4Config, index: int, *, dtype, rngs: nnx.Rngs):
    h, hidden = cfg.num_heads, cfg.hidden_size
    d, kv = cfg.layer_head_dim(index), cfg.layer_kv_heads(index)
    proj = lambda d_in, d_out, axes: Linear(d_in, d_out, axes=axes, use_bias=cfg.attention_bias,
                                            dtype=dtype, rngs=rngs)
    norm = lambda: RMSNorm(d, eps=cfg.rms_norm_eps, style="scale", dtype=dtype)
    self.shared = index >= cfg.first_shared_layer
    self.q_proj = proj(hidden, h * d, ("embed", "q_heads"))
    self.q_norm = norm()
    own_kv = not self.shared
    self.k_proj = proj(hidden, kv * d, ("embed", "kv_heads")) if own_kv else None
    self.v_proj = (proj(hidden, kv * d, ("embed", "kv_heads"))
                   if own_kv and not cfg.layer_k_eq_v(index) else None)
    self.k_norm = norm() if own_kv else None
    self.o_proj = proj(h * d, hidden, ("q_heads", "embed"))
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
    self.eps = cfg.rms_norm_eps
    self.window = cfg.window_for(cfg.layer_types[index])
    inv_freq, self.rope_scaling = rope_frequencies(cfg.rope_for(cfg.layer_types[index]),
                                                   head_dim=d)
    self.inv_freq = tuple(float(f) for f in inv_freq)  # static, hashable

  def _rope(self, x: Array, positions: Array) -> Array:
    acc = accum_dtype(x.dtype)
    cos, sin = rope_cos_sin(positions, np.asarray(self.inv_freq, acc), scaling=self.rope_scaling,
                            dtype=acc)
    return apply_rope(x, cos, sin)

  def project_q(self, x: Array, positions: Array) -> Array:
    """[B, T, hidden] -> rotated queries [B, T, H, D]."""
    b, t, _ = x.shape
    q = self.q_norm(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim))
    return constrain(self._rope(q, positions), ("batch", "seq", "act_heads", None))

  def project_kv(self, x: Array, positions: Array) -> tuple[Array, Array]:
    """[B, T, hidden] -> rotated keys and normed values [B, K, T, D] (heads-major)."""
    b, t, _ = x.shape
    shape = (b, t, self.num_kv_heads, self.head_dim)
    k_raw = self.k_proj(x).reshape(shape)
    v = self.v_proj(x).reshape(shape) if self.v_proj is not None else k_raw
    k = self._rope(self.k_norm(k_raw), positions)
    v = unit_rms_norm(v, eps=self.eps)
    return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

  def attend_and_project(self, q: Array, k: Array, v: Array, q_pos: Array, k_pos: Array,
                         k_valid: Array, pair_mask: Array | None = None) -> Array:
    mask = attention_mask(q_pos, k_pos, k_valid, window=self.window)
    if pair_mask is not None:
      mask = mask & pair_mask
    out = attend(q, k, v, mask, scale=1.0)
    b, t = out.shape[:2]
    return self.o_proj(out.reshape(b, t, -1))

  def tree_attend_and_project(self, qp: Array, qn: Array, prompt_kv, node_kv,
                              prompt_query_pos: Array, prompt_pos: Array, prompt_valid: Array,
                              node_pos: Array, ancestors: Array) -> tuple[Array, Array]:
    """As :meth:`harnax.models.layers.Attention.tree_attend_and_project`, with the keys and
    values passed separately (a shared layer's come from its source layer)."""
    (kp, vp), (kn, vn) = prompt_kv, node_kv
    mask = attention_mask(prompt_query_pos, prompt_pos, prompt_valid, window=self.window)
    out_p = attend(qp, kp, vp, mask, scale=1.0)
    tree_mask = ancestors
    if self.window is not None:
      tree_mask &= node_pos[:, :, None] - node_pos[:, None, :] < self.window
    blocks = [(kp, vp, attention_mask(node_pos, prompt_pos, prompt_valid, window=self.window)),
              (kn, vn, tree_mask)]
    out_n = attend_blocks(qn, blocks, scale=1.0)
    return tuple(self.o_proj(o.reshape(o.shape[:2] + (-1,))) for o in (out_p, out_n))


class Gemma4Router(nnx.Module):
  """Router of the MoE block: weightless RMSNorm, times ``scale / sqrt(hidden)``, a linear map
  to expert logits, softmax (float32), top k renormalised to one, times ``per_expert_scale``."""

  def __init__(self, cfg: Gemma4Config, *, dtype, rngs: nnx.Rngs):
    e, hidden = cfg.num_experts, cfg.hidden_size
    self.proj = Linear(hidden, e, axes=("embed", None), dtype=dtype, rngs=rngs)
    self.scale = nnx.Param(jnp.ones((hidden,), dtype), axes=("norm",))
    self.per_expert_scale = nnx.Param(jnp.ones((e,), dtype), axes=(None,))
    self.k, self.eps = cfg.num_experts_per_tok, cfg.rms_norm_eps

  def __call__(self, x: Array) -> tuple[Array, Array]:
    """[N, hidden] -> weights [N, k] float32 and expert indices [N, k] int32."""
    h = unit_rms_norm(x, eps=self.eps)
    h = h * self.scale[...] * jnp.asarray(x.shape[-1] ** -0.5, h.dtype)
    logits = self.proj(h)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, self.k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    weights = weights * self.per_expert_scale[...].astype(jnp.float32)[experts]
    return weights, experts.astype(jnp.int32)


class Gemma4Experts(nnx.Module):
  """Experts stacked as HF stores them: ``gate_up_proj [E, 2I, hidden]`` (gate rows first) and
  ``down_proj [E, hidden, I]``; run by the shared kernels of :mod:`harnax.models.moe`."""

  def __init__(self, cfg: Gemma4Config, *, dtype, rngs: nnx.Rngs, impl: str):
    e, hidden, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    self.gate_up_proj = nnx.Param(normal_init(rngs, (e, 2 * i, hidden), dtype),
                                  axes=("experts", "mlp", "embed"))
    self.down_proj = nnx.Param(normal_init(rngs, (e, hidden, i), dtype),
                               axes=("experts", "embed", "mlp"))
    self.impl = check_moe_impl(impl)
    self.act = cfg.activation

  def __call__(self, x: Array, weights: Array, experts: Array) -> Array:
    gate_up = self.gate_up_proj[...]
    i = gate_up.shape[1] // 2
    name = choose_moe_impl(self.impl, num_tokens=x.shape[0], k=experts.shape[1],
                           num_experts=gate_up.shape[0])
    return MOE_IMPLS[name](x, weights, experts, gate_up[:, :i], gate_up[:, i:],
                           self.down_proj[...], act=activation(self.act))


class Gemma4DecoderLayer(nnx.Module):
  """Sandwich-normed attention and MLP (plus the MoE block beside the MLP), then the per-layer
  input branch, then the whole stream times ``layer_scalar``."""

  def __init__(self, cfg: Gemma4Config, index: int, *, dtype, rngs: nnx.Rngs,
               moe_impl: str = "auto"):
    hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
    norm = lambda dim=hidden: RMSNorm(dim, eps=eps, style="scale", dtype=dtype)
    self.layer_type = cfg.layer_types[index]
    self.attn_norm = norm()
    self.attn = Gemma4Attention(cfg, index, dtype=dtype, rngs=rngs)
    self.post_attn_norm = norm()
    self.mlp_norm = norm()
    self.mlp = GatedMLP(hidden, cfg.layer_intermediate_size(index), act=cfg.activation,
                        dtype=dtype, rngs=rngs)
    self.post_mlp_norm = norm()
    moe = cfg.enable_moe_block
    self.router = Gemma4Router(cfg, dtype=dtype, rngs=rngs) if moe else None
    self.experts = Gemma4Experts(cfg, dtype=dtype, rngs=rngs, impl=moe_impl) if moe else None
    self.post_feedforward_layernorm_1 = norm() if moe else None
    self.pre_feedforward_layernorm_2 = norm() if moe else None
    self.post_feedforward_layernorm_2 = norm() if moe else None
    p = cfg.hidden_size_per_layer_input
    self.per_layer_input_gate = (Linear(hidden, p, axes=("embed", None), dtype=dtype, rngs=rngs)
                                 if p else None)
    self.per_layer_projection = (Linear(p, hidden, axes=(None, "embed"), dtype=dtype, rngs=rngs)
                                 if p else None)
    self.post_per_layer_input_norm = norm() if p else None
    # A checkpoint buffer in HF (not trained there); kept as a parameter so it loads and saves.
    self.layer_scalar = nnx.Param(jnp.ones((1,), dtype), axes=(None,))
    self.act = cfg.activation

  def __call__(self, x: Array, attn_out: Array, per_layer_input: Array | None) -> Array:
    """The rest of the block after attention: ``attn_out`` [B, T, hidden] is the attention
    output of ``attn_norm(x)``; ``per_layer_input`` [B, T, P] or None."""
    x = x + self.post_attn_norm(attn_out)
    h = self.mlp(self.mlp_norm(x))
    if self.experts is not None:
      h = self.post_feedforward_layernorm_1(h)
      flat = x.reshape(-1, x.shape[-1])
      weights, experts = self.router(flat)
      moe = self.experts(self.pre_feedforward_layernorm_2(flat), weights, experts)
      h = h + self.post_feedforward_layernorm_2(moe.reshape(x.shape))
    x = x + self.post_mlp_norm(h)
    if self.per_layer_input_gate is not None:
      g = activation(self.act)(self.per_layer_input_gate(x)) * per_layer_input
      x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
    x = x * self.layer_scalar[...]
    return constrain(x, ("batch", "seq", "act_embed"))


class Gemma4CausalLM(CausalLM):
  """Gemma 4 text model (HF ``Gemma4ForCausalLM``); the interface of :class:`CausalLM`."""

  def __init__(self, config: Gemma4Config, *, rngs: nnx.Rngs | None = None,
               param_dtype=jnp.float32, moe_impl: str = "auto"):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    cfg = config
    self.config = cfg
    self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, dtype=param_dtype, rngs=rngs)
    p = cfg.hidden_size_per_layer_input
    self.embed_tokens_per_layer = (
        Embed(cfg.vocab_size_per_layer_input, cfg.num_layers * p, dtype=param_dtype, rngs=rngs)
        if p else None)
    self.per_layer_model_projection = (
        Linear(cfg.hidden_size, cfg.num_layers * p, axes=("embed", None), dtype=param_dtype,
               rngs=rngs) if p else None)
    self.per_layer_projection_norm = (
        RMSNorm(p, eps=cfg.rms_norm_eps, style="scale", dtype=param_dtype) if p else None)
    self.layers = nnx.List([
        Gemma4DecoderLayer(cfg, i, dtype=param_dtype, rngs=rngs, moe_impl=moe_impl)
        for i in range(cfg.num_layers)
    ])
    self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, style="scale", dtype=param_dtype)
    if cfg.tie_word_embeddings:
      self.lm_head = None
    else:
      self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, axes=("embed", "vocab"),
                            dtype=param_dtype, rngs=rngs)

  def init_cache(self, batch_size: int, max_length: int, *, dtype=None) -> Cache:
    """Empty cache; a KV-shared layer's entry is ``None`` (it reads its source's)."""
    cfg = self.config
    dtype = dtype or self.dtype
    layers = []
    for i in range(cfg.num_layers):
      if i >= cfg.first_shared_layer:
        layers.append(None)
        continue
      shape = AttentionCache.storage_shape(batch=batch_size, kv_heads=cfg.layer_kv_heads(i),
                                           length=max_length, head_dim=cfg.layer_head_dim(i))
      layers.append(AttentionCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype)))
    return Cache(layers=tuple(layers), positions=jnp.zeros((batch_size, max_length), jnp.int32),
                 valid=jnp.zeros((batch_size, max_length), bool), index=jnp.zeros((), jnp.int32))

  def per_layer_inputs(self, input_ids: Array, x: Array) -> Array | None:
    """The per-layer inputs [B, T, layers, P] of tokens ``input_ids`` with scaled embeddings
    ``x`` [B, T, hidden]: ``(norm(proj(x) / sqrt(hidden)) + emb_pl(ids) * sqrt(P)) / sqrt(2)``;
    None for a model without them.

    The per-layer table has ``vocab_size_per_layer_input`` rows, which may be fewer than the
    vocabulary. Raises ValueError for an id outside it when ``input_ids`` is concrete; under
    ``jit`` it cannot be checked: such a token's per-layer input is NaN, and so are the logits
    of its whole sequence.
    """
    cfg = self.config
    p = cfg.hidden_size_per_layer_input
    if not p:
      return None
    if not isinstance(input_ids, jax.core.Tracer):
      ids = np.asarray(input_ids)
      limit = cfg.vocab_size_per_layer_input
      bad = (ids < 0) | (ids >= limit)
      if ids.size and bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"input_ids: expected ids in [0, vocab_size_per_layer_input={limit}) "
                         f"(the per-layer embedding table), got {int(ids[where])} at {where}")
    shape = input_ids.shape + (cfg.num_layers, p)
    emb = self.embed_tokens_per_layer(input_ids)
    emb = emb * jnp.asarray(math.sqrt(p), dtype=emb.dtype)
    proj = self.per_layer_model_projection(x) * jnp.asarray(cfg.hidden_size ** -0.5, x.dtype)
    proj = self.per_layer_projection_norm(proj.reshape(shape))
    return (proj + emb.reshape(shape)) * jnp.asarray(2.0 ** -0.5, x.dtype)

  def _stack(self, input_ids: Array, positions: Array, q_mask: Array, *, kv_pos: Array,
             kv_valid: Array, cache_layers=None, index=None, pair_mask=None,
             last_only: bool = False):
    """Runs the layers; returns (final-norm hidden [B, T, hidden], new per-layer caches).

    ``last_only`` (static): the hidden states are the last position's only, [B, 1, hidden],
    and the KV-shared layers run on that position alone: they write no keys or values, so
    their other positions feed nothing but the other positions' outputs. The layers before
    them still run on every position and fill the cache.
    """
    cfg = self.config
    x = self._embed(input_ids)
    ple = self.per_layer_inputs(input_ids, x)
    b = x.shape[0]
    shared: dict[int, tuple[Array, Array]] = {}
    new_layers = []
    for i, layer in enumerate(self.layers):
      if last_only and i == cfg.first_shared_layer:
        # Each query's output depends on its own row of inputs only, so dropping the other
        # queries changes nothing for the last; the keys (kv_pos, kv_valid) stay whole.
        x, positions = x[:, -1:], positions[:, -1:]
        ple = None if ple is None else ple[:, -1:]
        pair_mask = None if pair_mask is None else pair_mask[:, -1:]
      h = layer.attn_norm(x)
      q = layer.attn.project_q(h, positions)
      if layer.attn.shared:
        k_all, v_all = shared[cfg.kv_source(i)]
        new_layers.append(None)
      else:
        k, v = layer.attn.project_kv(h, positions)
        if cache_layers is None:
          k_all, v_all = k, v
          new_layers.append(None)
        else:
          written = cache_layers[i].write(k, v, index)
          k_all, v_all = written.heads(b)
          new_layers.append(written)
        shared[i] = (k_all, v_all)
      attn_out = layer.attn.attend_and_project(q, k_all, v_all, positions, kv_pos, kv_valid,
                                               pair_mask)
      x = layer(x, attn_out, None if ple is None else ple[:, :, i])
    if last_only:  # a no-op after the shared layers; without any, the last position is cut here
      x = x[:, -1:]
    return self.norm(x), tuple(new_layers)

  def hidden_states(self, input_ids: Array, attention_mask: Array | None = None, *,
                    positions: Array | None = None, pair_mask: Array | None = None) -> Array:
    """As :meth:`CausalLM.hidden_states`."""
    mask, positions = self._plain_inputs(input_ids, attention_mask, positions, pair_mask)
    hidden, _ = self._stack(input_ids, positions, mask, kv_pos=positions, kv_valid=mask,
                            pair_mask=pair_mask)
    return hidden

  def hidden_states_with_cache(self, input_ids: Array, attention_mask: Array | None = None, *,
                               cache: Cache, last_only: bool = False) -> tuple[Array, Cache]:
    """As :meth:`CausalLM.hidden_states_with_cache`; with ``last_only`` (static) the hidden
    states are the last position's only, [B, 1, hidden] (see :meth:`_stack`)."""
    mask, positions, cache_positions, cache_valid = self._cache_inputs(input_ids,
                                                                       attention_mask, cache)
    t = input_ids.shape[1]
    hidden, layers = self._stack(input_ids, positions, mask, kv_pos=cache_positions,
                                 kv_valid=cache_valid, cache_layers=cache.layers,
                                 index=cache.index, last_only=last_only)
    return hidden, Cache(layers=layers, positions=cache_positions, valid=cache_valid,
                         index=cache.index + t)

  def last_hidden_state_with_cache(self, input_ids: Array, attention_mask: Array | None = None,
                                   *, cache: Cache) -> tuple[Array, Cache]:
    """As :meth:`CausalLM.last_hidden_state_with_cache` ([B, 1, hidden] and the new cache):
    the KV-shared layers run on the last position only, as transformers does in a prefill."""
    return self.hidden_states_with_cache(input_ids, attention_mask, cache=cache, last_only=True)

  def tree_hidden_states(self, prompt_ids: Array, prompt_mask: Array, node_ids: Array,
                         node_mask: Array, node_path: Array) -> Array:
    """As :meth:`CausalLM.tree_hidden_states` (same arguments and result); a shared layer
    attends over its source layer's prompt and node keys and values."""
    pmask, prompt_pos, node_pos, ancestors = self._tree_inputs(prompt_ids, prompt_mask,
                                                               node_ids, node_mask, node_path)
    cfg = self.config
    xp, xn = self._embed(prompt_ids), self._embed(node_ids)
    plep, plen = self.per_layer_inputs(prompt_ids, xp), self.per_layer_inputs(node_ids, xn)
    shared: dict[int, tuple] = {}
    last = len(self.layers) - 1
    for i, layer in enumerate(self.layers):
      hp, hn = layer.attn_norm(xp), layer.attn_norm(xn)
      qp, qn = layer.attn.project_q(hp, prompt_pos), layer.attn.project_q(hn, node_pos)
      if layer.attn.shared:
        prompt_kv, node_kv = shared[cfg.kv_source(i)]
      else:
        prompt_kv = layer.attn.project_kv(hp, prompt_pos)
        node_kv = layer.attn.project_kv(hn, node_pos)
        shared[i] = (prompt_kv, node_kv)
      query_pos = prompt_pos
      if i == last:  # only the last prompt slot predicts a token
        qp, xp, query_pos = qp[:, -1:], xp[:, -1:], prompt_pos[:, -1:]
        plep = None if plep is None else plep[:, -1:]
      ap, an = layer.attn.tree_attend_and_project(qp, qn, prompt_kv, node_kv, query_pos,
                                                  prompt_pos, pmask, node_pos, ancestors)
      xp = layer(xp, ap, None if plep is None else plep[:, :, i])
      xn = layer(xn, an, None if plen is None else plen[:, :, i])
    return self.norm(jnp.concatenate([xp, xn], axis=1))
