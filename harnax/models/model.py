"""The decoder-only causal LM shared by Qwen3, Qwen3-MoE and Gemma 3, and its KV cache.

One module, configured by :class:`~harnax.models.config.DecoderConfig`: the families differ
only in data (norm style, activation, sandwich norms, embedding scale, attention scale,
soft-caps, per-layer attention kind and MLP kind). Per-layer state lives in a tuple of
per-layer caches, so a hybrid stack can give each layer type its own state.

Positions come from the attention mask (``cumsum(mask) - 1``), which makes left padding
exact; the KV cache stores the position and validity of every slot.
"""

from __future__ import annotations

import math
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from harnax import pytree
from harnax.models.config import DecoderConfig
from harnax.models.layers import Attention
from harnax.models.layers import Embed
from harnax.models.layers import GatedMLP
from harnax.models.layers import Linear
from harnax.models.layers import RMSNorm
from harnax.models.layers import accum_dtype
from harnax.models.moe import MoE
from harnax.parallel import constrain

Array = jax.Array


@pytree.container
class AttentionCache:
  """Keys and values of one attention layer: ``k``, ``v`` stored as ``[B*K, L, D]``, or
  ``[L, D]`` when ``B*K == 1``; :meth:`heads` gives the logical ``[B, K, L, D]`` view.

  Heads-major, the layout attention reads, so a decode step writes one slot per head and
  never transposes the cache. No stored dimension has size 1: XLA:CPU turns a size-1
  dimension between the cache update and attention's matmul into a bitcast, duplicates the
  update fusion for its two users (attention and the returned cache), and then copies the
  whole cache to keep both writes in place: four copies per layer per step at batch 1.
  """

  k: Array
  v: Array

  @staticmethod
  def storage_shape(*, batch: int, kv_heads: int, length: int, head_dim: int) -> tuple[int, ...]:
    """Shape of the stored ``k`` (and ``v``) buffer of one layer."""
    rows = batch * kv_heads
    return (rows, length, head_dim) if rows > 1 else (length, head_dim)

  def write(self, k: Array, v: Array, index: Array) -> "AttentionCache":
    """Writes new keys/values ``[B, K, T, D]`` at slots ``[index, index + T)``."""
    t, d = k.shape[2], k.shape[3]
    lead = self.k.shape[:-2]  # (B*K,) or ()
    zero = jnp.zeros((), jnp.int32)
    start = (zero,) * len(lead) + (index, zero)

    def put(buf, new):
      return jax.lax.dynamic_update_slice(buf, new.reshape(lead + (t, d)).astype(buf.dtype), start)

    return AttentionCache(k=put(self.k, k), v=put(self.v, v))

  def heads(self, batch: int) -> tuple[Array, Array]:
    """The logical ``[B, K, L, D]`` views of ``k`` and ``v``."""
    length, d = self.k.shape[-2:]
    shape = (batch, -1, length, d)
    return self.k.reshape(shape), self.v.reshape(shape)


@pytree.container
class Cache:
  """Preallocated decoding state (static shapes).

  Attributes:
    layers: one per-layer cache per decoder layer (``AttentionCache`` for attention layers).
    positions: [B, L] int32 position of the token in each slot.
    valid: [B, L] bool, slot holds a real token (False for padding and unwritten slots).
    index: scalar int32, next slot to write (shared by the batch: sequences are left-padded).
  """

  layers: tuple[Any, ...]
  positions: Array
  valid: Array
  index: Array

  @property
  def max_length(self) -> int:
    return self.valid.shape[1]


def positions_from_mask(mask: Array, *, start: Array | None = None) -> Array:
  """Positions [B, T] of the tokens of a (left-)padded batch ``mask`` [B, T]; padding gets
  position 0. ``start`` [B] offsets each row (the real tokens already in a cache)."""
  pos = jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1
  if start is not None:
    pos = pos + start[:, None]
  return jnp.where(mask, pos, 0)


class DecoderLayer(nnx.Module):
  """Pre-norm residual block: attention then MLP/MoE, with Gemma's optional post-norms."""

  def __init__(self, cfg: DecoderConfig, index: int, *, dtype, rngs: nnx.Rngs,
               moe_impl: str = "auto"):
    norm = lambda: RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
    self.layer_type = cfg.layer_types[index]
    self.attn_norm = norm()
    self.attn = Attention(cfg, self.layer_type, dtype=dtype, rngs=rngs)
    self.post_attn_norm = norm() if cfg.sandwich_norms else None
    self.mlp_norm = norm()
    if cfg.mlp_kinds[index] == "moe":
      self.mlp = MoE(cfg, dtype=dtype, rngs=rngs, impl=moe_impl)
    else:
      self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.activation, dtype=dtype,
                          rngs=rngs)
    self.post_mlp_norm = norm() if cfg.sandwich_norms else None

  def __call__(self, x: Array, positions: Array, mask: Array, *,
               cache: AttentionCache | None = None, cache_positions: Array | None = None,
               cache_valid: Array | None = None, index: Array | None = None,
               pair_mask: Array | None = None) -> tuple[Array, AttentionCache | None]:
    """One block. Without a cache the keys are the inputs themselves.

    Args:
      x: [B, T, hidden]; positions, mask: [B, T].
      cache: this layer's cache, or None. ``cache_positions``/``cache_valid`` [B, L] already
        include the new tokens, which are written at slot ``index``.
    Returns:
      (new x [B, T, hidden], the new layer cache, None without a cache).
    """
    h = self.attn_norm(x)
    q, k, v = self.attn.project_qkv(h, positions)
    if cache is None:
      k_all, v_all, k_pos, k_valid, new_cache = k, v, positions, mask, None
    else:
      new_cache = cache.write(k, v, index)
      k_all, v_all = new_cache.heads(x.shape[0])
      k_pos, k_valid = cache_positions, cache_valid
    h = self.attn.attend_and_project(q, k_all, v_all, positions, k_pos, k_valid, pair_mask)
    return self._residuals(x, h), new_cache

  def _residuals(self, x: Array, h: Array) -> Array:
    """The attention output ``h`` added to the stream ``x``, then the MLP block."""
    if self.post_attn_norm is not None:
      h = self.post_attn_norm(h)
    x = x + h
    h = self.mlp(self.mlp_norm(x))
    if self.post_mlp_norm is not None:
      h = self.post_mlp_norm(h)
    return constrain(x + h, ("batch", "seq", "act_embed"))

  def tree_forward(self, xp: Array, xn: Array, prompt_pos: Array, prompt_valid: Array,
                   node_pos: Array, ancestors: Array, *, last: bool = False
                   ) -> tuple[Array, Array]:
    """One block over a prompt and the prefix tree of its continuations.

    Args:
      xp: [B, Tp', hidden] the prompt slots (left-padded); xn: [B, N, hidden] the nodes.
      prompt_pos, prompt_valid: [B, Tp] (Tp >= Tp': the prompt's keys always cover all Tp
        slots; `xp` is all of them except after a ``last`` block).
      node_pos: [B, N]; ancestors: [B, N, N] boolean, node m is node n's ancestor (or n).
      last: keep only what predicts tokens, the last prompt slot and the nodes (the last
        layer): the other prompt slots' outputs are never read.

    Returns:
      ``(xp [B, 1 if last else Tp, hidden], xn [B, N, hidden])`` after the block.
    """
    hp, hn = self.attn_norm(xp), self.attn_norm(xn)
    qp, kp, vp = self.attn.project_qkv(hp, prompt_pos)
    node_qkv = self.attn.project_qkv(hn, node_pos)
    query_pos = prompt_pos
    if last:
      qp, xp, query_pos = qp[:, -1:], xp[:, -1:], prompt_pos[:, -1:]
    hp, hn = self.attn.tree_attend_and_project((qp, kp, vp), node_qkv, query_pos, prompt_pos,
                                               prompt_valid, node_pos, ancestors)
    return self._residuals(xp, hp), self._residuals(xn, hn)


class CausalLM(nnx.Module):
  """Decoder-only causal language model (HF ``*ForCausalLM``).

  ``model(input_ids, attention_mask=mask)`` -> logits [B, T, V] float32, always. Decoding with
  a KV cache has its own methods, each returning ``(logits, new_cache)``: :meth:`prefill`
  (last-position logits), :meth:`decode_step` (one token per sequence) and
  :meth:`forward_with_cache` (logits at every new position).
  """

  def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs | None = None,
               param_dtype=jnp.float32, moe_impl: str = "auto"):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.config = config
    self.embed_tokens = Embed(config.vocab_size, config.hidden_size, dtype=param_dtype, rngs=rngs)
    self.layers = nnx.List([
        # A family with its own layer kinds (Qwen3.5's hybrid stack) builds its layers.
        config.make_layer(i, dtype=param_dtype, rngs=rngs, moe_impl=moe_impl)
        if hasattr(config, "make_layer") else
        DecoderLayer(config, i, dtype=param_dtype, rngs=rngs, moe_impl=moe_impl)
        for i in range(config.num_layers)
    ])
    self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, style=config.norm_style,
                        dtype=param_dtype)
    if config.tie_word_embeddings:
      self.lm_head = None  # the output projection *is* embed_tokens.embedding
    else:
      self.lm_head = Linear(config.hidden_size, config.vocab_size, axes=("embed", "vocab"),
                            dtype=param_dtype, rngs=rngs)

  @property
  def dtype(self):
    return self.embed_tokens.embedding[...].dtype

  def init_cache(self, batch_size: int, max_length: int, *, dtype=None) -> Cache:
    """Empty cache for ``batch_size`` sequences of at most ``max_length`` tokens.

    ``dtype`` of the stored keys and values defaults to the parameter dtype.
    """
    cfg = self.config
    dtype = dtype or self.dtype
    shape = AttentionCache.storage_shape(batch=batch_size, kv_heads=cfg.num_kv_heads,
                                         length=max_length, head_dim=cfg.head_dim)
    kv_cache = lambda: AttentionCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))
    # Layers with another state (a recurrent layer's fixed-size state) build their own.
    layers = tuple(layer.init_layer_cache(batch_size, max_length, dtype=dtype,
                                          kv_cache_fn=kv_cache)
                   if hasattr(layer, "init_layer_cache") else kv_cache()
                   for layer in self.layers)
    return Cache(layers=layers, positions=jnp.zeros((batch_size, max_length), jnp.int32),
                 valid=jnp.zeros((batch_size, max_length), bool), index=jnp.zeros((), jnp.int32))

  def _mask(self, input_ids: Array, attention_mask: Array | None) -> Array:
    """Checked [B, T] bool mask (all ones by default)."""
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids: expected shape [batch, seq], got {input_ids.shape}")
    b, t = input_ids.shape
    mask = (jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool))
    if mask.shape != (b, t):
      raise ValueError(f"attention_mask: expected shape {(b, t)}, got {mask.shape}")
    return mask

  def _plain_inputs(self, input_ids: Array, attention_mask: Array | None,
                    positions: Array | None, pair_mask: Array | None) -> tuple[Array, Array]:
    """Checked (mask [B, T] bool, positions [B, T]) of :meth:`hidden_states`."""
    mask = self._mask(input_ids, attention_mask)
    positions = positions_from_mask(mask) if positions is None else positions
    if positions.shape != mask.shape:
      raise ValueError(f"positions: expected shape {mask.shape}, got {positions.shape}")
    if pair_mask is not None and pair_mask.shape != mask.shape + mask.shape[-1:]:
      raise ValueError(f"pair_mask: expected shape {mask.shape + mask.shape[-1:]}, got "
                       f"{pair_mask.shape}")
    return mask, positions

  def _tree_inputs(self, prompt_ids: Array, prompt_mask: Array, node_ids: Array,
                   node_mask: Array, node_path: Array) -> tuple[Array, Array, Array, Array]:
    """Checked inputs of :meth:`tree_hidden_states`: (prompt mask [B, Tp] bool, prompt
    positions [B, Tp], node positions [B, N] (prompt length + depth), ancestors [B, N, N]
    bool: node m is on node n's path, n itself included)."""
    pmask = self._mask(prompt_ids, prompt_mask)
    b, tp = pmask.shape
    if tp < 1:
      raise ValueError("prompt_ids: expected at least one prompt slot, got 0")
    if node_ids.ndim != 2 or node_ids.shape[0] != b:
      raise ValueError(f"node_ids: expected shape [{b}, N], got {node_ids.shape}")
    n = node_ids.shape[1]
    if node_mask.shape != (b, n):
      raise ValueError(f"node_mask: expected shape {(b, n)}, got {node_mask.shape}")
    if node_path.ndim != 3 or node_path.shape[:2] != (b, n):
      raise ValueError(f"node_path: expected shape [{b}, {n}, A], got {node_path.shape}")
    length = jnp.sum(pmask, axis=-1, dtype=jnp.int32)
    depth = jnp.sum(node_path >= 0, axis=-1, dtype=jnp.int32) - 1
    prompt_pos = positions_from_mask(pmask)
    node_pos = length[:, None] + jnp.maximum(depth, 0)
    ancestors = jnp.any(node_path[:, :, :, None] == jnp.arange(n)[None, None, None, :],
                        axis=2)
    return pmask, prompt_pos, node_pos, ancestors

  def _cache_inputs(self, input_ids: Array, attention_mask: Array | None, cache: Cache
                    ) -> tuple[Array, Array, Array, Array]:
    """Checked inputs of :meth:`hidden_states_with_cache`: (mask [B, T] bool, the tokens'
    positions [B, T] continuing each row's count of real tokens, and the cache's positions
    and validity [B, S] with these tokens written at ``cache.index``)."""
    mask = self._mask(input_ids, attention_mask)
    b, t = input_ids.shape
    if b != cache.valid.shape[0]:
      raise ValueError(f"input_ids: batch size {b} differs from the cache's "
                       f"{cache.valid.shape[0]}")
    if t > cache.max_length:
      raise ValueError(f"input_ids: {t} tokens do not fit a cache of max_length "
                       f"{cache.max_length}")
    if not isinstance(cache.index, jax.core.Tracer) and int(cache.index) + t > cache.max_length:
      # Under jit this cannot be checked; dynamic_update_slice would clamp the write.
      raise ValueError(f"input_ids: {t} more tokens after {int(cache.index)} do not fit a "
                       f"cache of max_length {cache.max_length}")
    if len(cache.layers) != self.config.num_layers:
      raise ValueError(f"cache: expected {self.config.num_layers} layers, got "
                       f"{len(cache.layers)}")
    start = jnp.sum(cache.valid, axis=1).astype(jnp.int32)
    positions = positions_from_mask(mask, start=start)
    zero = jnp.zeros((), jnp.int32)
    cache_positions = jax.lax.dynamic_update_slice(cache.positions, positions, (zero, cache.index))
    cache_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (zero, cache.index))
    return mask, positions, cache_positions, cache_valid

  def _embed(self, input_ids: Array) -> Array:
    x = self.embed_tokens(input_ids)
    if self.config.scale_embeddings:
      # Gemma multiplies by sqrt(hidden) rounded to the parameter dtype, in the forward pass.
      x = x * jnp.asarray(math.sqrt(self.config.hidden_size), dtype=x.dtype)
    return constrain(x, ("batch", "seq", "act_embed"))

  def hidden_states(self, input_ids: Array, attention_mask: Array | None = None, *,
                    positions: Array | None = None, pair_mask: Array | None = None) -> Array:
    """Final-norm hidden states [B, T, hidden] of a (left-padded) batch, without a cache.

    For packed sequences (several continuations of one prompt in one row): ``positions``
    [B, T] replaces the positions derived from the mask, and ``pair_mask`` [B, T, T] further
    restricts which earlier tokens each token attends to (both default to a plain sequence).
    """
    mask, positions = self._plain_inputs(input_ids, attention_mask, positions, pair_mask)
    x = self._embed(input_ids)
    for layer in self.layers:
      x, _ = layer(x, positions, mask, pair_mask=pair_mask)
    return self.norm(x)

  def tree_hidden_states(self, prompt_ids: Array, prompt_mask: Array, node_ids: Array,
                         node_mask: Array, node_path: Array) -> Array:
    """Final-norm hidden states that predict the tokens of a prefix tree of continuations.

    Each row is a (left-padded) prompt followed by a tree of continuations: node n holds
    one token, sits at position ``prompt length + depth`` and sees the prompt and its own
    ancestors. The same values as `hidden_states` of the packed row with a tree
    ``pair_mask``, computed without the ``[T, T]`` mask: prompt slots attend over the prompt
    only, a node over the prompt and its ancestors (`layers.attend_blocks`), and the last
    layer runs only the slots that predict a token.

    Args:
      prompt_ids, prompt_mask: [B, Tp], left-padded (Tp >= 1).
      node_ids, node_mask: [B, N] the tree's tokens and which nodes are real.
      node_path: [B, N, A] int, each node's path from its root, itself included (node
        indices, padded with -1).

    Returns:
      [B, 1 + N, hidden]: slot 0 is the last prompt slot (it predicts the roots), slot
      ``1 + n`` is node n (it predicts n's children).
    """
    pmask, prompt_pos, node_pos, ancestors = self._tree_inputs(prompt_ids, prompt_mask,
                                                               node_ids, node_mask, node_path)
    xp, xn = self._embed(prompt_ids), self._embed(node_ids)
    last = len(self.layers) - 1
    for i, layer in enumerate(self.layers):
      xp, xn = layer.tree_forward(xp, xn, prompt_pos, pmask, node_pos, ancestors,
                                  last=i == last)
    x = jnp.concatenate([xp, xn], axis=1)
    return self.norm(x)

  def hidden_states_with_cache(self, input_ids: Array, attention_mask: Array | None = None, *,
                               cache: Cache) -> tuple[Array, Cache]:
    """Appends the tokens to ``cache``: hidden states [B, T, hidden] and the new cache.

    The tokens are written at slots ``[cache.index, cache.index + T)``; their positions
    continue from the number of real tokens already in each row.

    Raises:
      ValueError: a batch size other than the cache's, or more tokens than the cache has
        room for (the second check needs a concrete ``cache.index``, i.e. runs outside jit).
    """
    mask, positions, cache_positions, cache_valid = self._cache_inputs(input_ids,
                                                                       attention_mask, cache)
    t = input_ids.shape[1]
    x = self._embed(input_ids)
    new_layers = []
    for layer, layer_cache in zip(self.layers, cache.layers):
      x, new_layer_cache = layer(x, positions, mask, cache=layer_cache,
                                 cache_positions=cache_positions, cache_valid=cache_valid,
                                 index=cache.index)
      new_layers.append(new_layer_cache)
    new_cache = Cache(layers=tuple(new_layers), positions=cache_positions, valid=cache_valid,
                      index=cache.index + t)
    return self.norm(x), new_cache

  def logits(self, hidden: Array) -> Array:
    """Output projection of hidden states [B, T, hidden] -> float32 logits [B, T, V] (final
    soft-cap applied; float64 for a float64 model)."""
    acc = accum_dtype(self.dtype)
    if self.lm_head is None:
      logits = self.embed_tokens.attend(hidden)
    else:
      logits = jnp.einsum("...d,vd->...v", hidden, self.lm_head.kernel[...],
                          preferred_element_type=acc)
    cap = self.config.final_logit_softcapping
    if cap is not None:
      logits = cap * jnp.tanh(logits / cap)
    return constrain(logits.astype(acc), ("batch", "seq", "act_vocab"))

  def __call__(self, input_ids: Array, attention_mask: Array | None = None) -> Array:
    """Logits [B, T, V] float32.

    Args:
      input_ids: [B, T] int token ids, left padding allowed.
      attention_mask: [B, T], 1/True for real tokens. Defaults to all ones.
    """
    return self.logits(self.hidden_states(input_ids, attention_mask))

  def forward_with_cache(self, input_ids: Array, attention_mask: Array | None = None, *,
                         cache: Cache) -> tuple[Array, Cache]:
    """Appends the tokens to ``cache``: logits [B, T, V] float32 and the new cache.

    Equal to the positions ``[L, L + T)`` of ``model`` run on everything written so far
    plus these tokens (e.g. scoring several continuations of one cached prompt).
    """
    hidden, cache = self.hidden_states_with_cache(input_ids, attention_mask, cache=cache)
    return self.logits(hidden), cache

  def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
              cache: Cache) -> tuple[Array, Cache]:
    """Appends the (left-padded) prompts to ``cache``: last-position logits [B, V] float32 and
    the new cache. Only the last position is projected onto the vocabulary: decoding needs
    nothing else, and the [B, T, V] logits would cost a matmul and a buffer for nothing."""
    hidden, cache = self.last_hidden_state_with_cache(input_ids, attention_mask, cache=cache)
    return self.logits(hidden)[:, 0], cache

  def last_hidden_state_with_cache(self, input_ids: Array, attention_mask: Array | None = None,
                                   *, cache: Cache) -> tuple[Array, Cache]:
    """As :meth:`hidden_states_with_cache`, but only the last position's hidden state
    [B, 1, hidden] (every row's last token: rows are left-padded) and the same new cache.

    :meth:`prefill`'s hook: a family whose later layers write no cache overrides it to run
    them on the last position only (Gemma 4's KV-shared layers)."""
    hidden, cache = self.hidden_states_with_cache(input_ids, attention_mask, cache=cache)
    return hidden[:, -1:], cache

  def decode_step(self, tokens: Array, *, cache: Cache) -> tuple[Array, Cache]:
    """Appends one token per sequence, ``tokens`` [B] int: next-token logits [B, V] float32 and
    the new cache."""
    if tokens.ndim != 1:
      raise ValueError(f"tokens: expected shape [batch], got {tokens.shape}")
    hidden, cache = self.hidden_states_with_cache(tokens[:, None], cache=cache)
    return self.logits(hidden)[:, 0], cache


def param_count(model_or_state) -> int:
  """Number of parameters (a tied embedding counts once)."""
  state = (nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module)
           else model_or_state)
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


@nnx.jit
def forward(model: CausalLM, input_ids: Array, attention_mask: Array | None = None) -> Array:
  """Jit-compiled ``model(input_ids, attention_mask=...)`` -> logits [B, T, V] float32."""
  return model(input_ids, attention_mask=attention_mask)
