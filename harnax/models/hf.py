"""Hugging Face directories <-> NNX models: architecture registry, loading and saving.

Loading reads every shard header first, checks the whole checkpoint against the model's
mapping (collecting *all* missing / unexpected / wrong-shape tensors into one error), then
reads tensors shard by shard from memory maps, converting each to a device array right away
(optionally straight into its sharded layout), so the host never holds a second full copy.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any
from typing import Mapping as TMapping

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax.models import gemma3
from harnax.models import gemma4
from harnax.models import mapping
from harnax.models import qwen3
from harnax.models import qwen3_5
from harnax.models import qwen3_moe
from harnax.models import safetensors_io
from harnax.models.config import DecoderConfig
from harnax.models.gemma4_layers import Gemma4CausalLM
from harnax.models.model import CausalLM

FAMILIES = {
    qwen3.ARCHITECTURE: (qwen3.Qwen3Config, qwen3.rules),
    qwen3_moe.ARCHITECTURE: (qwen3_moe.Qwen3MoeConfig, qwen3_moe.rules),
    gemma3.ARCHITECTURE: (gemma3.Gemma3Config, gemma3.rules),
    gemma4.ARCHITECTURE: (gemma4.Gemma4Config, gemma4.rules),
    qwen3_5.ARCHITECTURE: (qwen3_5.Qwen35Config, qwen3_5.rules),
    qwen3_5.MOE_ARCHITECTURE: (qwen3_5.Qwen35MoeConfig, qwen3_5.rules),
}
MODEL_TYPES = {qwen3.MODEL_TYPE: qwen3.ARCHITECTURE, qwen3_moe.MODEL_TYPE: qwen3_moe.ARCHITECTURE,
               gemma3.MODEL_TYPE: gemma3.ARCHITECTURE, gemma4.MODEL_TYPE: gemma4.ARCHITECTURE,
               qwen3_5.MODEL_TYPE: qwen3_5.ARCHITECTURE,
               qwen3_5.MOE_MODEL_TYPE: qwen3_5.MOE_ARCHITECTURE}
# Families whose model is not the shared CausalLM (a subclass of it).
MODEL_CLASSES = {gemma4.ARCHITECTURE: Gemma4CausalLM}
# Multimodal wrappers whose language model we load (text only; the vision tower is skipped).
MULTIMODAL = {"Gemma3ForConditionalGeneration": gemma3.ARCHITECTURE,
              gemma4.MULTIMODAL_ARCHITECTURE: gemma4.ARCHITECTURE,
              "Qwen3_5ForConditionalGeneration": qwen3_5.ARCHITECTURE,
              "Qwen3_5MoeForConditionalGeneration": qwen3_5.MOE_ARCHITECTURE}
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                    "model.multi_modal_projector.",
                    # Gemma 4: vision and audio towers and their embedders
                    "model.embed_vision.", "model.audio_tower.", "model.embed_audio.",
                    # Qwen3.5: the vision encoder and the multi-token-prediction head
                    "model.visual.", "mtp.")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
  """A checkpoint does not match the model; ``problems`` lists every mismatch."""

  def __init__(self, path: str, problems: list[str]):
    self.problems = problems
    super().__init__(f"checkpoint {path} does not match the model ({len(problems)} problems):\n  "
                     + "\n  ".join(problems))


def architecture_of(d: TMapping[str, Any]) -> str:
  """Supported architecture name of a config dict (``architectures`` first, then ``model_type``)."""
  archs = d.get("architectures") or []
  for arch in archs:
    if arch in FAMILIES or arch in MULTIMODAL:
      return arch
  if not archs and d.get("model_type") in MODEL_TYPES:
    return MODEL_TYPES[d["model_type"]]
  raise ValueError(f"config.architectures: unsupported architecture {archs or None} "
                   f"(model_type={d.get('model_type')!r}); supported: "
                   f"{sorted(FAMILIES) + sorted(MULTIMODAL)}")


def config_from_hf_dict(d: TMapping[str, Any]) -> DecoderConfig:
  """Family config from a ``config.json`` dict, dispatched on the architecture.

  For a multimodal wrapper (``Gemma3ForConditionalGeneration``) this is the config of its
  language model, which saves back as the text-only architecture.
  """
  arch = architecture_of(d)
  if arch in MULTIMODAL:
    text = dict(d.get("text_config") or {})
    text.setdefault("tie_word_embeddings", d.get("tie_word_embeddings", True))
    model_type = {a: t for t, a in MODEL_TYPES.items()}[MULTIMODAL[arch]]
    text.update(architectures=[MULTIMODAL[arch]], model_type=model_type)
    return config_from_hf_dict(text)
  return FAMILIES[arch][0].from_hf_dict(d)


def text_tensor_name(name: str, multimodal: bool) -> str | None:
  """Checkpoint name -> the text-model name the rules use; None for a vision tensor."""
  if not multimodal:
    return name
  if name.startswith(_VISION_PREFIXES):
    return None
  for old, new in _TEXT_PREFIXES:
    if name.startswith(old):
      return new + name[len(old):]
  return name


def model_class(cfg: DecoderConfig) -> type[CausalLM]:
  """The model class of a config's family (``CausalLM`` or a subclass)."""
  return MODEL_CLASSES.get(cfg.architecture, CausalLM)


def rules_for(cfg: DecoderConfig) -> list[mapping.Rule]:
  return FAMILIES[cfg.architecture][1](cfg)


def _param_shapes(state) -> dict[str, tuple[int, ...]]:
  return {mapping.path_str(p): tuple(v.get_value().shape) for p, v in nnx.to_flat_state(state)}


def model_mapping(cfg: DecoderConfig, state) -> mapping.Mapping:
  ignore = mapping.IGNORED + tuple(getattr(cfg, "ignored_tensors", ()))
  return mapping.Mapping(rules_for(cfg), _param_shapes(state), ignore=ignore)


def _shard_files(path: str) -> list[str]:
  index = os.path.join(path, INDEX_FILE)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return sorted(set(weight_map.values()))
  if os.path.exists(os.path.join(path, SINGLE_FILE)):
    return [SINGLE_FILE]
  raise FileNotFoundError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


def check_checkpoint(m: mapping.Mapping, present: dict[str, tuple[int, ...]], *,
                     tied: bool) -> list[str]:
  """All problems of a checkpoint (name -> shape) against a mapping; empty when it fits."""
  expected = m.expected()
  problems = []
  for name in sorted(set(expected) - set(present)):
    problems.append(f"missing tensor {name} (for {expected[name].path})")
  for name in sorted(set(present) - set(expected)):
    if m.is_ignored(name) or (tied and name == "lm_head.weight"):
      continue  # derived buffers / a redundant copy of a tied embedding
    problems.append(f"unexpected tensor {name} {list(present[name])}")
  for name in sorted(set(present) & set(expected)):
    want = m.hf_shape(expected[name])
    if tuple(present[name]) != want:
      problems.append(f"wrong shape for {name}: expected {list(want)}, got {list(present[name])}")
  return problems


def abstract_model(cfg: DecoderConfig, *, param_dtype=jnp.float32, moe_impl: str = "auto"):
  """The model with ``ShapeDtypeStruct`` leaves: costs nothing, for shapes and param counts."""
  cls = model_class(cfg)
  return nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype,
                                    moe_impl=moe_impl))


def load_pretrained(path: str, *, dtype=jnp.float32, mesh=None, rules=None,
                    moe_impl: str = "auto") -> CausalLM:
  """Loads a Hugging Face model directory into a :class:`CausalLM`.

  Args:
    path: directory with ``config.json`` and ``model.safetensors`` or sharded
      ``model-0000x-of-0000y.safetensors`` + ``model.safetensors.index.json``.
    dtype: parameter dtype (default float32).
    mesh: optional ``jax.sharding.Mesh``; each parameter is placed directly in the layout
      given by its logical axes and ``rules`` (default ``harnax.parallel.DEFAULT_RULES``).
    moe_impl: ``"auto"`` (default), ``"ragged"`` (grouped matmuls), ``"sorted"`` (sort by
      expert, capacity slots plus an exact overflow loop), ``"dense"`` (every expert on every
      token) or ``"gather"`` (gather the routed experts' weights); see docs/models.md.

  On CPU, tensors are read into aligned host buffers that the parameters then use in place,
  so loading holds one copy of the weights.

  Raises:
    ValueError: unsupported architecture or a config field out of range.
    CheckpointError: the tensors do not match the model (lists all mismatches).
  """
  with open(os.path.join(path, "config.json")) as f:
    raw = json.load(f)
  cfg = config_from_hf_dict(raw)
  multimodal = architecture_of(raw) in MULTIMODAL
  graphdef, state = nnx.split(abstract_model(cfg, param_dtype=dtype, moe_impl=moe_impl))
  m = model_mapping(cfg, state)
  expected = m.expected()
  files = _shard_files(path)
  present = {}
  for file in files:
    for name, shape in safetensors_io.tensor_shapes(os.path.join(path, file)).items():
      text_name = text_tensor_name(name, multimodal)
      if text_name is not None:
        present[text_name] = shape
  present, fused, problems = m.unfuse(present)
  problems += check_checkpoint(m, present, tied=cfg.tie_word_embeddings)
  if problems:
    raise CheckpointError(path, problems)

  flat = dict(nnx.to_flat_state(state))
  by_str = {mapping.path_str(p): p for p in flat}
  shardings = _shardings(flat, mesh, rules) if mesh is not None else {}
  loaded: dict[tuple, jax.Array] = {}
  partial: dict[str, tuple[np.ndarray, int]] = {}  # stacked expert tensors being filled

  def place(path_s: str, array: np.ndarray):
    p = by_str[path_s]
    # device_put (unlike jnp.asarray) adopts an aligned host buffer on CPU without a copy.
    loaded[p] = jax.device_put(array, shardings.get(p))

  np_dtype = np.dtype(jnp.dtype(dtype))
  for file in files:
    file_names = {n: text_tensor_name(n, multimodal)
                  for n in safetensors_io.tensor_shapes(os.path.join(path, file))}
    names = [n for n, text_name in file_names.items()
             if text_name in expected or text_name in fused]
    for name, tensor in safetensors_io.iter_tensors(os.path.join(path, file), names):
      if file_names[name] in fused:  # several stacked params at once: slice each out
        rule, _ = m.fused_parts(file_names[name])
        for path_s, start, stop in fused[file_names[name]]:
          part = np.take(tensor, np.arange(start, stop), axis=rule.axis)
          converted = safetensors_io.aligned_empty(part.shape, np_dtype)
          converted[...] = part
          place(path_s, converted)
        continue
      target = expected[file_names[name]]
      array = mapping.from_hf(tensor, target.transform)
      if target.expert is None:
        if array.dtype != np_dtype or not array.flags.c_contiguous:
          converted = safetensors_io.aligned_empty(array.shape, np_dtype)
          converted[...] = array
          array = converted
        place(target.path, array)
        continue
      shape = m.param_shapes[target.path]
      buf, count = partial.get(target.path, (None, 0))
      if buf is None:
        buf = safetensors_io.aligned_empty(shape, np_dtype)
      buf[target.expert] = array
      partial[target.path] = (buf, count + 1)
      if count + 1 == shape[0]:
        place(target.path, buf)
        del partial[target.path]
  new_state = nnx.from_flat_state([(p, v.replace(value=loaded[p])) for p, v in flat.items()])
  return nnx.merge(graphdef, new_state)


def _shardings(flat, mesh, rules):
  from harnax import parallel  # local import: sharding is optional at load time
  rules = parallel.DEFAULT_RULES if rules is None else rules
  out = {}
  for p, v in flat.items():
    axes = v.get_metadata().get("axes")
    spec = parallel.logical_to_spec(axes, v.get_value().shape, mesh, rules)
    out[p] = jax.sharding.NamedSharding(mesh, spec)
  return out


def _hf_tensors(model: CausalLM, m: mapping.Mapping, dtype):
  """Yields ``(hf_name, nbytes, thunk)``; the thunk materialises the numpy tensor on demand."""
  flat = {mapping.path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for path_s, var in flat.items():
    for name, expert, rule in m.hf_names(path_s):
      shape = m.param_shapes[path_s][1:] if expert is not None else m.param_shapes[path_s]
      out_dtype = np.dtype(jnp.dtype(dtype or var.get_value().dtype))
      nbytes = math.prod(shape) * out_dtype.itemsize

      def thunk(var=var, expert=expert, rule=rule, out_dtype=out_dtype):
        value = var.get_value()
        array = np.asarray(value[expert] if expert is not None else value)
        return np.ascontiguousarray(mapping.to_hf(array, rule.transform)).astype(out_dtype)

      yield name, nbytes, thunk


def save_pretrained(model: CausalLM, path: str, *, max_shard_bytes: int = 4 * 1024**3,
                    dtype=None) -> None:
  """Writes ``model`` as a Hugging Face directory that transformers can load.

  Writes ``config.json`` and ``model.safetensors``, or, above ``max_shard_bytes``, shards
  ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``. Shards are
  materialised one at a time. ``dtype`` optionally casts the saved tensors.
  """
  os.makedirs(path, exist_ok=True)
  cfg = model.config
  m = model_mapping(cfg, nnx.state(model, nnx.Param))
  tensors = list(_hf_tensors(model, m, dtype))
  shards: list[list] = [[]]
  size = 0
  for item in tensors:
    if shards[-1] and size + item[1] > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(item)
    size += item[1]
  n = len(shards)
  weight_map = {}
  for i, shard in enumerate(shards):
    file = SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    safetensors_io.write(os.path.join(path, file), {name: thunk() for name, _, thunk in shard})
    weight_map.update({name: file for name, _, _ in shard})
  if n > 1:
    index = {"metadata": {"total_size": sum(t[1] for t in tensors)}, "weight_map": weight_map}
    with open(os.path.join(path, INDEX_FILE), "w") as f:
      json.dump(index, f, indent=2, sort_keys=True)
  elif os.path.exists(os.path.join(path, INDEX_FILE)):
    os.remove(os.path.join(path, INDEX_FILE))
  hf = cfg.to_hf_dict()
  hf["dtype"] = str(np.dtype(jnp.dtype(dtype or model.dtype)))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)


def from_config(cfg: DecoderConfig, *, seed: int = 0, param_dtype=jnp.float32,
                moe_impl: str = "auto") -> CausalLM:
  """A randomly initialised model (tests, benchmarks)."""
  return model_class(cfg)(cfg, rngs=nnx.Rngs(seed), param_dtype=param_dtype, moe_impl=moe_impl)
