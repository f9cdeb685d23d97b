"""Gemma 4 text (HF ``Gemma4ForCausalLM``, model_type ``gemma4_text``): config and checkpoint rules.

What Gemma 4 adds to Gemma 3, all data in :class:`Gemma4Config` (the modules are in
:mod:`harnax.models.gemma4_layers`):

* plain ``x * w`` RMSNorms (weights stored as is, initialised to one), q/k norms with weights
  and a weightless v norm; attention scale 1 (the q/k norms set the logit scale);
* per-layer-type attention geometry: full-attention layers have their own head dim
  (``global_head_dim``) and, with ``attention_k_eq_v``, their own KV head count
  (``num_global_key_value_heads``) and no ``v_proj`` (the values are the keys before the k norm
  and RoPE); their RoPE is ``proportional`` (only the first ``partial_rotary_factor`` of the
  frequencies rotate);
* KV sharing: the last ``num_kv_shared_layers`` layers have no key/value projections and attend
  over the keys and values of the last earlier layer of the same attention type;
* per-layer inputs (the "E" models): a second embedding table ``[vocab_per_layer, layers * P]``
  and a projection of the input embeddings, mixed and fed to every layer through a gated
  residual branch (``hidden_size_per_layer_input = P``);
* an optional MoE block beside the dense MLP (``enable_moe_block``), with its own router
  (weightless norm, learned scale, per-expert scale) and fused ``gate_up_proj`` experts;
* a double-wide MLP in the KV-shared layers (``use_double_wide_mlp``);
* a per-layer output multiplier ``layer_scalar`` (a checkpoint buffer);
* embeddings times sqrt(hidden), final logit soft-cap, tied embeddings.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from harnax.models import mapping
from harnax.models.config import DecoderConfig
from harnax.models.config import RopeConfig
from harnax.models.config import eos_to_hf
from harnax.models.config import eos_tuple
from harnax.models.config import require

ARCHITECTURE = "Gemma4ForCausalLM"
MODEL_TYPE = "gemma4_text"
MULTIMODAL_ARCHITECTURE = "Gemma4ForConditionalGeneration"
# HF defaults of Gemma4TextConfig (transformers 5.x), used when config.json omits a field.
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1_000_000.0},
}
_ACTIVATIONS = ("gelu_pytorch_tanh", "silu")


def _rope(d: Mapping[str, Any], family: str, layer_types) -> dict[str, RopeConfig]:
  params = d.get("rope_parameters")
  if params is None:
    params = _DEFAULT_ROPE
  if not isinstance(params, Mapping) or not all(isinstance(params.get(t), Mapping)
                                                for t in set(layer_types)):
    raise ValueError(f"{family}.rope_parameters: expected a dict keyed by layer type "
                     f"({sorted(set(layer_types))}), got {params!r}")
  return {t: RopeConfig.from_hf(params[t], field=f"{family}.rope_parameters[{t}]")
          for t in set(layer_types)}


def _per_layer_geometry(d: Mapping[str, Any], family: str, layer_types, head_dim: int,
                        kv_heads: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Every layer's (head dim, KV heads), from ``per_layer_config`` (what transformers 5.x
  writes) or else from ``global_head_dim`` / ``num_global_key_value_heads`` (the released
  configs: they apply to the full-attention layers, the KV heads only with
  ``attention_k_eq_v``, as transformers reads them)."""
  n = len(layer_types)
  dims, kvs = [head_dim] * n, [kv_heads] * n
  per_layer = d.get("per_layer_config")
  if per_layer is None:
    global_dim = int(d.get("global_head_dim") or 512)
    global_kv = d.get("num_global_key_value_heads")
    for i, t in enumerate(layer_types):
      if t == "full_attention":
        dims[i] = global_dim
        if d.get("attention_k_eq_v", False) and global_kv is not None:
          kvs[i] = int(global_kv)
    return tuple(dims), tuple(kvs)
  if not isinstance(per_layer, Mapping):
    raise ValueError(f"{family}.per_layer_config: expected a dict of layer index -> overrides, "
                     f"got {per_layer!r}")
  for key, override in per_layer.items():
    try:
      i = int(key)
    except (TypeError, ValueError):
      i = -1
    if not 0 <= i < n:
      raise ValueError(f"{family}.per_layer_config: expected layer indices in [0, {n}), "
                       f"got {key!r}")
    unknown = sorted(set(override) - {"head_dim", "num_key_value_heads"})
    if unknown:
      raise ValueError(f"{family}.per_layer_config[{key}]: overrides {unknown} are not "
                       f"supported (only head_dim and num_key_value_heads)")
    dims[i] = int(override.get("head_dim", dims[i]))
    kvs[i] = int(override.get("num_key_value_heads", kvs[i]))
  return tuple(dims), tuple(kvs)


@dataclasses.dataclass(frozen=True)
class Gemma4Config(DecoderConfig):
  """Gemma 4 text config.

  ``head_dim`` / ``num_kv_heads`` are the defaults (those of the sliding-window layers);
  ``layer_head_dims`` / ``layer_kv_head_counts`` hold every layer's own values (HF
  ``per_layer_config``, or ``global_head_dim`` / ``num_global_key_value_heads`` for the full
  layers in the released configs).
  """

  layer_head_dims: tuple[int, ...] = ()
  layer_kv_head_counts: tuple[int, ...] = ()
  attention_k_eq_v: bool = False
  num_kv_shared_layers: int = 0
  hidden_size_per_layer_input: int = 0
  vocab_size_per_layer_input: int = 0
  enable_moe_block: bool = False
  use_double_wide_mlp: bool = False

  # ---- per-layer geometry -------------------------------------------------------------------
  def __post_init__(self):
    if not self.layer_head_dims:
      object.__setattr__(self, "layer_head_dims", (self.head_dim,) * self.num_layers)
    if not self.layer_kv_head_counts:
      object.__setattr__(self, "layer_kv_head_counts", (self.num_kv_heads,) * self.num_layers)
    super().__post_init__()

  def layer_head_dim(self, i: int) -> int:
    return self.layer_head_dims[i]

  def layer_kv_heads(self, i: int) -> int:
    return self.layer_kv_head_counts[i]

  def type_value(self, values: tuple[int, ...], layer_type: str) -> int | None:
    """The value of ``values`` shared by the layers of ``layer_type`` (None if none)."""
    found = {v for v, t in zip(values, self.layer_types) if t == layer_type}
    return found.pop() if len(found) == 1 else None

  @property
  def global_head_dim(self) -> int | None:
    return self.type_value(self.layer_head_dims, "full_attention")

  def layer_k_eq_v(self, i: int) -> bool:
    return self.attention_k_eq_v and self.layer_types[i] == "full_attention"

  @property
  def first_shared_layer(self) -> int:
    return self.num_layers - self.num_kv_shared_layers

  def kv_source(self, i: int) -> int:
    """The layer whose keys and values layer ``i`` attends over (``i`` itself unless shared):
    the last layer before the shared ones with the same attention type."""
    if i < self.first_shared_layer:
      return i
    kind = self.layer_types[i]
    return max(j for j in range(self.first_shared_layer) if self.layer_types[j] == kind)

  def layer_intermediate_size(self, i: int) -> int:
    wide = self.use_double_wide_mlp and i >= self.first_shared_layer
    return self.intermediate_size * (2 if wide else 1)

  @property
  def ignored_tensors(self) -> tuple[str, ...]:
    """Regexes of checkpoint tensors that are read by nothing: released checkpoints keep the
    key/value projections of the KV-shared layers, which transformers also drops on load."""
    return tuple(rf"^model\.layers\.{i}\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\."
                 for i in range(self.first_shared_layer, self.num_layers))

  # ---- validation ---------------------------------------------------------------------------
  def validate(self) -> None:
    super().validate()
    name = type(self).__name__
    for field in ("layer_head_dims", "layer_kv_head_counts"):
      if len(getattr(self, field)) != self.num_layers:
        raise ValueError(f"{name}.{field}: expected {self.num_layers} entries "
                         f"(num_hidden_layers), got {len(getattr(self, field))}")
    for i, (d, kv) in enumerate(zip(self.layer_head_dims, self.layer_kv_head_counts)):
      if not (isinstance(d, int) and d > 0 and d % 2 == 0):
        raise ValueError(f"{name}.per_layer_config[{i}].head_dim: expected a positive even "
                         f"integer, got {d!r}")
      if not (isinstance(kv, int) and kv > 0 and self.num_heads % kv == 0):
        raise ValueError(f"{name}.per_layer_config[{i}].num_key_value_heads: expected a divisor "
                         f"of num_attention_heads={self.num_heads}, got {kv!r}")
    for t in set(self.layer_types):
      if self.type_value(self.layer_head_dims, t) is None:
        # One RoPE table per layer type (as transformers builds it) needs one head dim per type.
        raise ValueError(f"{name}.per_layer_config: the {t} layers have different head_dim "
                         f"values; expected one head_dim per layer type")
    if not 0 <= self.num_kv_shared_layers <= self.num_layers:
      raise ValueError(f"{name}.num_kv_shared_layers: expected an integer in [0, "
                       f"num_hidden_layers={self.num_layers}], got {self.num_kv_shared_layers}")
    if self.num_kv_shared_layers:
      own = set(self.layer_types[:self.first_shared_layer])
      for i in range(self.first_shared_layer, self.num_layers):
        if self.layer_types[i] not in own:
          raise ValueError(f"{name}.num_kv_shared_layers: layer {i} ({self.layer_types[i]}) "
                           f"shares keys and values, but no earlier layer of that type computes "
                           f"them (the first {self.first_shared_layer} layers are "
                           f"{sorted(own) or 'none'})")
    if self.hidden_size_per_layer_input < 0:
      raise ValueError(f"{name}.hidden_size_per_layer_input: expected >= 0, got "
                       f"{self.hidden_size_per_layer_input}")
    if self.hidden_size_per_layer_input and self.vocab_size_per_layer_input <= 0:
      raise ValueError(f"{name}.vocab_size_per_layer_input: expected a positive integer with "
                       f"hidden_size_per_layer_input > 0, got {self.vocab_size_per_layer_input}")
    if self.enable_moe_block and "moe" in self.mlp_kinds:
      raise ValueError(f"{name}.mlp_kinds: the Gemma 4 MoE block runs beside the dense MLP; "
                       f"mlp_kinds must stay 'dense'")

  # ---- config.json --------------------------------------------------------------------------
  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Gemma4Config":
    """Builds and validates from a (text) ``config.json`` dict; raises ValueError naming the
    field, and refuses options this port does not implement, by name, before any compute."""
    name = cls.__name__
    bidirectional = d.get("use_bidirectional_attention")
    if bidirectional not in (None, False):
      raise ValueError(f"{name}.use_bidirectional_attention: expected null (causal text model; "
                       f"'vision' and 'all' are not supported), got {bidirectional!r}")
    n = int(require(d, "num_hidden_layers", name))
    heads = int(require(d, "num_attention_heads", name))
    layer_types = d.get("layer_types")
    if layer_types is None:
      layer_types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    layer_types = list(layer_types)
    if layer_types and layer_types[-1] != "full_attention":
      # transformers forces this too (with a warning): the last layer is always global.
      layer_types[-1] = "full_attention"
    for t in layer_types:
      if t not in ("full_attention", "sliding_attention"):
        raise ValueError(f"{name}.layer_types: layer type {t!r} is not supported (expected "
                         f"'full_attention' or 'sliding_attention')")
    activation = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _ACTIVATIONS:
      raise ValueError(f"{name}.hidden_activation: expected one of {_ACTIVATIONS}, "
                       f"got {activation!r}")
    rope = _rope(d, name, layer_types)
    head_dim = int(d.get("head_dim") or 256)
    kv_heads = int(d.get("num_key_value_heads") or heads)
    head_dims, kv_counts = _per_layer_geometry(d, name, layer_types, head_dim, kv_heads)
    moe = bool(d.get("enable_moe_block", False))
    ple = int(d.get("hidden_size_per_layer_input") or 0)
    if moe:
      for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        require(d, key, name)
    return cls(
        model_type=MODEL_TYPE, architecture=ARCHITECTURE,
        vocab_size=int(require(d, "vocab_size", name)),
        hidden_size=int(require(d, "hidden_size", name)),
        intermediate_size=int(require(d, "intermediate_size", name)),
        num_layers=n, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim,
        layer_types=tuple(layer_types),
        rope=tuple(sorted(rope.items())),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        attention_bias=bool(d.get("attention_bias", False)),
        sliding_window=d.get("sliding_window", 512),
        qk_norm=True, norm_style="scale", activation=activation,
        sandwich_norms=True, scale_embeddings=True,
        query_pre_attn_scalar=1.0,  # transformers' Gemma4TextAttention: scaling = 1.0
        attn_logit_softcapping=None,
        final_logit_softcapping=d.get("final_logit_softcapping"),
        num_experts=int(d.get("num_experts") or 0) if moe else 0,
        num_experts_per_tok=int(d.get("top_k_experts") or 0) if moe else 0,
        moe_intermediate_size=int(d.get("moe_intermediate_size") or 0) if moe else 0,
        bos_token_id=d.get("bos_token_id", 2), eos_token_id=eos_tuple(d.get("eos_token_id", 1)),
        pad_token_id=d.get("pad_token_id", 0),
        hf_extra=json.dumps(dict(d), sort_keys=True),
        layer_head_dims=head_dims, layer_kv_head_counts=kv_counts,
        attention_k_eq_v=bool(d.get("attention_k_eq_v", False)),
        num_kv_shared_layers=int(d.get("num_kv_shared_layers") or 0),
        hidden_size_per_layer_input=ple,
        vocab_size_per_layer_input=int(d.get("vocab_size_per_layer_input") or 262144)
        if ple else 0,
        enable_moe_block=moe,
        use_double_wide_mlp=bool(d.get("use_double_wide_mlp", False)),
    )

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_extra_dict
    for stale in ("hidden_act", "torch_dtype", "architectures", "model_type", "global_head_dim",
                  "num_global_key_value_heads", "per_layer_config"):
      out.pop(stale, None)
    # transformers 5.x writes (and reads) the per-layer overrides as per_layer_config.
    per_layer = {}
    for i, (d, kv) in enumerate(zip(self.layer_head_dims, self.layer_kv_head_counts)):
      override = {}
      if d != self.head_dim:
        override["head_dim"] = d
      if kv != self.num_kv_heads:
        override["num_key_value_heads"] = kv
      if override:
        per_layer[str(i)] = override
    if per_layer:
      out["per_layer_config"] = per_layer
    out.update(
        architectures=[ARCHITECTURE], model_type=MODEL_TYPE,
        vocab_size=self.vocab_size, hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim, layer_types=list(self.layer_types),
        rope_parameters={t: r.to_hf() for t, r in self.rope},
        rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
        tie_word_embeddings=self.tie_word_embeddings, attention_bias=self.attention_bias,
        sliding_window=self.sliding_window, hidden_activation=self.activation,
        final_logit_softcapping=self.final_logit_softcapping,
        attention_k_eq_v=self.attention_k_eq_v, num_kv_shared_layers=self.num_kv_shared_layers,
        hidden_size_per_layer_input=self.hidden_size_per_layer_input,
        enable_moe_block=self.enable_moe_block, use_double_wide_mlp=self.use_double_wide_mlp,
        bos_token_id=self.bos_token_id, eos_token_id=eos_to_hf(self.eos_token_id),
        pad_token_id=self.pad_token_id,
    )
    if self.hidden_size_per_layer_input:
      out["vocab_size_per_layer_input"] = self.vocab_size_per_layer_input
    if self.enable_moe_block:
      out.update(num_experts=self.num_experts, top_k_experts=self.num_experts_per_tok,
                 moe_intermediate_size=self.moe_intermediate_size)
    return out


def rules(cfg: DecoderConfig) -> list[mapping.Rule]:
  """Checkpoint rules: our parameter names follow HF's inside each layer, except the shared
  decoder's norm names (``attn_norm`` ...) and attention module (``attn``)."""
  del cfg
  layer, ours = "model.layers.{layer}", "layers.{layer}"
  out = mapping.common_rules(post_attn_name="post_attn_norm") + [
      mapping.Rule(f"{layer}.pre_feedforward_layernorm.weight", f"{ours}.mlp_norm.weight"),
      mapping.Rule(f"{layer}.post_feedforward_layernorm.weight", f"{ours}.post_mlp_norm.weight"),
      mapping.Rule(f"{layer}.layer_scalar", f"{ours}.layer_scalar"),
      mapping.Rule("model.embed_tokens_per_layer.weight", "embed_tokens_per_layer.embedding"),
      mapping.Rule("model.per_layer_model_projection.weight",
                   "per_layer_model_projection.kernel"),
      mapping.Rule("model.per_layer_projection_norm.weight", "per_layer_projection_norm.weight"),
      mapping.Rule(f"{layer}.router.proj.weight", f"{ours}.router.proj.kernel"),
      mapping.Rule(f"{layer}.router.scale", f"{ours}.router.scale"),
      mapping.Rule(f"{layer}.router.per_expert_scale", f"{ours}.router.per_expert_scale"),
      mapping.Rule(f"{layer}.experts.gate_up_proj", f"{ours}.experts.gate_up_proj"),
      mapping.Rule(f"{layer}.experts.down_proj", f"{ours}.experts.down_proj"),
  ]
  for hf_name in ("per_layer_input_gate", "per_layer_projection"):
    out.append(mapping.Rule(f"{layer}.{hf_name}.weight", f"{ours}.{hf_name}.kernel"))
  for hf_name in ("post_per_layer_input_norm", "post_feedforward_layernorm_1",
                  "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2"):
    out.append(mapping.Rule(f"{layer}.{hf_name}.weight", f"{ours}.{hf_name}.weight"))
  return out
