"""Qwen3 (dense): config parsing, export and checkpoint rules.

Architecture: pre-norm blocks, RMSNorm ``x * w``, q/k RMSNorm over the head dimension before
RoPE, GQA, SiLU-gated MLP, optional tied embeddings, optional sliding window on layers
``>= max_window_layers`` (HF ``use_sliding_window``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from harnax.models import mapping
from harnax.models.config import DecoderConfig
from harnax.models.config import eos_to_hf
from harnax.models.config import eos_tuple
from harnax.models.config import require
from harnax.models.config import single_rope

ARCHITECTURE = "Qwen3ForCausalLM"
MODEL_TYPE = "qwen3"


def _layer_types(d: Mapping[str, Any], n: int, window: int | None) -> tuple[str, ...]:
  if d.get("layer_types"):
    types = tuple(d["layer_types"])
  else:
    start = d.get("max_window_layers", n)
    types = tuple("sliding_attention" if window is not None and i >= start else "full_attention"
                  for i in range(n))
  if window is None:  # HF ignores sliding layers when the window is disabled
    types = tuple("full_attention" for _ in types)
  return types


def common_fields(d: Mapping[str, Any], family: str) -> dict[str, Any]:
  """Fields shared by Qwen3 and Qwen3-MoE."""
  n = int(require(d, "num_hidden_layers", family))
  heads = int(require(d, "num_attention_heads", family))
  hidden = int(require(d, "hidden_size", family))
  window = d.get("sliding_window") if d.get("use_sliding_window", False) else None
  layer_types = _layer_types(d, n, window)
  rope = single_rope(d, family)
  act = d.get("hidden_act", "silu")
  return dict(
      vocab_size=int(require(d, "vocab_size", family)),
      hidden_size=hidden,
      intermediate_size=int(d.get("intermediate_size") or 0),
      num_layers=n,
      num_heads=heads,
      num_kv_heads=int(d.get("num_key_value_heads") or heads),
      head_dim=int(d.get("head_dim") or hidden // heads),
      layer_types=layer_types,
      rope=tuple((t, rope) for t in sorted(set(layer_types))),
      rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      attention_bias=bool(d.get("attention_bias", False)),
      sliding_window=window,
      qk_norm=True,
      norm_style="scale",
      activation=act,
      bos_token_id=d.get("bos_token_id"),
      eos_token_id=eos_tuple(d.get("eos_token_id")),
      pad_token_id=d.get("pad_token_id"),
      hf_extra=json.dumps(dict(d), sort_keys=True),
  )


def common_hf(cfg: DecoderConfig) -> dict[str, Any]:
  out = cfg.hf_extra_dict
  for stale in ("rope_theta", "rope_scaling", "torch_dtype"):
    out.pop(stale, None)
  rope = cfg.rope_for(cfg.layer_types[0])
  out.update(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, hidden_act=cfg.activation, rms_norm_eps=cfg.rms_norm_eps,
      max_position_embeddings=cfg.max_position_embeddings,
      tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=cfg.attention_bias,
      use_sliding_window=cfg.sliding_window is not None,
      sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types),
      rope_parameters=rope.to_hf(), bos_token_id=cfg.bos_token_id,
      eos_token_id=eos_to_hf(cfg.eos_token_id), pad_token_id=cfg.pad_token_id,
  )
  return out


@dataclasses.dataclass(frozen=True)
class Qwen3Config(DecoderConfig):
  """Qwen3 dense config (HF ``Qwen3ForCausalLM``, model_type ``qwen3``)."""

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen3Config":
    """Builds and validates from a ``config.json`` dict; raises ValueError naming the field."""
    fields = common_fields(d, cls.__name__)
    if not fields["intermediate_size"]:
      raise ValueError(f"{cls.__name__}.intermediate_size: expected a positive integer")
    return cls(model_type=MODEL_TYPE, architecture=ARCHITECTURE, **fields)

  def to_hf_dict(self) -> dict[str, Any]:
    out = common_hf(self)
    out.update(architectures=[ARCHITECTURE], model_type=MODEL_TYPE)
    out.pop("max_window_layers", None)  # layer_types carries the same information
    return out


def rules(cfg: DecoderConfig) -> list[mapping.Rule]:
  del cfg
  return mapping.common_rules(post_attn_name="mlp_norm")
