"""Gemma 3 text (HF ``Gemma3ForCausalLM``, model_type ``gemma3_text``).

Differences from Qwen3, all data in :class:`DecoderConfig`: RMSNorm ``x * (1 + w)``; norms
before *and after* attention and the MLP; embeddings times ``sqrt(hidden_size)`` in the forward
pass; attention scale ``query_pre_attn_scalar ** -0.5``; gelu(tanh)-gated MLP; local
sliding-window layers interleaved with global layers (``layer_types``), each kind with its own
RoPE base and scaling; optional attention / final logit soft-capping; tied embeddings.
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

ARCHITECTURE = "Gemma3ForCausalLM"
MODEL_TYPE = "gemma3_text"


def _rope(d: Mapping[str, Any], family: str) -> dict[str, RopeConfig]:
  """Per-layer-type RoPE: transformers 5 ``rope_parameters`` keyed by layer type, or the 4.x
  ``rope_theta`` (global) / ``rope_local_base_freq`` (local) / ``rope_scaling`` (global only)."""
  params = d.get("rope_parameters")
  if isinstance(params, Mapping) and "full_attention" in params:
    full = dict(params["full_attention"])
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", d.get("rope_local_base_freq", 10000.0))
    full.setdefault("rope_theta", d.get("rope_theta", 1000000.0))
  else:
    full = {"rope_type": "default", "rope_theta": d.get("rope_theta", 1000000.0)}
    if d.get("rope_scaling"):
      full.update(d["rope_scaling"])
    local = {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", 10000.0)}
  field = f"{family}.rope_parameters"
  return {"full_attention": RopeConfig.from_hf(full, field=f"{field}[full_attention]"),
          "sliding_attention": RopeConfig.from_hf(local, field=f"{field}[sliding_attention]")}


@dataclasses.dataclass(frozen=True)
class Gemma3Config(DecoderConfig):
  """Gemma 3 text config."""

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Gemma3Config":
    """Builds and validates from a ``config.json`` dict; raises ValueError naming the field."""
    name = cls.__name__
    if d.get("use_bidirectional_attention"):
      raise ValueError(f"{name}.use_bidirectional_attention: expected false (causal LM only)")
    n = int(require(d, "num_hidden_layers", name))
    heads = int(require(d, "num_attention_heads", name))
    pattern = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6))
    layer_types = tuple(d.get("layer_types") or (
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)))
    rope = _rope(d, name)
    return cls(
        model_type=MODEL_TYPE, architecture=ARCHITECTURE,
        vocab_size=int(require(d, "vocab_size", name)),
        hidden_size=int(require(d, "hidden_size", name)),
        intermediate_size=int(require(d, "intermediate_size", name)),
        num_layers=n, num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or 256),
        layer_types=layer_types,
        rope=tuple(sorted((t, rope[t]) for t in set(layer_types))),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        attention_bias=bool(d.get("attention_bias", False)),
        sliding_window=d.get("sliding_window", 4096),
        qk_norm=True, norm_style="one_plus_scale",
        activation=d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        sandwich_norms=True, scale_embeddings=True,
        query_pre_attn_scalar=d.get("query_pre_attn_scalar", 256),
        # transformers' Gemma3Attention never passes the attention soft-cap to its kernels
        # (released Gemma 3 configs set it to null), so it is kept only for export.
        attn_logit_softcapping=None,
        final_logit_softcapping=d.get("final_logit_softcapping"),
        bos_token_id=d.get("bos_token_id", 2), eos_token_id=eos_tuple(d.get("eos_token_id", 1)),
        pad_token_id=d.get("pad_token_id", 0),
        hf_extra=json.dumps(dict(d), sort_keys=True),
    )

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_extra_dict
    for stale in ("rope_theta", "rope_local_base_freq", "rope_scaling", "hidden_act",
                  "sliding_window_pattern", "_sliding_window_pattern", "torch_dtype"):
      out.pop(stale, None)
    rope = dict(self.rope)
    full = rope.get("full_attention", RopeConfig(theta=1000000.0))
    local = rope.get("sliding_attention", RopeConfig(theta=10000.0))
    out.update(
        architectures=[ARCHITECTURE], model_type=MODEL_TYPE,
        vocab_size=self.vocab_size, hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim, layer_types=list(self.layer_types),
        rope_parameters={"full_attention": full.to_hf(), "sliding_attention": local.to_hf()},
        rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
        tie_word_embeddings=self.tie_word_embeddings, attention_bias=self.attention_bias,
        sliding_window=self.sliding_window, hidden_activation=self.activation,
        query_pre_attn_scalar=self.query_pre_attn_scalar,
        attn_logit_softcapping=self.hf_extra_dict.get("attn_logit_softcapping"),
        final_logit_softcapping=self.final_logit_softcapping,
        bos_token_id=self.bos_token_id, eos_token_id=eos_to_hf(self.eos_token_id),
        pad_token_id=self.pad_token_id,
    )
    return out


def rules(cfg: DecoderConfig) -> list[mapping.Rule]:
  del cfg
  layer, ours = "model.layers.{layer}", "layers.{layer}"
  return mapping.common_rules(post_attn_name="post_attn_norm") + [
      mapping.Rule(f"{layer}.pre_feedforward_layernorm.weight", f"{ours}.mlp_norm.weight"),
      mapping.Rule(f"{layer}.post_feedforward_layernorm.weight", f"{ours}.post_mlp_norm.weight"),
  ]
