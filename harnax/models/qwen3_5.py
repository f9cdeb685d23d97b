"""Qwen3.5 text, dense and MoE (HF ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``).

A hybrid stack: Gated DeltaNet linear-attention layers (:mod:`harnax.models.gated_deltanet`)
interleaved with gated full-attention layers (``layer_types``; by default every
``full_attention_interval``-th layer is full attention). Differences from Qwen3:

* Full attention: ``q_proj`` also emits an output gate (``[H, 2*D]``, the second half per
  head), and the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``.
  RoPE rotates only the first ``partial_rotary_factor * head_dim`` dimensions.
* Norms are ``x * (1 + w)`` (zero-initialised), including q/k norms; the DeltaNet output norm
  is a gated ``w * rmsnorm(x) * silu(z)`` with plain ``w``.
* Multi-section RoPE (``mrope_section``, interleaved): text tokens have the same position in
  every section, so for text it is the ordinary 1-D rotation (the only input supported here).
* MoE: every layer is routed experts (softmax, top-k, always renormalized) plus a shared
  expert whose output is scaled by ``sigmoid(shared_expert_gate(x))``.

The model is :class:`~harnax.models.model.CausalLM`; the config supplies the per-layer
modules (:meth:`Qwen35Config.make_layer`) and their caches.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Mapping

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax.models import mapping
from harnax.models.config import DecoderConfig
from harnax.models.config import RopeConfig
from harnax.models.config import eos_to_hf
from harnax.models.config import eos_tuple
from harnax.models.config import require
from harnax.models.gated_deltanet import DeltaNetCache
from harnax.models.gated_deltanet import GatedDeltaNet
from harnax.models.layers import GatedMLP
from harnax.models.layers import Linear
from harnax.models.layers import RMSNorm
from harnax.models.layers import accum_dtype
from harnax.models.layers import apply_rope
from harnax.models.layers import attend
from harnax.models.layers import attention_mask
from harnax.models.layers import rope_cos_sin
from harnax.models.layers import rope_frequencies
from harnax.models.moe import MoE
from harnax.parallel import constrain

Array = jax.Array
ARCHITECTURE = "Qwen3_5ForCausalLM"
MODEL_TYPE = "qwen3_5_text"
MOE_ARCHITECTURE = "Qwen3_5MoeForCausalLM"
MOE_MODEL_TYPE = "qwen3_5_moe_text"
# Keys of HF rope_parameters that this family reads itself (not RopeConfig fields).
_ROPE_EXTRA = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Qwen35Config(DecoderConfig):
  """Qwen3.5 dense text config (HF ``Qwen3_5TextConfig``, model_type ``qwen3_5_text``)."""

  SUPPORTED_LAYER_TYPES: ClassVar[tuple[str, ...]] = ("full_attention", "linear_attention")
  # A recurrent layer reads one sequence in order, not a prefix tree: candidate scoring
  # (harnax.policies.lm) continues a KV/state cache per candidate instead.
  supports_tree: ClassVar[bool] = False

  linear_conv_kernel_dim: int = 4
  linear_key_head_dim: int = 128
  linear_value_head_dim: int = 128
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32
  partial_rotary_factor: float = 0.25
  mrope_section: tuple[int, ...] = ()
  mrope_interleaved: bool = False
  shared_expert_intermediate_size: int = 0
  linear_chunk_size: int = 64  # ours: tokens per chunk of the chunked delta rule

  _ARCH: ClassVar[str] = ARCHITECTURE
  _TYPE: ClassVar[str] = MODEL_TYPE

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  def validate(self) -> None:
    super().validate()
    name = type(self).__name__
    for field in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                  "linear_num_key_heads", "linear_num_value_heads", "linear_chunk_size"):
      value = getattr(self, field)
      if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"{name}.{field}: expected a positive integer, got {value!r}")
    if self.linear_num_value_heads % self.linear_num_key_heads:
      raise ValueError(f"{name}.linear_num_value_heads: expected a multiple of "
                       f"linear_num_key_heads={self.linear_num_key_heads}, got "
                       f"{self.linear_num_value_heads}")
    if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
      raise ValueError(f"{name}.rope_parameters.partial_rotary_factor: expected a factor in "
                       f"(0, 1] giving an even rotary dimension of head_dim={self.head_dim}, "
                       f"got {self.partial_rotary_factor}")
    if self.mrope_section and 2 * sum(self.mrope_section) != self.rotary_dim:
      raise ValueError(f"{name}.rope_parameters.mrope_section: expected sections summing to "
                       f"rotary_dim / 2 = {self.rotary_dim // 2}, got {list(self.mrope_section)}")
    if "moe" in self.mlp_kinds and not self.shared_expert_intermediate_size > 0:
      raise ValueError(f"{name}.shared_expert_intermediate_size: expected a positive integer, "
                       f"got {self.shared_expert_intermediate_size!r}")

  # ---- HF <-> ours ---------------------------------------------------------------------------
  @classmethod
  def _fields_from_hf(cls, d: Mapping[str, Any]) -> dict[str, Any]:
    name = cls.__name__
    n = int(require(d, "num_hidden_layers", name))
    heads = int(require(d, "num_attention_heads", name))
    hidden = int(require(d, "hidden_size", name))
    if d.get("layer_types"):
      layer_types = tuple(d["layer_types"])
    else:
      interval = d.get("full_attention_interval", 4)
      if not (isinstance(interval, int) and interval > 0):
        raise ValueError(f"{name}.full_attention_interval: expected a positive integer, "
                         f"got {interval!r}")
      layer_types = tuple("linear_attention" if (i + 1) % interval else "full_attention"
                          for i in range(n))
    if d.get("attn_output_gate", True) is not True:
      raise ValueError(f"{name}.attn_output_gate: expected true (the gated attention is the "
                       f"only one implemented), got {d.get('attn_output_gate')!r}")
    params = dict(d.get("rope_parameters") or {})
    if not params:
      params = {"rope_type": "default", "rope_theta": d.get("rope_theta", 10000.0)}
      if d.get("rope_scaling"):
        params.update(d["rope_scaling"])
    params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    prf = params.pop("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
    section = tuple(int(s) for s in (params.pop("mrope_section", None) or ()))
    interleaved = bool(params.pop("mrope_interleaved", False))
    if params.get("rope_type", params.get("type", "default")) != "default":
      raise ValueError(f"{name}.rope_parameters.rope_type: expected 'default' (multi-section "
                       f"RoPE is implemented without scaling), got "
                       f"{params.get('rope_type', params.get('type'))!r}")
    rope = RopeConfig.from_hf(params, field=f"{name}.rope_parameters")
    return dict(
        vocab_size=int(require(d, "vocab_size", name)), hidden_size=hidden,
        intermediate_size=int(d.get("intermediate_size") or 0), num_layers=n, num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or hidden // heads), layer_types=layer_types,
        rope=(("full_attention", rope),),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", False)), qk_norm=True,
        norm_style="one_plus_scale", activation=d.get("hidden_act", "silu"),
        bos_token_id=d.get("bos_token_id"), eos_token_id=eos_tuple(d.get("eos_token_id")),
        pad_token_id=d.get("pad_token_id"),
        linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", 4)),
        linear_key_head_dim=int(d.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(d.get("linear_value_head_dim", 128)),
        linear_num_key_heads=int(d.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(d.get("linear_num_value_heads", 32)),
        partial_rotary_factor=float(prf), mrope_section=section, mrope_interleaved=interleaved,
        hf_extra=json.dumps(dict(d), sort_keys=True),
    )

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen35Config":
    """Builds and validates from a (text) ``config.json`` dict; raises ValueError naming the
    field."""
    fields = cls._fields_from_hf(d)
    if not fields["intermediate_size"]:
      raise ValueError(f"{cls.__name__}.intermediate_size: expected a positive integer")
    return cls(model_type=cls._TYPE, architecture=cls._ARCH, **fields)

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_extra_dict
    for stale in ("rope_theta", "rope_scaling", "torch_dtype", "partial_rotary_factor",
                  "full_attention_interval"):
      out.pop(stale, None)
    rope = self.rope_for("full_attention").to_hf()
    rope["partial_rotary_factor"] = self.partial_rotary_factor
    if self.mrope_section:
      rope.update(mrope_section=list(self.mrope_section), mrope_interleaved=self.mrope_interleaved)
    out.update(
        architectures=[self._ARCH], model_type=self._TYPE, vocab_size=self.vocab_size,
        hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
        num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
        num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
        hidden_act=self.activation, rms_norm_eps=self.rms_norm_eps,
        max_position_embeddings=self.max_position_embeddings,
        tie_word_embeddings=self.tie_word_embeddings, attention_bias=self.attention_bias,
        layer_types=list(self.layer_types), rope_parameters=rope,
        linear_conv_kernel_dim=self.linear_conv_kernel_dim,
        linear_key_head_dim=self.linear_key_head_dim,
        linear_value_head_dim=self.linear_value_head_dim,
        linear_num_key_heads=self.linear_num_key_heads,
        linear_num_value_heads=self.linear_num_value_heads,
        bos_token_id=self.bos_token_id, eos_token_id=eos_to_hf(self.eos_token_id),
        pad_token_id=self.pad_token_id,
    )
    return out

  # ---- the model's per-layer parts ------------------------------------------------------------
  def make_layer(self, index: int, *, dtype, rngs: nnx.Rngs, moe_impl: str = "auto"):
    """The decoder layer ``index`` (read by :class:`~harnax.models.model.CausalLM`)."""
    return Qwen35DecoderLayer(self, index, dtype=dtype, rngs=rngs, moe_impl=moe_impl)


@dataclasses.dataclass(frozen=True)
class Qwen35MoeConfig(Qwen35Config):
  """Qwen3.5-MoE text config (HF ``Qwen3_5MoeTextConfig``, model_type ``qwen3_5_moe_text``)."""

  _ARCH: ClassVar[str] = MOE_ARCHITECTURE
  _TYPE: ClassVar[str] = MOE_MODEL_TYPE

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen35MoeConfig":
    name = cls.__name__
    fields = cls._fields_from_hf(d)
    fields["intermediate_size"] = 0  # every layer is routed: no dense MLP
    return cls(model_type=cls._TYPE, architecture=cls._ARCH, **fields,
               mlp_kinds=("moe",) * fields["num_layers"],
               num_experts=int(require(d, "num_experts", name)),
               num_experts_per_tok=int(require(d, "num_experts_per_tok", name)),
               moe_intermediate_size=int(require(d, "moe_intermediate_size", name)),
               shared_expert_intermediate_size=int(
                   require(d, "shared_expert_intermediate_size", name)),
               norm_topk_prob=True)

  def to_hf_dict(self) -> dict[str, Any]:
    out = super().to_hf_dict()
    out.pop("intermediate_size", None)
    out.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
               moe_intermediate_size=self.moe_intermediate_size,
               shared_expert_intermediate_size=self.shared_expert_intermediate_size)
    return out


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------
class GatedAttention(nnx.Module):
  """Full attention with an output gate from ``q_proj`` and partial RoPE.

  ``q_proj [H*2D, hidden]`` gives, per head, the query (first D) and the gate (last D);
  q/k RMSNorm ``x * (1 + w)`` over the head dimension; RoPE on the first ``rotary_dim``
  dimensions; ``o_proj(attn * sigmoid(gate))``.
  """

  def __init__(self, cfg: Qwen35Config, *, dtype, rngs: nnx.Rngs):
    h, kv, d, hidden = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    proj = lambda d_in, d_out, axes: Linear(d_in, d_out, axes=axes, use_bias=cfg.attention_bias,
                                            dtype=dtype, rngs=rngs)
    self.q_proj = proj(hidden, 2 * h * d, ("embed", "q_heads"))
    self.k_proj = proj(hidden, kv * d, ("embed", "kv_heads"))
    self.v_proj = proj(hidden, kv * d, ("embed", "kv_heads"))
    self.o_proj = proj(h * d, hidden, ("q_heads", "embed"))
    self.q_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
    self.k_norm = RMSNorm(d, eps=cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
    self.scale = d ** -0.5
    self.rotary_dim = cfg.rotary_dim
    inv_freq, self.rope_scaling = rope_frequencies(cfg.rope_for("full_attention"),
                                                   head_dim=self.rotary_dim)
    self.inv_freq = tuple(float(f) for f in inv_freq)

  def project(self, x: Array, positions: Array) -> tuple[Array, Array, Array, Array]:
    """[B, T, hidden] -> q [B, T, H, D], k and v [B, K, T, D] (heads-major), gate [B, T, H*D]."""
    b, t, _ = x.shape
    qg = self.q_proj(x).reshape(b, t, self.num_heads, 2 * self.head_dim)
    q, gate = qg[..., :self.head_dim], qg[..., self.head_dim:].reshape(b, t, -1)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    q, k = self.q_norm(q), self.k_norm(k)
    acc = accum_dtype(x.dtype)
    cos, sin = rope_cos_sin(positions, np.asarray(self.inv_freq, acc), scaling=self.rope_scaling,
                            dtype=acc)
    r = self.rotary_dim
    rotate = lambda y: jnp.concatenate([apply_rope(y[..., :r], cos, sin), y[..., r:]], axis=-1)
    q, k = rotate(q), rotate(k)
    q = constrain(q, ("batch", "seq", "act_heads", None))
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), gate

  def attend_and_project(self, q, k, v, gate, q_pos, k_pos, k_valid) -> Array:
    mask = attention_mask(q_pos, k_pos, k_valid, window=None)
    out = attend(q, k, v, mask, scale=self.scale)
    b, t = out.shape[:2]
    out = out.reshape(b, t, -1)
    acc = accum_dtype(out.dtype)
    out = (out.astype(acc) * jax.nn.sigmoid(gate.astype(acc))).astype(out.dtype)
    return self.o_proj(out)


class SharedExpertMoE(MoE):
  """Qwen3.5-MoE's block: routed experts (:class:`~harnax.models.moe.MoE`) plus a shared
  expert gated by ``sigmoid(shared_expert_gate(x))`` (HF ``mlp.shared_expert.*``,
  ``mlp.shared_expert_gate.weight [1, hidden]``)."""

  def __init__(self, cfg: Qwen35Config, *, dtype, rngs: nnx.Rngs, impl: str = "auto"):
    super().__init__(cfg, dtype=dtype, rngs=rngs, impl=impl)
    self.shared_expert = GatedMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size,
                                  act=cfg.activation, dtype=dtype, rngs=rngs)
    self.shared_expert_gate = Linear(cfg.hidden_size, 1, axes=("embed", None), dtype=dtype,
                                     rngs=rngs)

  def __call__(self, x: Array) -> Array:
    routed = super().__call__(x)
    acc = accum_dtype(x.dtype)
    gate = jax.nn.sigmoid(self.shared_expert_gate(x).astype(acc))
    shared = (self.shared_expert(x).astype(acc) * gate).astype(x.dtype)
    return routed + shared


class Qwen35DecoderLayer(nnx.Module):
  """Pre-norm residual block: gated attention or Gated DeltaNet, then the MLP or MoE block.

  Same call signature as :class:`~harnax.models.model.DecoderLayer`; its cache is an
  ``AttentionCache`` (full attention) or a :class:`DeltaNetCache` (linear attention).
  """

  def __init__(self, cfg: Qwen35Config, index: int, *, dtype, rngs: nnx.Rngs,
               moe_impl: str = "auto"):
    norm = lambda: RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, style=cfg.norm_style,
                           dtype=dtype)
    self.layer_type = cfg.layer_types[index]
    self.attn_norm = norm()
    if self.layer_type == "linear_attention":
      self.linear_attn = GatedDeltaNet(cfg, dtype=dtype, rngs=rngs)
      self.attn = None
    else:
      self.attn = GatedAttention(cfg, dtype=dtype, rngs=rngs)
      self.linear_attn = None
    self.mlp_norm = norm()
    if cfg.mlp_kinds[index] == "moe":
      self.mlp = SharedExpertMoE(cfg, dtype=dtype, rngs=rngs, impl=moe_impl)
    else:
      self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.activation,
                          dtype=dtype, rngs=rngs)

  def init_layer_cache(self, batch_size: int, max_length: int, *, dtype, kv_cache_fn):
    """This layer's empty cache: a DeltaNet state, or the attention cache ``kv_cache_fn()``."""
    del max_length
    if self.linear_attn is not None:
      return self.linear_attn.init_cache(batch_size, dtype=dtype)
    return kv_cache_fn()

  def __call__(self, x: Array, positions: Array, mask: Array, *, cache=None,
               cache_positions: Array | None = None, cache_valid: Array | None = None,
               index: Array | None = None, pair_mask: Array | None = None):
    """As :meth:`harnax.models.model.DecoderLayer.__call__`; returns (x, new layer cache or
    None without a cache)."""
    h = self.attn_norm(x)
    if self.linear_attn is not None:
      if pair_mask is not None:
        raise NotImplementedError("pair_mask: packed sequences (several continuations in one "
                                  "row) are not supported by linear-attention layers; score "
                                  "each continuation as its own row")
      state = cache if isinstance(cache, DeltaNetCache) else None
      h, new_state = self.linear_attn(h, mask, state)
      new_cache = new_state if cache is not None else None
    else:
      if pair_mask is not None:
        raise NotImplementedError("pair_mask: packed sequences are not supported by Qwen3.5")
      q, k, v, gate = self.attn.project(h, positions)
      if cache is None:
        k_all, v_all, k_pos, k_valid, new_cache = k, v, positions, mask, None
      else:
        new_cache = cache.write(k, v, index)
        k_all, v_all = new_cache.heads(x.shape[0])
        k_pos, k_valid = cache_positions, cache_valid
      h = self.attn.attend_and_project(q, k_all, v_all, gate, positions, k_pos, k_valid)
    x = x + h
    x = x + self.mlp(self.mlp_norm(x))
    return constrain(x, ("batch", "seq", "act_embed")), new_cache

  def tree_forward(self, *args, **kwargs):
    raise NotImplementedError("tree_hidden_states: prefix-tree scoring is not supported by "
                              "Qwen3.5 (its linear-attention layers are recurrent); score the "
                              "continuations as separate rows")


# ---------------------------------------------------------------------------------------------
# Checkpoint rules
# ---------------------------------------------------------------------------------------------
def rules(cfg: DecoderConfig) -> list[mapping.Rule | mapping.FusedRule]:
  """HF tensor names <-> ours. Only ``conv1d.weight`` is renamed beyond the module paths.

  The MoE experts load per expert (as transformers saves them) or fused (as the released
  checkpoints store them); they save per expert.
  """
  layer, ours = "model.layers.{layer}", "layers.{layer}"
  out = mapping.common_rules(post_attn_name="mlp_norm")
  lin, our_lin = f"{layer}.linear_attn", f"{ours}.linear_attn"
  for proj in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
    out.append(mapping.Rule(f"{lin}.{proj}.weight", f"{our_lin}.{proj}.kernel"))
  out += [
      mapping.Rule(f"{lin}.conv1d.weight", f"{our_lin}.conv_weight"),
      mapping.Rule(f"{lin}.dt_bias", f"{our_lin}.dt_bias"),
      mapping.Rule(f"{lin}.A_log", f"{our_lin}.A_log"),
      mapping.Rule(f"{lin}.norm.weight", f"{our_lin}.norm.weight"),
  ]
  if "moe" in cfg.mlp_kinds:
    out += mapping.moe_rules()
    out += mapping.fused_moe_rules()  # released checkpoints: the experts fused
    for proj in ("gate_proj", "up_proj", "down_proj"):
      out.append(mapping.Rule(f"{layer}.mlp.shared_expert.{proj}.weight",
                              f"{ours}.mlp.shared_expert.{proj}.kernel"))
    out.append(mapping.Rule(f"{layer}.mlp.shared_expert_gate.weight",
                            f"{ours}.mlp.shared_expert_gate.kernel"))
  return out
