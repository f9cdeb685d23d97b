"""Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention with routed-expert MLPs.

Layer i is sparse unless ``i in mlp_only_layers``, and only when ``num_experts > 0`` and
``(i + 1) % decoder_sparse_step == 0``; other layers use a dense MLP of ``intermediate_size``.
Routing: softmax over experts, top ``num_experts_per_tok``, optionally renormalized
(``norm_topk_prob``). No shared expert.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from harnax.models import mapping
from harnax.models.config import DecoderConfig
from harnax.models.qwen3 import common_fields
from harnax.models.qwen3 import common_hf

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"


def mlp_kinds(num_layers: int, *, num_experts: int, step: int,
              mlp_only: tuple[int, ...]) -> tuple[str, ...]:
  """``"moe"`` or ``"dense"`` for each layer (HF ``decoder_sparse_step``, ``mlp_only_layers``)."""
  return tuple("moe" if (i not in mlp_only and num_experts > 0 and (i + 1) % step == 0)
               else "dense" for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(DecoderConfig):
  """Qwen3-MoE config (HF ``Qwen3MoeForCausalLM``, model_type ``qwen3_moe``)."""

  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "Qwen3MoeConfig":
    """Builds and validates from a ``config.json`` dict; raises ValueError naming the field."""
    name = cls.__name__
    fields = common_fields(d, name)
    n = fields["num_layers"]
    num_experts = int(d.get("num_experts", d.get("num_local_experts", 0)) or 0)
    step = d.get("decoder_sparse_step", 1)
    if not (isinstance(step, int) and step > 0):
      raise ValueError(f"{name}.decoder_sparse_step: expected a positive integer, got {step!r}")
    mlp_only = tuple(int(i) for i in (d.get("mlp_only_layers") or ()))
    bad = [i for i in mlp_only if not 0 <= i < n]
    if bad:
      raise ValueError(f"{name}.mlp_only_layers: expected layer indices in [0, {n}), got {bad}")
    return cls(model_type=MODEL_TYPE, architecture=ARCHITECTURE, **fields,
               mlp_kinds=mlp_kinds(n, num_experts=num_experts, step=step, mlp_only=mlp_only),
               num_experts=num_experts,
               num_experts_per_tok=int(d.get("num_experts_per_tok", 0) or 0),
               moe_intermediate_size=int(d.get("moe_intermediate_size", 0) or 0),
               norm_topk_prob=bool(d.get("norm_topk_prob", False)),
               decoder_sparse_step=step, mlp_only_layers=mlp_only)

  def to_hf_dict(self) -> dict[str, Any]:
    out = common_hf(self)
    out.pop("num_local_experts", None)
    out.update(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, num_experts=self.num_experts,
               num_experts_per_tok=self.num_experts_per_tok,
               moe_intermediate_size=self.moe_intermediate_size,
               norm_topk_prob=self.norm_topk_prob, decoder_sparse_step=self.decoder_sparse_step,
               mlp_only_layers=list(self.mlp_only_layers))
    return out


def rules(cfg: DecoderConfig) -> list[mapping.Rule]:
  del cfg
  return mapping.common_rules(post_attn_name="mlp_norm") + mapping.moe_rules()
