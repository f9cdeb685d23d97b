"""Frozen decoder configuration shared by every model family.

Each family module (``qwen3``, ``qwen3_moe``, ``gemma3``) turns a Hugging Face ``config.json``
dict into one :class:`DecoderConfig` and back. The model code reads only this dataclass, so a
new family (or a hybrid stack with per-layer attention kinds) is a new ``from_hf_dict`` plus new
``layer_types`` values, not a new model.

All fields are hashable (tuples, not lists) because the config is static metadata of the NNX
graph and a static argument of jitted functions.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, ClassVar, Mapping

LAYER_TYPES = ("full_attention", "sliding_attention")
MLP_KINDS = ("dense", "moe")
NORM_STYLES = ("scale", "one_plus_scale")  # Qwen: x * w; Gemma: x * (1 + w)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")
# Our field name -> the config.json key, for error messages.
HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads"}


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary embedding parameters of one attention kind (HF ``rope_parameters`` semantics).

  ``factor``/``low_freq_factor``/``high_freq_factor``/``original_max_position_embeddings`` are
  used by the scaled variants; ``beta_fast``/``beta_slow``/``attention_factor``/``mscale``/
  ``mscale_all_dim``/``truncate`` by yarn only. ``partial_rotary_factor`` is read by
  ``proportional`` only (Gemma 4's global layers): the first ``factor * head_dim / 2``
  frequencies rotate, the rest are zero (those dimensions pass through unrotated).
  """

  theta: float = 10000.0
  rope_type: str = "default"
  factor: float | None = None
  low_freq_factor: float | None = None
  high_freq_factor: float | None = None
  original_max_position_embeddings: int | None = None
  beta_fast: float | None = None
  beta_slow: float | None = None
  attention_factor: float | None = None
  mscale: float | None = None
  mscale_all_dim: float | None = None
  truncate: bool = True
  partial_rotary_factor: float | None = None

  @classmethod
  def from_hf(cls, params: Mapping[str, Any], *, field: str) -> "RopeConfig":
    """Builds from one HF rope dict (``{"rope_type": ..., "rope_theta": ..., ...}``)."""
    params = dict(params)
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    theta = params.pop("rope_theta", None)
    if theta is None:
      raise ValueError(f"{field}.rope_theta: expected a positive number, got None")
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in params.items() if k in known}
    rope = cls(theta=float(theta), rope_type=rope_type, **kwargs)
    rope.validate(field)
    return rope

  def to_hf(self) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.theta}
    for f in dataclasses.fields(self):
      if f.name in ("theta", "rope_type", "truncate"):
        continue
      value = getattr(self, f.name)
      if value is not None:
        out[f.name] = value
    if self.rope_type == "yarn" and not self.truncate:
      out["truncate"] = False
    return out

  def validate(self, field: str) -> None:
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"{field}.rope_type: expected one of {ROPE_TYPES}, got {self.rope_type!r}")
    if not (self.theta > 0 and math.isfinite(self.theta)):
      raise ValueError(f"{field}.rope_theta: expected a positive finite number, got {self.theta}")
    if self.rope_type == "proportional":
      prf = self.partial_rotary_factor
      if prf is not None and not 0 <= prf <= 1:
        raise ValueError(f"{field}.partial_rotary_factor: expected a number in [0, 1], got {prf}")
      if self.factor is not None and not self.factor > 0:
        raise ValueError(f"{field}.factor: expected > 0, got {self.factor}")
    elif self.partial_rotary_factor is not None and self.partial_rotary_factor != 1:
      raise ValueError(f"{field}.partial_rotary_factor: supported only with rope_type "
                       f"'proportional', got {self.partial_rotary_factor} for {self.rope_type!r}")
    if self.rope_type not in ("default", "proportional") and not (
        self.factor is not None and self.factor > 0):
      raise ValueError(f"{field}.factor: expected > 0 for rope_type {self.rope_type!r}, "
                       f"got {self.factor}")
    if self.rope_type == "llama3":
      for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if getattr(self, name) is None:
          raise ValueError(f"{field}.{name}: required for rope_type 'llama3'")
      if not self.high_freq_factor > self.low_freq_factor:
        raise ValueError(f"{field}.high_freq_factor: expected > low_freq_factor")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Architecture of a decoder-only LM, in Hugging Face parameter semantics.

  Per-layer fields (``layer_types``, ``mlp_kinds``) have length ``num_layers``; ``rope`` maps
  each attention kind present in ``layer_types`` to its :class:`RopeConfig`.
  """

  model_type: str
  architecture: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  layer_types: tuple[str, ...]
  rope: tuple[tuple[str, RopeConfig], ...]
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 32768
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  sliding_window: int | None = None
  qk_norm: bool = True
  norm_style: str = "scale"
  activation: str = "silu"
  sandwich_norms: bool = False  # Gemma: extra norms after attention and after the MLP
  scale_embeddings: bool = False  # Gemma: embeddings * sqrt(hidden_size) in the forward pass
  query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim)
  attn_logit_softcapping: float | None = None
  final_logit_softcapping: float | None = None
  mlp_kinds: tuple[str, ...] = ()
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  bos_token_id: int | None = None
  eos_token_id: tuple[int, ...] = ()
  pad_token_id: int | None = None
  # Original config.json (sorted JSON text) so save_pretrained keeps fields we do not model.
  hf_extra: str = "{}"
  # Layer kinds the family builds: the attention kinds of LAYER_TYPES, which take RoPE
  # parameters; a family with other mixers (Qwen3.5's linear attention) widens it.
  SUPPORTED_LAYER_TYPES: ClassVar[tuple[str, ...]] = LAYER_TYPES
  # Whether the family's model runs `CausalLM.tree_hidden_states` (prefix-tree scoring); a
  # family whose layers read a sequence strictly in order (recurrent ones) sets False.
  supports_tree: ClassVar[bool] = True

  def __post_init__(self):
    if not self.mlp_kinds:
      object.__setattr__(self, "mlp_kinds", ("dense",) * self.num_layers)
    self.validate()

  # ---- derived quantities -------------------------------------------------------------------
  @property
  def attention_scale(self) -> float:
    """Multiplier of q·k (HF ``scaling``)."""
    base = self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim
    return float(base) ** -0.5

  def rope_for(self, layer_type: str) -> RopeConfig:
    return dict(self.rope)[layer_type]

  def window_for(self, layer_type: str) -> int | None:
    return self.sliding_window if layer_type == "sliding_attention" else None

  def replace(self, **changes) -> "DecoderConfig":
    return dataclasses.replace(self, **changes)

  @property
  def hf_extra_dict(self) -> dict[str, Any]:
    return json.loads(self.hf_extra)

  # ---- validation --------------------------------------------------------------------------
  def validate(self) -> None:
    """Raises ValueError naming the first field out of range."""
    name = type(self).__name__

    def positive(field):
      value = getattr(self, field)
      if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"{name}.{HF_NAMES.get(field, field)}: expected a positive integer, "
                         f"got {value!r}")

    def one_per_layer(field, allowed):
      values = getattr(self, field)
      if len(values) != self.num_layers:
        raise ValueError(f"{name}.{field}: expected {self.num_layers} entries "
                         f"(num_hidden_layers), got {len(values)}")
      for value in values:
        if value not in allowed:
          raise ValueError(f"{name}.{field}: expected entries in {allowed}, got {value!r}")

    for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "max_position_embeddings"):
      positive(field)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"{name}.num_key_value_heads: expected a divisor of num_attention_heads="
                       f"{self.num_heads}, got {self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"{name}.head_dim: expected an even number (rotary pairs), "
                       f"got {self.head_dim}")
    if not (self.rms_norm_eps > 0):
      raise ValueError(f"{name}.rms_norm_eps: expected > 0, got {self.rms_norm_eps}")
    one_per_layer("layer_types", self.SUPPORTED_LAYER_TYPES)
    if "sliding_attention" in self.layer_types:
      if not (isinstance(self.sliding_window, int) and self.sliding_window > 0):
        raise ValueError(f"{name}.sliding_window: expected a positive integer when layer_types "
                         f"has sliding_attention, got {self.sliding_window!r}")
    rope = dict(self.rope)
    for t in set(self.layer_types) & set(LAYER_TYPES):  # recurrent layers have no RoPE
      if t not in rope:
        raise ValueError(f"{name}.rope_parameters: missing parameters for layer type {t!r}")
      rope[t].validate(f"{name}.rope_parameters[{t}]")
    if self.norm_style not in NORM_STYLES:
      raise ValueError(f"{name}.norm_style: expected one of {NORM_STYLES}, got {self.norm_style!r}")
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"{name}.hidden_act: expected one of {ACTIVATIONS}, got {self.activation!r}")
    for field in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
      value = getattr(self, field)
      if value is not None and not value > 0:
        raise ValueError(f"{name}.{field}: expected None or > 0, got {value!r}")
    one_per_layer("mlp_kinds", MLP_KINDS)
    if "dense" in self.mlp_kinds:
      positive("intermediate_size")
    if "moe" in self.mlp_kinds:
      positive("num_experts")
      positive("moe_intermediate_size")
      if not (isinstance(self.num_experts_per_tok, int) and
              0 < self.num_experts_per_tok <= self.num_experts):
        raise ValueError(f"{name}.num_experts_per_tok: expected an integer in [1, num_experts="
                         f"{self.num_experts}], got {self.num_experts_per_tok!r}")


# ---- helpers for the family parsers -----------------------------------------------------------
def require(d: Mapping[str, Any], key: str, family: str) -> Any:
  if key not in d or d[key] is None:
    raise ValueError(f"{family}.{key}: required field missing from config.json")
  return d[key]


def eos_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, int):
    return (value,)
  return tuple(int(v) for v in value)


def eos_to_hf(eos: tuple[int, ...]):
  if not eos:
    return None
  return eos[0] if len(eos) == 1 else list(eos)


def single_rope(d: Mapping[str, Any], family: str) -> RopeConfig:
  """Parses rope settings of single-base models: transformers 5 ``rope_parameters`` or the 4.x
  ``rope_theta`` + ``rope_scaling`` pair."""
  if isinstance(d.get("rope_parameters"), Mapping):
    params = dict(d["rope_parameters"])
    params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
  else:
    params = {"rope_theta": d.get("rope_theta", 10000.0), "rope_type": "default"}
    if d.get("rope_scaling"):
      params.update(d["rope_scaling"])
  if params.get("rope_type", params.get("type")) in ("yarn", "llama3"):
    params.setdefault("original_max_position_embeddings", d.get("max_position_embeddings"))
  return RopeConfig.from_hf(params, field=f"{family}.rope_parameters")
