"""Checkpoint name mapping as data: ``hf_name_pattern -> (our_path, transform)``.

One table per family, used in both directions. Patterns use two placeholders: ``{layer}``
(decoder layer index, same on both sides) and ``{expert}`` (only on the HF side: the HF
checkpoint stores one tensor per expert, we store them stacked on a leading expert axis).

A ``FusedRule`` in a table names one HF tensor that holds several of our stacked params at
once (``experts.gate_up_proj [E, 2I, H]`` = gate and up, concatenated); loading accepts it in
place of the per-expert tensors, saving writes the per-expert form.

Transforms are named, not lambdas, so the table can be printed in the docs: ``identity`` or
``transpose``. Our kernels keep the HF ``nn.Linear`` layout ``[out, in]``, so the current
families only use ``identity``; ``transpose`` stays for layouts that differ.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Iterator

import numpy as np

TRANSFORMS = ("identity", "transpose")


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str
  ours: str
  transform: str = "identity"

  @property
  def stacked(self) -> bool:
    return "{expert}" in self.hf

  def hf_regex(self) -> re.Pattern:
    return _compile(self.hf)

  def ours_regex(self) -> re.Pattern:
    return _compile(self.ours)


def _compile(pattern: str) -> re.Pattern:
  escaped = re.escape(pattern)
  escaped = escaped.replace(r"\{layer\}", r"(?P<layer>\d+)").replace(r"\{expert\}",
                                                                     r"(?P<expert>\d+)")
  return re.compile(f"^{escaped}$")


def to_hf(array: np.ndarray, transform: str) -> np.ndarray:
  """Our layout -> HF layout (one tensor, or one expert slice)."""
  return array.T if transform == "transpose" else array


def from_hf(array: np.ndarray, transform: str) -> np.ndarray:
  """HF layout -> our layout (both transforms are involutions)."""
  return array.T if transform == "transpose" else array


def path_str(path: tuple) -> str:
  return ".".join(str(p) for p in path)


@dataclasses.dataclass(frozen=True)
class FusedRule:
  """One HF tensor holding our stacked params ``parts``, concatenated along ``axis``.

  Attributes:
    hf: the HF name pattern (``{layer}`` only: the tensor covers every expert).
    parts: our param paths (``{layer}``), in their order inside the HF tensor.
    axis: the axis of the HF tensor (= of our stacked params) along which they follow.
  """

  hf: str
  parts: tuple[str, ...]
  axis: int

  def hf_regex(self) -> re.Pattern:
    return _compile(self.hf)


@dataclasses.dataclass(frozen=True)
class Target:
  """Where one HF tensor goes: our param path, optional expert slot, transform."""

  path: str
  expert: int | None
  transform: str


class Mapping:
  """A family's rule table bound to the parameter paths of one model instance."""

  def __init__(self, rules: Iterable[Rule | FusedRule], param_shapes: dict[str, tuple[int, ...]],
               ignore: Iterable[str] = ()):
    rules = tuple(rules)
    self.rules = tuple(r for r in rules if isinstance(r, Rule))
    self.fused_rules = tuple(r for r in rules if isinstance(r, FusedRule))
    for r in self.rules:
      if r.transform not in TRANSFORMS:
        raise ValueError(f"Rule {r.hf!r}: transform must be one of {TRANSFORMS}")
    self.param_shapes = dict(param_shapes)
    self.ignore = tuple(re.compile(p) for p in ignore)
    self._hf = [(r, r.hf_regex()) for r in self.rules]
    self._ours = [(r, r.ours_regex()) for r in self.rules]

  def rule_for_param(self, path: str) -> tuple[Rule, dict[str, str]]:
    for rule, regex in self._ours:
      m = regex.match(path)
      if m:
        return rule, m.groupdict()
    raise KeyError(f"no checkpoint rule for parameter {path!r}")

  def hf_names(self, path: str) -> Iterator[tuple[str, int | None, Rule]]:
    """HF tensor names of one of our params: ``(name, expert or None, rule)``."""
    rule, groups = self.rule_for_param(path)
    if rule.stacked:
      for e in range(self.param_shapes[path][0]):
        yield rule.hf.format(expert=e, **groups), e, rule
    else:
      yield rule.hf.format(**groups), None, rule

  def expected(self) -> dict[str, Target]:
    """Every HF tensor name this model needs -> where it goes."""
    out = {}
    for path in self.param_shapes:
      for name, expert, rule in self.hf_names(path):
        out[name] = Target(path, expert, rule.transform)
    return out

  def hf_shape(self, target: Target) -> tuple[int, ...]:
    shape = self.param_shapes[target.path]
    if target.expert is not None:
      shape = shape[1:]
    return tuple(reversed(shape)) if target.transform == "transpose" else tuple(shape)

  def fused_parts(self, name: str) -> tuple[FusedRule, list[str]] | None:
    """The fused rule an HF tensor name matches and the param paths it holds, else None."""
    for rule in self.fused_rules:
      m = rule.hf_regex().match(name)
      if m:
        paths = [p.format(**m.groupdict()) for p in rule.parts]
        if all(p in self.param_shapes for p in paths):
          return rule, paths
    return None

  def unfuse(self, present: dict[str, tuple[int, ...]]
             ) -> tuple[dict[str, tuple[int, ...]], dict[str, list[tuple[str, int, int]]],
                        list[str]]:
    """Fused tensors of a checkpoint replaced by the per-expert names they stand for.

    Args:
      present: HF name -> shape of every tensor in the checkpoint.

    Returns:
      ``(present, fused, problems)``: the names as if stored per expert; for each fused name
      the ``(param path, start, stop)`` slices along its rule's axis; and its problems (a
      fused tensor of the wrong shape, a param given both fused and per expert).
    """
    present = dict(present)
    fused, problems = {}, []
    expected = self.expected()
    for name in sorted(present):
      found = self.fused_parts(name)
      if found is None:
        continue
      rule, paths = found
      shape = present.pop(name)
      shapes = [self.param_shapes[p] for p in paths]
      want = list(shapes[0])
      want[rule.axis] = sum(s[rule.axis] for s in shapes)
      if tuple(shape) != tuple(want):
        problems.append(f"wrong shape for {name}: expected {want} ({', '.join(paths)} "
                        f"concatenated along axis {rule.axis}), got {list(shape)}")
      slices, start = [], 0
      for p, s in zip(paths, shapes):
        slices.append((p, start, start + s[rule.axis]))
        start += s[rule.axis]
      fused[name] = slices
      for hf_name, target in expected.items():
        if target.path in paths:
          if hf_name in present:
            problems.append(f"tensor {hf_name} is given twice: per expert and in {name}")
          present[hf_name] = self.hf_shape(target)
    return present, fused, problems

  def is_ignored(self, name: str) -> bool:
    return any(p.search(name) for p in self.ignore)

  def table(self) -> list[tuple[str, str, str]]:
    """The rules as rows ``(hf pattern, our path, transform)`` (for docs)."""
    return [(r.hf, r.ours, r.transform) for r in self.rules]


def common_rules(*, post_attn_name: str) -> list[Rule]:
  """Rules shared by the Qwen3 and Gemma 3 layouts.

  Args:
    post_attn_name: our module that HF ``post_attention_layernorm`` maps to: the pre-MLP norm
      for Qwen (``mlp_norm``), the norm after attention for Gemma (``post_attn_norm``).
  """
  layer = "model.layers.{layer}"
  ours = "layers.{layer}"
  rules = [
      Rule("model.embed_tokens.weight", "embed_tokens.embedding"),
      Rule("model.norm.weight", "norm.weight"),
      Rule("lm_head.weight", "lm_head.kernel"),
      Rule(f"{layer}.input_layernorm.weight", f"{ours}.attn_norm.weight"),
      Rule(f"{layer}.post_attention_layernorm.weight", f"{ours}.{post_attn_name}.weight"),
      Rule(f"{layer}.self_attn.q_norm.weight", f"{ours}.attn.q_norm.weight"),
      Rule(f"{layer}.self_attn.k_norm.weight", f"{ours}.attn.k_norm.weight"),
  ]
  for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
    rules.append(Rule(f"{layer}.self_attn.{proj}.weight", f"{ours}.attn.{proj}.kernel"))
    rules.append(Rule(f"{layer}.self_attn.{proj}.bias", f"{ours}.attn.{proj}.bias"))
  for proj in ("gate_proj", "up_proj", "down_proj"):
    rules.append(Rule(f"{layer}.mlp.{proj}.weight", f"{ours}.mlp.{proj}.kernel"))
  return rules


def moe_rules() -> list[Rule]:
  layer = "model.layers.{layer}.mlp"
  ours = "layers.{layer}.mlp"
  rules = [Rule(f"{layer}.gate.weight", f"{ours}.router")]
  for proj in ("gate_proj", "up_proj", "down_proj"):
    rules.append(Rule(f"{layer}.experts.{{expert}}.{proj}.weight", f"{ours}.{proj}"))
  return rules


def fused_moe_rules() -> list[FusedRule]:
  """The fused expert tensors of transformers' MoE layout (``experts.gate_up_proj [E, 2I, H]``,
  gate rows first; ``experts.down_proj [E, H, I]``), as the released checkpoints store them."""
  layer = "model.layers.{layer}.mlp"
  ours = "layers.{layer}.mlp"
  return [FusedRule(f"{layer}.experts.gate_up_proj", (f"{ours}.gate_proj", f"{ours}.up_proj"),
                    axis=1),
          FusedRule(f"{layer}.experts.down_proj", (f"{ours}.down_proj",), axis=1)]


# Tensors some checkpoints carry that are derived, not parameters.
IGNORED = (r"rotary_emb\.inv_freq$",)
