"""LoRA as a parameter transform: low-rank adapters merged into chosen 2-D kernels.

No new module: for every 2-D floating kernel `W` whose path matches a regular expression, an
adapter pair `A [in, r]`, `B [r, out]` is added, and the model runs on the merged parameters

  W' = W + (alpha / r) * (A @ B)        (`[in, out]` kernels)
  W' = W + (alpha / r) * (A @ B)^T      (`[out, in]` kernels, harnax's `Linear` layout)

`A` is random normal with standard deviation `1 / sqrt(in)` (seeded), `B` is zero, so the
merged parameters start equal to the base ones. Only `A` and `B` are trained: the gradient of
an objective with respect to them is the pullback of its gradient with respect to the merged
parameters through `merge_lora` (`jax.vjp`), which is what `harnax.train.train` does with
`finetune="lora"`.

Parameter paths are the keys of the pytree joined by `/` (an `nnx.Variable`'s own `value`
attribute left out), e.g. `layers/0/attn/q_proj/kernel` for an `nnx.State` of a
`harnax.models.CausalLM`; `param_names` lists them.
"""

from __future__ import annotations

import math
import numbers
import re

import jax
import jax.numpy as jnp

Array = jax.Array
Adapters = dict[str, dict[str, Array]]

# Kernel layouts: harnax's `Linear` stores `[out, in]` (the HF `nn.Linear.weight`).
LAYOUTS = ("out_in", "in_out")


def path_name(path) -> str:
  """`a/b/0/c`: a pytree key path as a string (an `nnx.Variable`'s `value` key dropped)."""
  parts = []
  for entry in path:
    if isinstance(entry, jax.tree_util.DictKey):
      parts.append(str(entry.key))
    elif isinstance(entry, jax.tree_util.SequenceKey):
      parts.append(str(entry.idx))
    elif isinstance(entry, jax.tree_util.GetAttrKey):
      if entry.name != "value":
        parts.append(entry.name)
    elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
      parts.append(str(entry.key))
    else:
      parts.append(str(entry))
  return "/".join(parts)


def param_names(params) -> list[str]:
  """The path name of every leaf of `params`, in `jax.tree.leaves` order."""
  return [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def check_rank(rank) -> int:
  """`rank` as an int; a ValueError naming `rank` unless it is a positive integer."""
  if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
    raise ValueError(f"rank: expected a positive integer, got {rank!r}")
  return int(rank)


def _check_alpha(alpha) -> float:
  if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)
      or not math.isfinite(alpha) or alpha <= 0):
    raise ValueError(f"alpha: expected a positive finite number, got {alpha!r}")
  return float(alpha)


def _check_layout(layout) -> str:
  if layout not in LAYOUTS:
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
  return layout


def compile_targets(targets) -> re.Pattern:
  """`targets` compiled; a ValueError naming `targets` when it is not a valid regex."""
  if not isinstance(targets, str) or not targets:
    raise ValueError(f"targets: expected a non-empty regular expression string, got {targets!r}")
  try:
    return re.compile(targets)
  except re.error as e:
    raise ValueError(f"targets: {targets!r} is not a valid regular expression ({e})") from None


def target_names(params, targets: str) -> list[str]:
  """Names of the 2-D floating leaves of `params` whose path matches `targets` (`re.search`).

  Raises:
    ValueError: `targets` is not a regex, or it matches no 2-D floating parameter.
  """
  pattern = compile_targets(targets)
  names, leaves = param_names(params), jax.tree.leaves(params)
  matched = [(n, x) for n, x in zip(names, leaves) if pattern.search(n)]
  chosen = [n for n, x in matched
            if jnp.ndim(x) == 2 and jnp.issubdtype(jnp.result_type(x), jnp.floating)]
  if not chosen:
    if matched:
      shapes = ", ".join(f"{n} {list(jnp.shape(x))}" for n, x in matched[:4])
      more = ", ..." if len(matched) > 4 else ""
      raise ValueError(f"targets: {targets!r} matches no 2-D floating kernel (it matches "
                       f"{len(matched)} other parameters: {shapes}{more})")
    examples = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    raise ValueError(f"targets: {targets!r} matches no parameter path (paths look like: "
                     f"{examples})")
  return chosen


def _dims(shape, layout: str) -> tuple[int, int]:
  """(in, out) of a 2-D kernel."""
  return (shape[1], shape[0]) if layout == "out_in" else (shape[0], shape[1])


def init_lora(params, *, rank: int, targets: str, key, layout: str = "out_in") -> Adapters:
  """Adapters for every 2-D kernel of `params` whose path matches `targets`.

  Args:
    params: the base parameters (any pytree, e.g. the `nnx.State` of a model).
    rank: r, the adapters' inner dimension.
    targets: a regular expression searched in each parameter path (`param_names`).
    key: a `jax.random.key`; adapter `i` (in path order) draws from `fold_in(key, i)`.
    layout: `"out_in"` (harnax `Linear`, `[out, in]`) or `"in_out"` kernels.

  Returns:
    `{path: {"a": [in, r], "b": [r, out]}}`: `a` normal with standard deviation
    `1 / sqrt(in)`, `b` zeros, both in the kernel's dtype promoted to at least float32.
  """
  rank = check_rank(rank)
  layout = _check_layout(layout)
  chosen = set(target_names(params, targets))
  out: Adapters = {}
  for name, x in zip(param_names(params), jax.tree.leaves(params)):
    if name not in chosen:
      continue
    d_in, d_out = _dims(jnp.shape(x), layout)
    dtype = jnp.promote_types(jnp.result_type(x), jnp.float32)
    k = jax.random.fold_in(key, len(out))
    a = jax.random.normal(k, (d_in, rank), jnp.float32).astype(dtype) / math.sqrt(d_in)
    out[name] = {"a": a, "b": jnp.zeros((rank, d_out), dtype)}
  return out


def lora_delta(a: Array, b: Array, *, alpha: float, rank: int, layout: str = "out_in") -> Array:
  """`(alpha / r) * A @ B` in the kernel's layout: `[out, in]` or `[in, out]`."""
  delta = (alpha / rank) * (a @ b)
  return delta.T if layout == "out_in" else delta


def merge_lora(params, adapters: Adapters, *, alpha: float, rank: int,
               layout: str = "out_in"):
  """`params` with every adapted kernel replaced by `W + (alpha / r) * A @ B` (laid out).

  Differentiable in `params` and `adapters`; the structure and dtypes of `params` are kept
  (the update is computed in the wider of the two dtypes and cast to the kernel's).

  Args:
    params: the base parameters.
    adapters: from `init_lora` (or trained): `{path: {"a": [in, r], "b": [r, out]}}`.
    alpha: the LoRA scale numerator (> 0).
    rank: r (> 0), the adapters' inner dimension.
    layout: as in `init_lora`.

  Raises:
    ValueError: an adapter names no parameter or has the wrong shape.
  """
  alpha, rank, layout = _check_alpha(alpha), check_rank(rank), _check_layout(layout)
  if not isinstance(adapters, dict):
    raise ValueError(f"adapters: expected a dict {{path: {{'a', 'b'}}}}, got "
                     f"{type(adapters).__name__}")
  names = set(param_names(params))
  unknown = sorted(set(adapters) - names)
  if unknown:
    raise ValueError(f"adapters: no parameter of params is named {unknown[:4]}")

  def merge(path, w):
    name = path_name(path)
    if name not in adapters:
      return w
    ad = adapters[name]
    if not isinstance(ad, dict) or set(ad) != {"a", "b"}:
      raise ValueError(f"adapters[{name!r}]: expected a dict with keys 'a' and 'b'")
    if jnp.ndim(w) != 2:
      raise ValueError(f"adapters[{name!r}]: the parameter has shape {list(jnp.shape(w))}; "
                       "LoRA adapts 2-D kernels only")
    d_in, d_out = _dims(jnp.shape(w), layout)
    a, b = ad["a"], ad["b"]
    if jnp.shape(a) != (d_in, rank) or jnp.shape(b) != (rank, d_out):
      raise ValueError(f"adapters[{name!r}]: expected a [{d_in}, {rank}] and b [{rank}, {d_out}] "
                       f"for a {layout} kernel {list(jnp.shape(w))} at rank {rank}, got "
                       f"{list(jnp.shape(a))} and {list(jnp.shape(b))}")
    wide = jnp.promote_types(jnp.result_type(w), jnp.result_type(a))
    delta = lora_delta(a.astype(wide), b.astype(wide), alpha=alpha, rank=rank, layout=layout)
    return (w.astype(wide) + delta).astype(jnp.result_type(w))

  return jax.tree_util.tree_map_with_path(merge, params)
