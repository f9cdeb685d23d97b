"""Readout scores and the exact transfer-error decomposition (docs/harness.md).

Through harness H a model has semantic policy `Pi_H`; its *readout* is
`F_hat_H(s, a) = tau log Pi_H(a|s)`, a score defined up to a per-state constant
and so always compared centred. Deploying the weights trained on H on another
harness H' gives the readout `F_hat_H'`. On the semantic actions common to both
harnesses (an action map, `match_actions`), with `c(.)` centring per state over
the common available actions,

  c(F_hat_H' - F*_H')  =  c(F*_H - F*_H')       target shift
                        + c(F_hat_H - F*_H)       learning residual
                        + c(F_hat_H' - F_hat_H)   readout drift.

It telescopes, and `c` is linear, so the identity is exact (docs/harness.md).
A representation-only change (same executed MDP and `pi_ref`) has target shift
exactly zero: only the readout drifts.

An *action map* is an int array `[A']` over the target harness's actions:
entry `a'` is the source action that `a'` corresponds to, or -1 where `a'` has
no counterpart (declared explicitly, see `match_actions`).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import bellman
from harnax.core import solvers
from harnax.core import validation as val
from harnax.harness import interface

Array = jax.Array


@jax.jit
def readout_scores(log_policy: Array, pi_ref: Array, tau) -> Array:
  """Centred readout scores `c(tau log Pi_H(a|s))` over available actions, `[S, A]`.

  Takes log-probabilities (e.g. `semantic_log_policy`), which keep precision
  where probabilities underflow; from probabilities pass
  `harnax.core.bellman.safe_log(policy)`. Unnormalized log-probabilities give the
  same result (the per-state constant cancels). 0 at unavailable actions;
  `-inf` at an available action of probability 0 makes its row NaN.
  """
  return bellman.centered(tau * log_policy, bellman.available(pi_ref))


@jax.jit
def score_error(log_policy: Array, scores: Array, pi_ref: Array, tau) -> Array:
  """Centred score error `c(tau log Pi_H - F*)` over available actions, `[S, A]`.

  Zero in a state iff `Pi_H(.|s) = pi*(.|s)` there (both are softmaxes of
  their scores over the same actions).
  """
  return bellman.centered(tau * log_policy - scores, bellman.available(pi_ref))


# ---------------------------------------------------------------------------
# Action maps between harnesses.
# ---------------------------------------------------------------------------

def check_action_map(action_map, *, num_source: int, num_target: int) -> np.ndarray:
  """Validates an action map and returns it as int32 `[num_target]`.

  Raises:
    ValueError: wrong length or dtype, ids outside `[-1, num_source)`, or two
      target actions mapped onto one source action.
  """
  if action_map is None:
    raise ValueError("action_map: expected an int array [A_target], got None")
  m = np.asarray(action_map)
  if m.dtype == object or not np.issubdtype(m.dtype, np.integer):
    raise ValueError(f"action_map: expected integer source action ids, got dtype {m.dtype}")
  if m.ndim != 1 or m.shape[0] != num_target:
    raise ValueError(f"action_map: expected length {num_target} (one entry per target action), "
                     f"got shape {list(m.shape)}")
  bad = (m < -1) | (m >= num_source)
  if np.any(bad):
    a = int(np.argwhere(bad)[0][0])
    raise ValueError(f"action_map: expected source action ids in [0, {num_source}) or -1 (no "
                     f"counterpart); target action {a} maps to {int(m[a])}")
  mapped = m[m >= 0]
  if len(np.unique(mapped)) != len(mapped):
    dup = int(next(x for x in mapped if np.sum(mapped == x) > 1))
    targets = [int(i) for i in np.argwhere(m == dup)[:, 0]]
    raise ValueError(f"action_map: target actions {targets} all map to source action {dup}; "
                     "the common actions must correspond one to one")
  return m.astype(np.int32)


def _action_names(x) -> tuple[str, ...]:
  if isinstance(x, interface.TabularHarness):
    return x.action_names
  return tuple(str(n) for n in x)


def match_actions(source, target, *, renames: Mapping[str, str] | None = None,
                  only_in_source: Sequence[str] = (),
                  only_in_target: Sequence[str] = ()) -> np.ndarray:
  """The action map from `target`'s actions to `source`'s, matched by name.

  Every action must be accounted for: matched (same name, or via `renames`),
  or listed as having no counterpart. Nothing is dropped silently.

  Args:
    source: a `TabularHarness` or its action names.
    target: a `TabularHarness` or its action names.
    renames: `{target_name: source_name}` for actions named differently.
    only_in_source: source actions with no counterpart in `target`.
    only_in_target: target actions with no counterpart in `source` (map to -1).

  Returns:
    int32 `[A_target]`.

  Raises:
    ValueError: an unmapped action, or a listed name that does not exist or is
      also matched.
  """
  src, tgt = _action_names(source), _action_names(target)
  renames = dict(renames or {})
  only_s, only_t = set(only_in_source), set(only_in_target)
  for field, names, pool in (("renames", renames.keys(), tgt), ("only_in_target", only_t, tgt),
                             ("only_in_source", only_s, src)):
    missing = [n for n in names if n not in pool]
    if missing:
      raise ValueError(f"{field}: unknown action names {missing}")
  index = {n: i for i, n in enumerate(src)}
  out = []
  for name in tgt:
    want = renames.get(name, name)
    if want in index and name not in only_t:
      out.append(index[want])
    elif name in only_t:
      out.append(-1)
    else:
      raise ValueError(f"action_map: target action {name!r} is unmapped: no source action named "
                       f"{want!r}; add it to renames or list it in only_in_target")
  image = {src[i] for i in out if i >= 0}
  for name in src:
    if name not in image and name not in only_s:
      raise ValueError(f"action_map: source action {name!r} is unmapped: no target action "
                       "corresponds to it; add a rename or list it in only_in_source")
    if name in image and name in only_s:
      raise ValueError(f"only_in_source: {name!r} is listed as unmatched but is matched")
  return check_action_map(np.asarray(out, np.int32), num_source=len(src), num_target=len(tgt))


def identity_action_map(num_actions: int) -> np.ndarray:
  """`[0, 1, ..., A-1]`: the same semantic actions on both sides."""
  return np.arange(num_actions, dtype=np.int32)


# ---------------------------------------------------------------------------
# The decomposition.
# ---------------------------------------------------------------------------

class TransferDecomposition(NamedTuple):
  """Centred score errors of a policy trained on H and deployed on H'.

  Every array is `[S, A']` in the target harness's action indexing, 0 outside
  `common`, centred per state over `common`. `error == target_shift +
  learning_residual + readout_drift` holds to rounding.

  Attributes:
    error: `c(F_hat_H' - F*_H')`, the score error on H'.
    target_shift: `c(F*_H - F*_H')`.
    learning_residual: `c(F_hat_H - F*_H)`.
    readout_drift: `c(F_hat_H' - F_hat_H)`.
    common: bool, action `a'` is mapped and available in both harnesses.
  """

  error: Array
  target_shift: Array
  learning_residual: Array
  readout_drift: Array
  common: Array


def common_actions(action_map, source_pi_ref, target_pi_ref) -> Array:
  """bool `[S, A']`: target action mapped and available on both sides."""
  m = jnp.asarray(action_map)
  idx = jnp.where(m >= 0, m, 0)
  return (m >= 0)[None, :] & (target_pi_ref > 0) & (source_pi_ref[:, idx] > 0)


def transfer_decomposition(source_scores, target_scores, source_log_policy, target_log_policy,
                           source_pi_ref, target_pi_ref, action_map,
                           tau) -> TransferDecomposition:
  """The exact three-way split of the centred score error on H'.

  Every argument is part of the problem (positional or keyword); keywords keep
  the source/target pairs readable.

  Args:
    source_scores: `F*_H`, `[S, A]` (`-inf` where unavailable is fine).
    target_scores: `F*_H'`, `[S, A']`.
    source_log_policy: `log Pi_H` of the trained model on H, `[S, A]`.
    target_log_policy: `log Pi_H'` of the same model read through H', `[S, A']`.
    source_pi_ref: `[S, A]`; target_pi_ref: `[S, A']`.
    action_map: int `[A']` (see module docstring).
    tau: temperature > 0.

  Returns:
    `TransferDecomposition`.

  Raises:
    ValueError (concrete inputs): shape mismatches, a bad action map, a state
    without common actions, or a policy with probability 0 (no finite score)
    on a common action. Under `jit` such rows are NaN.
  """
  src_ref = val.as_float_array("source_pi_ref", source_pi_ref)
  tgt_ref = val.as_float_array("target_pi_ref", target_pi_ref)
  if src_ref.ndim != 2 or tgt_ref.ndim != 2 or src_ref.shape[0] != tgt_ref.shape[0]:
    raise ValueError(f"target_pi_ref: expected [S, A'] with the S of source_pi_ref "
                     f"{list(src_ref.shape)}, got {list(tgt_ref.shape)}")
  s, a = src_ref.shape
  a2 = tgt_ref.shape[1]
  amap = jnp.asarray(action_map)
  if val.is_concrete(amap):
    amap = jnp.asarray(check_action_map(amap, num_source=a, num_target=a2))
  else:
    val.check_shape("action_map", amap, (a2,), "one entry per target action")
  for name, x, shape in (("source_scores", source_scores, (s, a)),
                         ("target_scores", target_scores, (s, a2)),
                         ("source_log_policy", source_log_policy, (s, a)),
                         ("target_log_policy", target_log_policy, (s, a2))):
    val.check_shape(name, x, shape)
  val.check_temperature(tau)
  common, f_src, f_tgt, r_src, r_tgt = _gather(amap, src_ref, tgt_ref, source_scores,
                                               target_scores, source_log_policy,
                                               target_log_policy, tau)
  _check_common(common, (("source_scores", f_src), ("target_scores", f_tgt),
                         ("source_log_policy", r_src), ("target_log_policy", r_tgt)), amap)
  return _decompose(common, f_src, f_tgt, r_src, r_tgt)


@jax.jit
def _decompose(common, f_src, f_tgt, r_src, r_tgt):
  # Mask before subtracting: -inf - -inf outside the common set would be NaN.
  def diff(x, y):
    return bellman.centered(jnp.where(common, x, 0.0) - jnp.where(common, y, 0.0), common)
  return TransferDecomposition(error=diff(r_tgt, f_tgt), target_shift=diff(f_src, f_tgt),
                               learning_residual=diff(r_src, f_src),
                               readout_drift=diff(r_tgt, r_src), common=common)


@jax.jit
def _gather(amap, src_ref, tgt_ref, source_scores, target_scores, source_log_policy,
            target_log_policy, tau):
  """Carries the source quantities to target indexing; readouts as `tau log Pi`."""
  common = common_actions(amap, src_ref, tgt_ref)
  idx = jnp.where(amap >= 0, amap, 0)
  return (common, jnp.asarray(source_scores)[:, idx], jnp.asarray(target_scores),
          tau * jnp.asarray(source_log_policy)[:, idx], tau * jnp.asarray(target_log_policy))


def _check_common(common, arrays, amap):
  c = val.host(common)
  if c is None:
    return
  empty = ~np.any(c, axis=-1)
  if np.any(empty):
    st = int(np.argwhere(empty)[0][0])
    raise ValueError(f"action_map: state {st} has no common action (mapped and available in "
                     "both harnesses); the decomposition needs at least one")
  m = np.asarray(amap)
  for name, x in arrays:
    v = val.host(x)
    if v is None:
      continue
    bad = c & ~np.isfinite(v)
    if np.any(bad):
      st, a2 = (int(i) for i in np.argwhere(bad)[0])
      side = f"source action {int(m[a2])}" if name.startswith("source") else f"action {a2}"
      raise ValueError(f"{name}: {side} in state {st} is a common action but has no finite "
                       f"score ({v[st, a2]}); a readout needs positive probability there")


def harness_transfer_decomposition(source: interface.TabularHarness,
                                   target: interface.TabularHarness, source_log_policy,
                                   target_log_policy, tau, *, action_map=None,
                                   source_solution: solvers.SoftBellmanSolution | None = None,
                                   target_solution: solvers.SoftBellmanSolution | None = None,
                                   **solver_options) -> TransferDecomposition:
  """`transfer_decomposition` with `F*` solved on each harness.

  Args:
    source: H, the harness the model was trained on.
    target: H', the harness it is deployed on.
    source_log_policy: `log Pi_H`, `[S, A]`.
    target_log_policy: `log Pi_H'`, `[S, A']`.
    tau: temperature > 0.
    action_map: int `[A']`; `None` means the identity (requires `A == A'`).
    source_solution, target_solution: precomputed `hx.solve_soft_bellman`.
    **solver_options: forwarded to `hx.solve_soft_bellman`.
  """
  if action_map is None:
    if source.num_actions != target.num_actions:
      raise ValueError(f"action_map: the harnesses have {source.num_actions} and "
                       f"{target.num_actions} actions; pass an action map (match_actions)")
    action_map = identity_action_map(target.num_actions)
  if source_solution is None:
    source_solution = solvers.solve_soft_bellman(source.mdp, source.pi_ref, tau, **solver_options)
  if target_solution is None:
    target_solution = solvers.solve_soft_bellman(target.mdp, target.pi_ref, tau, **solver_options)
  return transfer_decomposition(
      source_scores=source_solution.scores, target_scores=target_solution.scores,
      source_log_policy=source_log_policy, target_log_policy=target_log_policy,
      source_pi_ref=source.pi_ref, target_pi_ref=target.pi_ref, action_map=action_map, tau=tau)


class DecompositionNorms(NamedTuple):
  """Root-mean-square size of each part (scalars); the parts add, norms do not."""

  error: Array
  target_shift: Array
  learning_residual: Array
  readout_drift: Array


def decomposition_norms(decomposition: TransferDecomposition, *,
                        weights: Array | None = None) -> DecompositionNorms:
  """`sqrt(sum_s w(s) mean_{a' common} x(s, a')^2)` for each part.

  Args:
    decomposition: a `TransferDecomposition`.
    weights: `[S]` state weights summing to 1 (e.g. `hx.occupancy`); uniform if
      `None`.
  """
  common = decomposition.common
  s = common.shape[0]
  w = jnp.full((s,), 1.0 / s) if weights is None else jnp.asarray(weights)
  count = jnp.maximum(jnp.sum(common, axis=-1), 1)

  def rms(x):
    return jnp.sqrt(jnp.dot(w, jnp.sum(jnp.where(common, x * x, 0.0), axis=-1) / count))

  return DecompositionNorms(*(rms(x) for x in decomposition[:4]))


def decision_flips(source_log_policy, target_log_policy, action_map, source_pi_ref,
                   target_pi_ref) -> Array:
  """bool `[S]`: the most probable common action differs between H and H'.

  The harness-transfer study reports that reversing the observation fields
  flips it in about half the states although every optimal decision is
  unchanged.
  """
  amap = jnp.asarray(action_map)
  common = common_actions(amap, source_pi_ref, target_pi_ref)
  idx = jnp.where(amap >= 0, amap, 0)
  src = jnp.where(common, jnp.asarray(source_log_policy)[:, idx], -jnp.inf)
  tgt = jnp.where(common, jnp.asarray(target_log_policy), -jnp.inf)
  return jnp.argmax(src, axis=-1) != jnp.argmax(tgt, axis=-1)
