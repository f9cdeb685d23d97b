"""A config-driven training loop for any exact-gradient objective.

The loop maximizes an objective it knows only through

  value_and_grad_fn(params, batch) -> (value, grads, metrics)

`value` is the scalar to MAXIMIZE (e.g. the exact regularized return of a language model
behind a harness, `harnax.policies.lm.exact_value_and_grad`), `grads` its gradient with
respect to the full parameter pytree (same structure as `params`), `metrics` a dict of
scalars to log. optax minimizes, so the optimizer is fed `-grads`. The loop never looks
inside: language models, tabular policies and MDPs are all the same to it.

What it adds around the function (docs/training.md):

* the optimizer from a config (`make_optimizer`: clipping, schedule, adam / adamw / sgd);
* full fine-tuning or LoRA (`finetune="lora"`: adapters on the kernels whose path matches
  `lora_targets`, trained through `harnax.train.lora.merge_lora` by `jax.vjp`);
* a compute dtype (`"bfloat16"`: the function sees bf16 parameters; master weights and
  optimizer state stay float32);
* placement on a `(data, fsdp, tensor)` mesh: parameters by their logical `axes` metadata
  (`harnax.parallel`), the batch's leading axis over `data`, one jitted step;
* metrics as JSON lines in `workdir/metrics.jsonl` and a progress line on stderr;
* orbax checkpoints under `workdir/checkpoints` with exact resume: a run stopped anywhere
  and restarted on the same workdir ends bit-identical to an uninterrupted one.

Step numbering: step `s` (0-based) is the update that starts from the parameters after `s`
updates; its metrics line carries `J` at those parameters. The checkpoint labelled `k` holds
the state after `k` updates.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import sys
import time
from typing import Any, Callable, Mapping, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import ml_collections
import numpy as np
import optax

from harnax import parallel
from harnax.train import lora as lora_lib

Array = jax.Array
ValueAndGradFn = Callable[[Any, Any], tuple[Array, Any, Mapping[str, Array]]]

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "warmup_cosine")
FINETUNE = ("full", "lora")
COMPUTE_DTYPES = ("float32", "bfloat16")
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
# Names the loop writes itself; the function's metrics may not reuse them.
RESERVED_METRICS = ("step", "value", "grad_norm", "learning_rate", "step_time")
# Fields that change the trajectory: a resume with other values would not be exact.
_TRAJECTORY_FIELDS = ("optimizer", "learning_rate", "schedule", "warmup_steps", "weight_decay",
                      "grad_clip_norm", "seed", "finetune", "lora_rank", "lora_alpha",
                      "lora_targets", "lora_layout", "compute_dtype")


def default_config() -> ml_collections.ConfigDict:
  """The loop's configuration with its defaults (every field is documented in docs/training.md).

  Fields:
    optimizer: `"adam"`, `"adamw"` or `"sgd"`.
    learning_rate: peak step size (> 0).
    schedule: `"constant"`, `"cosine"` (decay to 0 over `num_steps`) or `"warmup_cosine"`
      (linear warmup from 0 over `warmup_steps`, then cosine decay to 0).
    warmup_steps: warmup length (steps; only with `"warmup_cosine"`).
    weight_decay: decoupled weight decay (only with `"adamw"`).
    grad_clip_norm: clip the gradient to this global norm; None or 0 = off.
    num_steps: total number of updates (> 0).
    seed: seeds the loop's key (LoRA's initial `A`; saved in checkpoints).
    checkpoint_every: write a checkpoint every k updates (0: only at the end).
    keep_checkpoints: how many of the latest checkpoints to keep (>= 1).
    keep_steps: steps (>= 1) whose checkpoints are also written and kept for good, whatever
      `checkpoint_every` and `keep_checkpoints` say: the points of a learning curve
      (`restore_params` reads them back).
    log_every: without a progress bar, one log line every k steps (0: none).
    finetune: `"full"` or `"lora"`.
    lora_rank, lora_alpha: the adapters' rank r and scale numerator (update
      `(alpha / r) A @ B`).
    lora_targets: regular expression searched in parameter paths (`a/b/0/kernel`); every
      matching 2-D kernel gets adapters.
    lora_layout: `"out_in"` (harnax `Linear` kernels, `[out, in]`) or `"in_out"`.
    compute_dtype: `"float32"` (the function sees the master weights) or `"bfloat16"`.
    mesh: sizes of the `data`, `fsdp`, `tensor` mesh axes; one may be -1 (all remaining
      devices). Default: every device on `data`.
    distributed: call `jax.distributed.initialize()` first (multi-host; every host runs the
      same program).
  """
  c = ml_collections.ConfigDict()
  c.optimizer = "adam"
  c.learning_rate = 1e-3
  c.schedule = "constant"
  c.warmup_steps = 0
  c.weight_decay = 0.0
  c.grad_clip_norm = None
  c.num_steps = 100
  c.seed = 0
  c.checkpoint_every = 100
  c.keep_checkpoints = 3
  c.keep_steps = ()
  c.log_every = 10
  c.finetune = "full"
  c.lora_rank = 8
  c.lora_alpha = 16.0
  c.lora_targets = r"(attn|mlp)/\w+_proj/kernel$"
  c.lora_layout = "out_in"
  c.compute_dtype = "float32"
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  c.distributed = False
  return c


# -- configuration ----------------------------------------------------------------------------


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _int_field(c, name: str, minimum: int) -> None:
  value = c[name]
  if not _is_int(value) or value < minimum:
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise ValueError(f"config.{name}: expected {what}, got {value!r}")


def _choice_field(c, name: str, choices) -> None:
  if c[name] not in choices:
    raise ValueError(f"config.{name}: expected one of {choices}, got {c[name]!r}")


def check_config(config) -> ml_collections.ConfigDict:
  """`config` over `default_config()`, validated; a ValueError naming the first bad field.

  Args:
    config: a `ConfigDict` or dict holding any subset of `default_config()`'s fields.

  Returns:
    A new `ConfigDict` with every field (missing ones at their defaults).
  """
  if not isinstance(config, (ml_collections.ConfigDict, Mapping)):
    raise ValueError(f"config: expected a ConfigDict or dict, got {type(config).__name__}")
  merged = default_config().to_dict()
  given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  for key, value in given.items():
    if key not in merged:
      raise ValueError(f"config.{key}: unknown field; known fields: {sorted(merged)}")
    if key != "mesh":
      merged[key] = value
      continue
    if isinstance(value, ml_collections.ConfigDict):
      value = value.to_dict()
    if not isinstance(value, Mapping):
      raise ValueError(f"config.mesh: expected a dict of axis sizes, got {value!r}")
    for axis, size in value.items():
      if axis not in parallel.MESH_AXES:
        raise ValueError(f"config.mesh.{axis}: unknown mesh axis; expected one of "
                         f"{parallel.MESH_AXES}")
      if not _is_int(size) or (size < 1 and size != -1):
        raise ValueError(f"config.mesh.{axis}: expected a positive integer or -1, got {size!r}")
      merged["mesh"][axis] = int(size)
  # A fresh ConfigDict: its types come from the values (bad ones get our messages below).
  c = ml_collections.ConfigDict(merged)
  if sum(1 for a in parallel.MESH_AXES if c.mesh[a] == -1) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {c.mesh.to_dict()}")
  _choice_field(c, "optimizer", OPTIMIZERS)
  _choice_field(c, "schedule", SCHEDULES)
  _choice_field(c, "finetune", FINETUNE)
  _choice_field(c, "compute_dtype", COMPUTE_DTYPES)
  _choice_field(c, "lora_layout", lora_lib.LAYOUTS)
  if not _is_real(c.learning_rate) or c.learning_rate <= 0:
    raise ValueError(f"config.learning_rate: expected a positive number, got "
                     f"{c.learning_rate!r}")
  _int_field(c, "num_steps", 1)
  _int_field(c, "seed", 0)
  _int_field(c, "warmup_steps", 0)
  _int_field(c, "checkpoint_every", 0)
  _int_field(c, "keep_checkpoints", 1)
  keep = c.keep_steps
  if (isinstance(keep, (str, bytes)) or not isinstance(keep, (tuple, list))
      or not all(_is_int(k) and k >= 1 for k in keep)):
    raise ValueError(f"config.keep_steps: expected a tuple of integers >= 1, got {keep!r}")
  _int_field(c, "log_every", 0)
  if c.schedule == "warmup_cosine":
    if c.warmup_steps >= c.num_steps:
      raise ValueError(f"config.warmup_steps: {c.warmup_steps} leaves no decay within "
                       f"num_steps={c.num_steps}; expected fewer warmup steps than steps")
  elif c.warmup_steps:
    raise ValueError(f"config.warmup_steps: only schedule='warmup_cosine' warms up, got "
                     f"warmup_steps={c.warmup_steps} with schedule={c.schedule!r}")
  if not _is_real(c.weight_decay) or c.weight_decay < 0:
    raise ValueError(f"config.weight_decay: expected a number >= 0, got {c.weight_decay!r}")
  if c.weight_decay and c.optimizer != "adamw":
    raise ValueError(f"config.weight_decay: only optimizer='adamw' decays weights, got "
                     f"weight_decay={c.weight_decay} with optimizer={c.optimizer!r}")
  clip = c.grad_clip_norm
  if clip is not None and (not _is_real(clip) or clip < 0):
    raise ValueError(f"config.grad_clip_norm: expected None, 0 (off) or a positive number, got "
                     f"{clip!r}")
  if c.finetune == "lora":
    _int_field(c, "lora_rank", 1)
    if not _is_real(c.lora_alpha) or c.lora_alpha <= 0:
      raise ValueError(f"config.lora_alpha: expected a positive number, got {c.lora_alpha!r}")
    try:
      lora_lib.compile_targets(c.lora_targets)
    except ValueError as e:
      raise ValueError(f"config.lora_{e}") from None
  if not isinstance(c.distributed, bool):
    raise ValueError(f"config.distributed: expected True or False, got {c.distributed!r}")
  return c


def make_schedule(config) -> optax.Schedule:
  """The learning-rate schedule of `config`: update count -> step size."""
  c = check_config(config)
  lr = float(c.learning_rate)
  if c.schedule == "constant":
    return optax.constant_schedule(lr)
  if c.schedule == "cosine":
    return optax.cosine_decay_schedule(lr, decay_steps=c.num_steps)
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps=c.warmup_steps,
                                            decay_steps=c.num_steps, end_value=0.0)


def make_optimizer(config) -> optax.GradientTransformation:
  """The optax chain of `config`: global-norm clipping (if on), then the scheduled optimizer.

  It minimizes; `train` feeds it the negated gradient of the objective.

  Raises:
    ValueError: a config field is invalid (the message names it).
  """
  c = check_config(config)
  schedule = make_schedule(c)
  parts = []
  if c.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(float(c.grad_clip_norm)))
  if c.optimizer == "adam":
    parts.append(optax.adam(schedule))
  elif c.optimizer == "adamw":
    parts.append(optax.adamw(schedule, weight_decay=float(c.weight_decay)))
  else:
    parts.append(optax.sgd(schedule))
  return optax.chain(*parts)


def initialize_distributed(config) -> bool:
  """`jax.distributed.initialize()` when `config.distributed` (once); returns whether it is on.

  Call it at the top of a multi-host script, before anything touches a device (building
  the parameters does): `train` calls it too, which is only early enough when the
  parameters it receives are host (NumPy) arrays.
  """
  c = check_config(config)
  if c.distributed and not jax.distributed.is_initialized():
    jax.distributed.initialize()
  return c.distributed


def make_mesh(config) -> jax.sharding.Mesh:
  """The `(data, fsdp, tensor)` mesh of `config.mesh` over all devices (-1: the rest)."""
  c = check_config(config)
  n = jax.device_count()
  sizes = {a: c.mesh[a] for a in parallel.MESH_AXES}
  known = math.prod(s for s in sizes.values() if s != -1)
  for a, s in sizes.items():
    if s == -1:
      if n % known:
        raise ValueError(f"config.mesh: {n} devices are not divisible by the other axes' "
                         f"product {known} ({sizes})")
      sizes[a] = n // known
  if math.prod(sizes.values()) != n:
    raise ValueError(f"config.mesh: {sizes} needs {math.prod(sizes.values())} devices, "
                     f"{n} are available")
  return parallel.make_mesh(sizes)


# -- the loop ----------------------------------------------------------------------------------


class TrainResult(NamedTuple):
  """The outcome of `train`.

  Attributes:
    params: the trained parameters, same structure as the input, in the master dtype
      (float32; float64 if they came in float64). With LoRA: the merged parameters.
    history: one dict per step from 0 to the last one run (earlier runs on the workdir
      included): `step`, `value` (J before the update), `grad_norm` (of the trained
      parameters' gradient, before clipping), `learning_rate`, `step_time` (seconds, the
      first step includes compilation) and the function's metrics.
    adapters: with LoRA, the trained adapters `{path: {"a": [in, r], "b": [r, out]}}`;
      None otherwise.
  """

  params: Any
  history: list[dict[str, float]]
  adapters: Any = None


def _variable_axes(params) -> list:
  """The logical `axes` metadata of every leaf (None where there is none)."""
  out = []
  for node in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    n = len(jax.tree.leaves(node))
    axes = node.get_metadata().get("axes") if isinstance(node, nnx.Variable) else None
    out += [tuple(axes) if axes is not None and n == 1 else None] * n
  return out


def _master_dtype(x):
  return jnp.promote_types(jnp.result_type(x), jnp.float32)


def _compute_cast(leaves, compute_dtype: str):
  if compute_dtype == "float32":
    return leaves
  return [x.astype(jnp.bfloat16) for x in leaves]


def _split_output(out, param_leaves, names):
  """(value, grad leaves, metrics) from the function's output, checked at trace time."""
  if not isinstance(out, (tuple, list)) or len(out) != 3:
    raise ValueError("value_and_grad_fn: expected a tuple (value, grads, metrics), got "
                     f"{type(out).__name__}" + (f" of length {len(out)}"
                                                 if isinstance(out, (tuple, list)) else ""))
  value, grads, metrics = out
  if jnp.shape(value) != ():
    raise ValueError(f"value_and_grad_fn: value must be a scalar, got shape "
                     f"{list(jnp.shape(value))}")
  g = jax.tree.leaves(grads)
  if len(g) != len(param_leaves):
    raise ValueError(f"value_and_grad_fn: grads have {len(g)} leaves, the params "
                     f"{len(param_leaves)}; grads must have the params' structure")
  for name, gi, p in zip(names, g, param_leaves):
    if jnp.shape(gi) != jnp.shape(p):
      raise ValueError(f"value_and_grad_fn: the gradient of {name!r} has shape "
                       f"{list(jnp.shape(gi))}, the parameter {list(jnp.shape(p))}")
  metrics = {} if metrics is None else metrics
  if not isinstance(metrics, Mapping):
    raise ValueError(f"value_and_grad_fn: metrics must be a dict of scalars, got "
                     f"{type(metrics).__name__}")
  for k, v in metrics.items():
    if not isinstance(k, str) or k in RESERVED_METRICS:
      raise ValueError(f"value_and_grad_fn: metric name {k!r} is not a string or is reserved "
                       f"for the loop {RESERVED_METRICS}")
    if jnp.shape(v) != ():
      raise ValueError(f"value_and_grad_fn: metric {k!r} must be a scalar, got shape "
                       f"{list(jnp.shape(v))}")
  return value, [gi.astype(p.dtype) for gi, p in zip(g, param_leaves)], dict(metrics)


def _make_step(fn, tx, treedef, names, c, lora_treedef):
  """The jitted update: (trainable, opt_state, rng, base, batch) -> new state and metrics."""
  lora = c.finetune == "lora"

  def full_params(trainable, base):
    if not lora:
      return _compute_cast(trainable, c.compute_dtype)
    merged = lora_lib.merge_lora(jax.tree.unflatten(treedef, base),
                                 jax.tree.unflatten(lora_treedef, trainable),
                                 alpha=float(c.lora_alpha), rank=int(c.lora_rank),
                                 layout=c.lora_layout)
    return _compute_cast(jax.tree.leaves(merged), c.compute_dtype)

  def update(trainable, opt_state, rng, g, value, metrics):
    updates, opt_state = tx.update(jax.tree.map(jnp.negative, g), opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(rng))[0])
    metrics = {"value": value, "grad_norm": optax.tree.norm(g), **metrics}
    return trainable, opt_state, rng, metrics

  def step(trainable, opt_state, rng, base, batch):
    leaves, pullback = jax.vjp(lambda t: full_params(t, base), trainable)
    out = fn(jax.tree.unflatten(treedef, leaves), batch)
    value, grads, metrics = _split_output(out, leaves, names)
    (g,) = pullback(grads)
    return update(trainable, opt_state, rng, g, value, metrics)

  return step, update


def _host_step(fn, c, treedef, names, lora_treedef):
  """The step of a function that is not traceable (it runs its own compiled pieces, e.g.
  `harnax.policies.lm.score_in_chunks`): the parameter transform and the update are jitted,
  the function is called from Python. Same arithmetic as the jitted step."""
  step, update = _make_step(fn, make_optimizer(c), treedef, names, c, lora_treedef)
  del step
  lora = c.finetune == "lora"

  @jax.jit
  def params_and_pullback(trainable, base):
    if not lora:
      return _compute_cast(trainable, c.compute_dtype), None
    merged = lora_lib.merge_lora(jax.tree.unflatten(treedef, base),
                                 jax.tree.unflatten(lora_treedef, trainable),
                                 alpha=float(c.lora_alpha), rank=int(c.lora_rank),
                                 layout=c.lora_layout)
    return _compute_cast(jax.tree.leaves(merged), c.compute_dtype), None

  @jax.jit
  def adapter_grads(trainable, base, grads):
    _, pullback = jax.vjp(lambda t: params_and_pullback(t, base)[0], trainable)
    return pullback(grads)[0]

  jit_update = jax.jit(update, donate_argnums=(0, 1))

  def host_step(trainable, opt_state, rng, base, batch):
    leaves, _ = params_and_pullback(trainable, base)
    out = fn(jax.tree.unflatten(treedef, leaves), batch)
    value, grads, metrics = _split_output(out, leaves, names)
    g = adapter_grads(trainable, base, grads) if lora else [
        gi.astype(t.dtype) for gi, t in zip(grads, trainable)]
    return jit_update(trainable, opt_state, rng, g, value, metrics)

  return host_step


def _jitted_step(fn, c, treedef, names, lora_treedef, t_shardings, opt_shardings, replicated):
  """The jitted step, shared by calls of `train` with the same function and settings.

  A second `train` on the same problem (a resume in the same process, a sweep over
  workdirs) then reuses the compiled program.
  """
  opt_leaves, opt_treedef = jax.tree.flatten(opt_shardings)
  fields = tuple((k, c[k]) for k in _TRAJECTORY_FIELDS + ("num_steps",))
  key = (fn, fields, treedef, tuple(names), lora_treedef, tuple(t_shardings), opt_treedef,
         tuple(opt_leaves), replicated)
  try:
    hash(key)
  except TypeError:  # an unhashable callable: compile for this call only
    return _build_step(*key)
  return _cached_step(*key)


def _build_step(fn, fields, treedef, names, lora_treedef, t_shardings, opt_treedef, opt_leaves,
                replicated):
  c = check_config(dict(fields))
  step, _ = _make_step(fn, make_optimizer(c), treedef, list(names), c, lora_treedef)
  opt_shardings = jax.tree.unflatten(opt_treedef, opt_leaves)
  return jax.jit(step, donate_argnums=(0, 1),
                 out_shardings=(list(t_shardings), opt_shardings, replicated, None))


_cached_step = functools.lru_cache(maxsize=8)(_build_step)


def _place_batch(batch, mesh):
  """Every leaf with a leading axis split over `data`; scalars replicated."""
  n = mesh.shape["data"]

  def check(path, x):
    shape = np.shape(x)
    if shape and shape[0] % n:
      raise ValueError(f"batch{jax.tree_util.keystr(path)}: the leading axis (task instances) "
                       f"is split over {n} devices on the mesh's data axis; got shape "
                       f"{list(shape)}")
    return x

  jax.tree_util.tree_map_with_path(check, batch)
  leaves, treedef = jax.tree.flatten(batch)
  ranked = [i for i, x in enumerate(leaves) if np.ndim(x)]
  placed = list(leaves)
  for i, x in zip(ranked, parallel.shard_batch([leaves[i] for i in ranked], mesh, "data")):
    placed[i] = x
  replicated = NamedSharding(mesh, PartitionSpec())
  for i, x in enumerate(leaves):
    if not np.ndim(x):
      placed[i] = jax.device_put(x, replicated)
  return jax.tree.unflatten(treedef, placed)


def _copy_to(leaves, shardings, dtypes):
  """Fresh device buffers (the step donates them, never the caller's arrays)."""
  fn = jax.jit(lambda xs: [jnp.copy(x.astype(d)) for x, d in zip(xs, dtypes)],
               out_shardings=shardings)
  return fn([jax.device_put(x, s) for x, s in zip(leaves, shardings)])


class _Progress:
  """A one-line progress bar on stderr (`\\r`), or a log line every `log_every` steps."""

  def __init__(self, total: int, start: int, *, bar: bool, log_every: int, enabled: bool):
    self.total, self.start, self.bar = total, start, bar
    self.log_every, self.enabled = log_every, enabled
    self.t0 = time.perf_counter()
    self.width = 24
    self.last = 0

  def update(self, record: dict) -> None:
    if not self.enabled:
      return
    done = record["step"] + 1
    rate = (done - self.start) / max(time.perf_counter() - self.t0, 1e-9)
    if self.bar:
      filled = int(self.width * done / self.total)
      line = (f"train [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total}  "
              f"value {record['value']:.6g}  {rate:.2f} it/s")
      # Spaces over what a longer previous line left behind.
      sys.stderr.write("\r" + line.ljust(self.last))
      sys.stderr.flush()
      self.last = len(line)
    elif self.log_every and (done % self.log_every == 0 or done == self.total):
      extra = "".join(f"  {k} {v:.6g}" for k, v in record.items() if k not in RESERVED_METRICS)
      sys.stderr.write(f"step {done}/{self.total}  value {record['value']:.6g}  grad_norm "
                       f"{record['grad_norm']:.3g}  lr {record['learning_rate']:.3g}{extra}  "
                       f"{rate:.2f} it/s\n")
      sys.stderr.flush()

  def close(self) -> None:
    if self.enabled and self.bar:
      sys.stderr.write("\n")
      sys.stderr.flush()


def _read_metrics(path: str, before: int) -> list[dict]:
  """The records of steps < `before` (a torn last line is dropped)."""
  out = []
  if not os.path.exists(path):
    return out
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(record, dict) and isinstance(record.get("step"), int) and \
          record["step"] < before:
        out.append(record)
  return out


def _write_metrics(path: str, records: list[dict]) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def _orbax():
  # Imported on first use, like harnax.models.checkpoint (orbax is heavy to import).
  import orbax.checkpoint as ocp
  return ocp


def _preservation(ocp, c):
  # The latest `keep_checkpoints`, and every `keep_steps` checkpoint for good.
  policies = ocp.checkpoint_managers
  latest = policies.LatestN(c.keep_checkpoints)
  if not c.keep_steps:
    return latest
  return policies.AnyPreservationPolicy(
      [latest, policies.CustomSteps(sorted({int(k) for k in c.keep_steps}))])


def _checkpoint_tree(names, trainable, opt_names, opt_leaves, step, rng):
  return {"params": dict(zip(names, trainable)), "opt_state": dict(zip(opt_names, opt_leaves)),
          "step": step, "rng": rng}


def _describe(shape, dtype) -> str:
  return f"{list(shape)} {np.dtype(dtype).name}"


def _check_checkpoint(manager, step: int, expected: dict, directory: str) -> None:
  """A ValueError naming the first leaf whose tree path, shape or dtype differs."""
  meta = manager.metadata(step).item_metadata
  meta = getattr(meta, "tree", meta)
  where = f"the checkpoint at step {step} in {directory}"
  if not isinstance(meta, Mapping):
    raise ValueError(f"workdir: {where} has no readable tree metadata; it was not written by "
                     "harnax.train.train (use a new workdir)")
  for group in ("params", "opt_state"):
    have = dict(meta.get(group) or {})
    want = expected[group]
    missing = [k for k in want if k not in have]
    extra = [k for k in have if k not in want]
    what = "trained parameters" if group == "params" else "optimizer state"
    if missing or extra:
      raise ValueError(
          f"params: {where} does not match the {what} of this run: "
          + (f"missing {missing[:4]}" if missing else "")
          + ("; " if missing and extra else "")
          + (f"unexpected {extra[:4]}" if extra else "")
          + " (another model, finetune mode or optimizer? use a new workdir)")
    for k, x in want.items():
      m = have[k]
      if tuple(m.shape) != tuple(x.shape) or np.dtype(m.dtype) != np.dtype(x.dtype):
        raise ValueError(
            f"params: {where} does not match: {group} leaf {k!r} is "
            f"{_describe(m.shape, m.dtype)} there and {_describe(x.shape, x.dtype)} here "
            "(another model size or vocabulary? use a new workdir)")


def _check_resumed_config(path: str, c) -> None:
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    old = json.load(f)
  fields = _TRAJECTORY_FIELDS + (() if c.schedule == "constant" else ("num_steps",))
  if c.finetune == "full" and old.get("finetune") == "full":
    fields = tuple(f for f in fields if not f.startswith("lora_"))
  for name in fields:
    if name in old and old[name] != c[name]:
      raise ValueError(f"config.{name}: {c[name]!r} here, {old[name]!r} in the run being resumed "
                       f"from {os.path.dirname(path)}; an exact resume needs the same value "
                       "(or use a new workdir)")


def train(config, value_and_grad_fn: ValueAndGradFn, params, batch, *, workdir: str,
          progress: bool = True, max_steps_this_run: int | None = None,
          traceable: bool = True) -> TrainResult:
  """Maximizes an exact-gradient objective by optax, with checkpoints and exact resume.

  Args:
    config: a `ConfigDict` or dict over `default_config()` (missing fields default).
    value_and_grad_fn: `(params, batch) -> (value, grads, metrics)`: the scalar to
      maximize, its gradient (the params' structure) and a dict of scalar metrics (may be
      empty). Traced once inside a jitted step.
    params: the initial parameters, any pytree of floating arrays (e.g. the `nnx.State` of
      `harnax.policies.lm.split_model`; its `axes` metadata places it on the mesh).
    batch: one pytree of arrays (the whole training set: the objective is exact), or a
      callable `batch_fn(step) -> batch` for streamed data (it must return the same batch
      for the same step for a resume to be exact). Leaves with a leading axis have it split
      over the mesh's `data` axis; scalars are replicated.
    workdir: the run's directory: `metrics.jsonl`, `config.json`, `checkpoints/`. When it
      holds a checkpoint, training resumes from the latest one.
    progress: a progress bar on stderr when stderr is a terminal; otherwise (or False) one
      line every `config.log_every` steps.
    max_steps_this_run: stop after this many updates in this call, with a checkpoint (a
      job slice); the next call on the workdir continues.
    traceable: True (the default) jits the whole step around `value_and_grad_fn`. False
      calls it from Python once per step and jits only the parameter transform and the
      update: for a function that drives its own compiled pieces (e.g. the LM policy's
      host-driven micro-batches, one compilation for sets of any size).

  Returns:
    `TrainResult(params, history, adapters)`.

  Raises:
    ValueError: a bad config field, params, batch or function output, or a checkpoint in
      `workdir` that does not match (names the field or leaf).
  """
  c = check_config(config)
  initialize_distributed(c)
  if not callable(value_and_grad_fn):
    raise ValueError(f"value_and_grad_fn: expected a callable (params, batch) -> (value, grads, "
                     f"metrics), got {value_and_grad_fn!r}")
  if not isinstance(workdir, (str, os.PathLike)) or not str(workdir):
    raise ValueError(f"workdir: expected a directory path, got {workdir!r}")
  if max_steps_this_run is not None and (not _is_int(max_steps_this_run)
                                         or max_steps_this_run < 1):
    raise ValueError(f"max_steps_this_run: expected None or a positive integer, got "
                     f"{max_steps_this_run!r}")
  if isinstance(params, nnx.Module):
    raise ValueError("params: expected a pytree of arrays, got an nnx.Module; pass its state "
                     "(`nnx.split(model)` or `harnax.policies.lm.split_model`)")
  leaves, treedef = jax.tree.flatten(params)
  names = lora_lib.param_names(params)
  if not leaves:
    raise ValueError("params: expected a pytree with at least one array, got no leaves")
  for name, x in zip(names, leaves):
    if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"params: leaf {name!r} is not a floating array "
                       f"({getattr(x, 'dtype', type(x).__name__)}); every parameter is trained")
  workdir = os.path.abspath(os.fspath(workdir))
  primary = jax.process_index() == 0
  if primary:
    os.makedirs(workdir, exist_ok=True)

  mesh = make_mesh(c)
  tx = make_optimizer(c)
  schedule = make_schedule(c)
  lora = c.finetune == "lora"
  init_key, loop_key = jax.random.split(jax.random.key(c.seed))
  replicated = NamedSharding(mesh, PartitionSpec())
  shardings = [NamedSharding(mesh, parallel.logical_to_spec(a, np.shape(x), mesh))
               for a, x in zip(_variable_axes(params), leaves)]
  dtypes = [_master_dtype(x) for x in leaves]
  if lora:
    try:
      adapters = lora_lib.init_lora(params, rank=c.lora_rank, targets=c.lora_targets,
                                    key=init_key, layout=c.lora_layout)
    except ValueError as e:  # "targets: ..." -> "config.lora_targets: ..."
      raise ValueError(f"config.lora_{e}") from None
    base = _copy_to(leaves, shardings, dtypes)
    t_leaves, lora_treedef = jax.tree.flatten(adapters)
    t_names = lora_lib.param_names(adapters)
    t_shardings = [replicated] * len(t_leaves)
    trainable = _copy_to(t_leaves, t_shardings, [x.dtype for x in t_leaves])
  else:
    base, lora_treedef = None, None
    t_names, t_shardings = names, shardings
    trainable = _copy_to(leaves, shardings, dtypes)

  opt_abstract = jax.eval_shape(tx.init, trainable)
  opt_shardings = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, t_shardings,
                                        transform_non_params=lambda _: replicated)
  opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(trainable)
  opt_leaves, opt_treedef = jax.tree.flatten(opt_state)
  opt_names = lora_lib.param_names(opt_state)
  opt_leaf_shardings = jax.tree.leaves(opt_shardings)
  rng = jax.device_put(jax.random.key_data(loop_key), replicated)

  ocp = _orbax()
  ckpt_dir = os.path.join(workdir, CHECKPOINT_DIR)
  # Orbax writes each checkpoint into `<step>.orbax-checkpoint-tmp-*` and renames it when
  # complete; only renamed (finalized) steps are listed, so a torn write is never restored,
  # and leftovers are removed at start-up. The device-to-host copy happens inside `save`, so
  # the next step may donate the saved buffers while the files are written in the background.
  options = ocp.CheckpointManagerOptions(
      preservation_policy=_preservation(ocp, c), create=True,
      cleanup_tmp_directories=True, enable_async_checkpointing=True)
  manager = ocp.CheckpointManager(ckpt_dir, item_handlers=ocp.StandardCheckpointHandler(),
                                  options=options)
  try:
    start = 0
    latest = manager.latest_step()
    config_path = os.path.join(workdir, CONFIG_FILE)
    if latest is not None:
      _check_resumed_config(config_path, c)
      abstract = _checkpoint_tree(
          t_names, [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                    for x, s in zip(trainable, t_shardings)],
          opt_names, [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                      for x, s in zip(opt_leaves, opt_leaf_shardings)],
          jax.ShapeDtypeStruct((), np.int32, sharding=replicated),
          jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated))
      _check_checkpoint(manager, latest, abstract, ckpt_dir)
      restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
      trainable = [restored["params"][k] for k in t_names]
      opt_leaves = [restored["opt_state"][k] for k in opt_names]
      rng = restored["rng"]
      start = int(np.asarray(restored["step"]))
      if start != latest:
        raise ValueError(f"workdir: the checkpoint labelled {latest} in {ckpt_dir} holds step "
                         f"{start}; the directory is corrupt")
      if start > c.num_steps:
        raise ValueError(f"config.num_steps: {c.num_steps}, but the checkpoint in {ckpt_dir} "
                         f"is at step {start}; raise num_steps or use a new workdir")
    opt_state = jax.tree.unflatten(opt_treedef, opt_leaves)
    metrics_path = os.path.join(workdir, METRICS_FILE)
    history = _read_metrics(metrics_path, start)
    if primary:
      _write_metrics(metrics_path, history)
      with open(config_path, "w", encoding="utf-8") as f:
        f.write(c.to_json(indent=2, sort_keys=True))

    stop = c.num_steps if max_steps_this_run is None else min(
        c.num_steps, start + max_steps_this_run)
    fixed_batch = None if callable(batch) else _place_batch(batch, mesh)
    if traceable:
      step_fn = _jitted_step(value_and_grad_fn, c, treedef, names, lora_treedef, t_shardings,
                             opt_shardings, replicated)
    else:
      step_fn = _host_step(value_and_grad_fn, c, treedef, list(names), lora_treedef)
    bar = bool(progress) and sys.stderr.isatty()
    meter = _Progress(c.num_steps, start, bar=bar, log_every=c.log_every, enabled=primary)
    keep_steps = {int(k) for k in c.keep_steps}

    def save(step, trainable, opt_state, rng):
      tree = _checkpoint_tree(t_names, trainable, opt_names, jax.tree.leaves(opt_state),
                              np.asarray(step, np.int32), rng)
      manager.save(step, force=True, args=ocp.args.StandardSave(tree))

    log = open(metrics_path, "a", encoding="utf-8") if primary else None
    try:
      with parallel.sharding_rules(mesh):
        for s in range(start, stop):
          b = fixed_batch if fixed_batch is not None else _place_batch(batch(s), mesh)
          t0 = time.perf_counter()
          trainable, opt_state, rng, out = step_fn(trainable, opt_state, rng, base, b)
          jax.block_until_ready((trainable, out))
          record = {"step": s, "value": float(out["value"]),
                    "grad_norm": float(out["grad_norm"]),
                    "learning_rate": float(schedule(s)), "step_time": time.perf_counter() - t0}
          record.update({k: float(v) for k, v in out.items() if k not in record})
          history.append(record)
          if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
          meter.update(record)
          done = s + 1
          if ((c.checkpoint_every and done % c.checkpoint_every == 0) or done == stop
              or done in keep_steps):
            save(done, trainable, opt_state, rng)
    finally:
      meter.close()
      if log is not None:
        log.close()
  finally:
    manager.wait_until_finished()
    manager.close()

  out_adapters = None
  if lora:
    out_adapters = jax.tree.unflatten(lora_treedef, trainable)
    merged = jax.jit(lambda b, a: lora_lib.merge_lora(
        jax.tree.unflatten(treedef, b), a, alpha=float(c.lora_alpha), rank=int(c.lora_rank),
        layout=c.lora_layout))(base, out_adapters)
    return TrainResult(params=merged, history=history, adapters=out_adapters)
  return TrainResult(params=jax.tree.unflatten(treedef, trainable), history=history)



def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the finalized checkpoints in `workdir` (ascending; [] when there are none)."""
  ckpt_dir = os.path.join(os.fspath(workdir), CHECKPOINT_DIR)
  if not os.path.isdir(ckpt_dir):
    return []
  # Orbax renames a checkpoint's directory to its bare step number only once it is complete.
  return sorted(int(n) for n in os.listdir(ckpt_dir)
                if n.isdigit() and os.path.isdir(os.path.join(ckpt_dir, n)))


def restore_params(config, params, workdir: str, step: int):
  """The trained parameters that `train(config, ..., params, workdir=workdir)` had after `step`
  updates, read from that step's checkpoint (one kept by `keep_checkpoints` or `keep_steps`).

  Only the parameters are read (not the optimizer state). With LoRA the checkpoint holds the
  adapters, merged into `params` (the frozen base) as `train` returns them.

  Args:
    config: the run's loop config (its `finetune` and LoRA fields decide what was saved).
    params: the initial parameters given to `train` (their structure and dtypes; with LoRA,
      the base).
    workdir: the run's directory.
    step: a checkpointed step (`checkpoint_steps(workdir)`).

  Returns:
    A pytree like `params`, float32 (float64 leaves stay float64), on the host's default
    device.

  Raises:
    ValueError: `step` has no checkpoint in `workdir` (the message lists those that exist),
      or the checkpoint does not match `params`.
  """
  c = check_config(config)
  if not _is_int(step) or step < 1:
    raise ValueError(f"step: expected a positive integer, got {step!r}")
  steps = checkpoint_steps(workdir)
  if step not in steps:
    raise ValueError(f"step: no checkpoint of step {step} in "
                     f"{os.path.join(os.fspath(workdir), CHECKPOINT_DIR)} (kept: {steps}); "
                     "add it to config.keep_steps before training to keep it")
  leaves, treedef = jax.tree.flatten(params)
  if c.finetune == "lora":
    adapters = jax.eval_shape(lambda: lora_lib.init_lora(
        params, rank=c.lora_rank, targets=c.lora_targets, key=jax.random.key(0),
        layout=c.lora_layout))
    t_leaves, t_treedef = jax.tree.flatten(adapters)
    t_names = lora_lib.param_names(adapters)
  else:
    t_leaves, t_treedef, t_names = leaves, treedef, lora_lib.param_names(params)
  abstract = {"params": {n: jax.ShapeDtypeStruct(np.shape(x), _master_dtype(x))
                         for n, x in zip(t_names, t_leaves)},
              "step": jax.ShapeDtypeStruct((), np.int32)}
  ocp = _orbax()
  ckpt_dir = os.path.abspath(os.path.join(os.fspath(workdir), CHECKPOINT_DIR))
  manager = ocp.CheckpointManager(ckpt_dir, item_handlers=ocp.PyTreeCheckpointHandler())
  try:
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    # Only the parameters: the optimizer state and the key stay on disk.
    restored = manager.restore(step, args=ocp.args.PyTreeRestore(
        abstract, restore_args=restore_args, partial_restore=True))
  except (KeyError, ValueError) as e:
    raise ValueError(f"params: the checkpoint of step {step} in {ckpt_dir} does not hold "
                     f"these parameters ({e})") from None
  finally:
    manager.close()
  # A partial restore hands back the abstract leaf of a name the checkpoint does not have.
  got = {n: x for n, x in restored["params"].items() if isinstance(x, np.ndarray)}
  for n, x in zip(t_names, t_leaves):
    if n not in got or np.shape(got[n]) != np.shape(x):
      raise ValueError(f"params: leaf {n!r} is {np.shape(x)} here and "
                       f"{np.shape(got[n]) if n in got else 'missing'} in the checkpoint of step "
                       f"{step} in {ckpt_dir}")
  if int(np.asarray(restored["step"])) != step:
    raise ValueError(f"workdir: the checkpoint labelled {step} in {ckpt_dir} holds step "
                     f"{int(np.asarray(restored['step']))}; the directory is corrupt")
  trained = [jnp.asarray(got[n], _master_dtype(x)) for n, x in zip(t_names, t_leaves)]
  if c.finetune == "lora":
    out_adapters = jax.tree.unflatten(t_treedef, trained)
    return jax.jit(lambda b, a: lora_lib.merge_lora(
        b, a, alpha=float(c.lora_alpha), rank=int(c.lora_rank), layout=c.lora_layout))(
            jax.tree.unflatten(treedef, [jnp.asarray(x, _master_dtype(x)) for x in leaves]),
            out_adapters)
  return jax.tree.unflatten(treedef, trained)
