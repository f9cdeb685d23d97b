"""Semantic aggregation: from a policy over outputs to the semantic policy Pi_H.

A model emits one of O candidate outputs per state with probabilities
`p(o|s)`; several outputs may decode to the same semantic action and some to
none (`INVALID`). Through harness H the model's semantic policy is

  Pi_H(a|s) = sum_{o : decode(s, o) = a} p(o|s)                      (valid mass)

plus an explicit rule for the invalid mass `p_inv(s) = sum_{o invalid} p(o|s)`:

* `invalid="renormalize"`: condition on a valid output,
  `Pi_H(a|s) = valid(a|s) / (1 - p_inv(s))`. Models a harness that re-asks
  until the output parses. Undefined where every output is invalid: a
  `ValueError` for concrete inputs, NaN under `jit`.
* `invalid="noop"`: the invalid mass executes as the harness's designated
  no-op action, `Pi_H(noop|s) += p_inv(s)`. Models a harness where an
  unparseable output wastes a step.

Sums are taken in log space (segment log-sum-exp), so output log-probabilities
of -1e4 still aggregate exactly, and gradients flow to every output.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import bellman
from harnax.core import validation as val
from harnax.harness import interface

Array = jax.Array

INVALID_MODES = ("renormalize", "noop")


def _check_mode(invalid: str, noop_action, num_actions: int):
  if invalid not in INVALID_MODES:
    raise ValueError(f"invalid: expected one of {INVALID_MODES}, got {invalid!r}")
  if invalid == "noop":
    if noop_action is None:
      raise ValueError("noop_action: invalid='noop' needs a designated no-op action id")
    if not isinstance(noop_action, (int, np.integer)) or not 0 <= noop_action < num_actions:
      raise ValueError(f"noop_action: expected an action id in [0, {num_actions}), got "
                       f"{noop_action!r}")


def _check_log_probs(name: str, log_probs: Array, num_states: int, num_outputs: int):
  val.check_shape(name, log_probs, (num_states, num_outputs), "[S, O] like decode_table")
  v = val.host(log_probs)
  if v is None:
    return
  if np.any(np.isnan(v)) or np.any(v == np.inf):
    bad = tuple(int(i) for i in np.argwhere(np.isnan(v) | (v == np.inf))[0])
    raise ValueError(f"{name}: expected finite log-probabilities or -inf, found {v[bad]} at "
                     f"index {bad}")
  with np.errstate(divide="ignore", invalid="ignore"):
    m = np.max(v, axis=-1, keepdims=True)
    total = np.log(np.sum(np.exp(v - m), axis=-1)) + m[:, 0]
  atol = val.stochastic_atol(v.dtype if np.issubdtype(v.dtype, np.floating) else np.float64)
  off = ~(np.abs(total) <= atol * max(1.0, num_outputs ** 0.5))
  if np.any(off):
    s = int(np.argwhere(off)[0][0])
    raise ValueError(f"{name}: expected log-probabilities normalized over the O outputs of each "
                     f"state; state {s} has log-sum-exp {float(total[s]):.6g} (total probability "
                     f"{float(np.exp(total[s])):.6g}), expected 0")


def segment_logsumexp(log_values: Array, decode_table: Array, *, num_actions: int) -> Array:
  """Per-state log-sum-exp of output log-values grouped by decoded action.

  Args:
    log_values: `[S, O]`.
    decode_table: int `[S, O]`, entries in `[-1, num_actions)`.
    num_actions: A.

  Returns:
    `[S, A + 1]`: column 0 collects the invalid outputs, column `a + 1` the
    outputs decoding to `a`; `-inf` for an empty group.
  """
  s, o = decode_table.shape
  width = num_actions + 1
  ids = (jnp.arange(s, dtype=jnp.int32)[:, None] * width + decode_table + 1).reshape(-1)
  x = log_values.reshape(-1)
  n = s * width
  peak = jax.ops.segment_max(x, ids, num_segments=n)
  # The peak only stabilizes exp; the result does not depend on it, so no gradient.
  peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
  total = jax.ops.segment_sum(jnp.exp(x - peak[ids]), ids, num_segments=n)
  pos = total > 0
  # Guard log(0): a -inf result with a finite (zero) gradient, not NaN.
  out = jnp.where(pos, jnp.log(jnp.where(pos, total, 1.0)) + peak, -jnp.inf)
  return out.reshape(s, width)


def aggregate_log_probs(output_log_probs, decode_table, *, num_actions: int,
                        invalid: str = "renormalize", noop_action: int | None = None) -> Array:
  """`log Pi_H(a|s)` from output log-probabilities.

  Args:
    output_log_probs: `[S, O]`, `log p(o|s)`, normalized per state (`-inf`
      allowed).
    decode_table: int `[S, O]`, action ids or `INVALID` (-1).
    num_actions: A, the number of semantic actions.
    invalid: `"renormalize"` or `"noop"` (module docstring).
    noop_action: the action that receives the invalid mass under `"noop"`.

  Returns:
    `[S, A]` log semantic policy (`-inf` for actions no output reaches).

  Raises:
    ValueError: bad shapes or ids, unnormalized log-probabilities, an unknown
      mode, or (with `"renormalize"`, concrete inputs) a state where the valid
      outputs have probability 0. Under `jit` that state's row is NaN.
  """
  _check_mode(invalid, noop_action, num_actions)
  if jnp.ndim(decode_table) != 2:
    raise ValueError(f"decode_table: expected shape [S, O], got {list(jnp.shape(decode_table))}")
  s, o = jnp.shape(decode_table)
  table = interface.check_decode_table(decode_table, num_states=s, num_actions=num_actions)
  logp = val.as_float_array("output_log_probs", output_log_probs)
  _check_log_probs("output_log_probs", logp, s, o)
  out = _aggregate(logp, table, num_actions=num_actions, invalid=invalid,
                   noop_action=None if invalid != "noop" else int(noop_action))
  host = val.host(out) if invalid == "renormalize" else None
  if host is not None and np.any(np.isnan(host)):
    st = int(np.argwhere(np.isnan(host))[0][0])
    structural = val.host(table) is not None and np.all(np.asarray(table)[st] == interface.INVALID)
    why = ("every output decodes to INVALID" if structural else
           "every valid output has probability 0")
    raise ValueError(f"output_log_probs: in state {st} {why}; invalid='renormalize' cannot "
                     "condition on a valid output there (use invalid='noop' with a no-op action)")
  return out


@functools.partial(jax.jit, static_argnames=("num_actions", "invalid", "noop_action"))
def _aggregate(logp, table, *, num_actions, invalid, noop_action):
  groups = segment_logsumexp(logp, table, num_actions=num_actions)
  log_invalid, log_valid = groups[:, 0], groups[:, 1:]
  if invalid == "noop":
    return log_valid.at[:, noop_action].set(jnp.logaddexp(log_valid[:, noop_action], log_invalid))
  # A state without valid mass gives -inf - -inf = NaN: documented, never a silent 0.
  return log_valid - jax.nn.logsumexp(log_valid, axis=-1, keepdims=True)


def aggregate_probs(output_probs, decode_table, *, num_actions: int,
                    invalid: str = "renormalize", noop_action: int | None = None) -> Array:
  """`Pi_H(a|s)` from output probabilities `[S, O]` (rows summing to 1).

  Same rules as `aggregate_log_probs`; returns probabilities `[S, A]`.
  """
  probs = val.as_float_array("output_probs", output_probs)
  val.check_distribution("output_probs", probs)
  return jnp.exp(aggregate_log_probs(bellman.safe_log(probs), decode_table,
                                     num_actions=num_actions, invalid=invalid,
                                     noop_action=noop_action))


def semantic_log_policy(harness: interface.TabularHarness, output_log_probs, *,
                        invalid: str = "renormalize") -> Array:
  """`log Pi_H`, `[S, A]`, of a model seen through `harness`.

  Args:
    harness: a `TabularHarness` (its `noop_action` serves `invalid="noop"`).
    output_log_probs: `[S, O]` normalized log-probabilities over the harness's
      candidate outputs (e.g. `jax.nn.log_softmax(logits)`).
    invalid: `"renormalize"` or `"noop"`.
  """
  return aggregate_log_probs(output_log_probs, harness.decode_table,
                             num_actions=harness.num_actions, invalid=invalid,
                             noop_action=harness.noop_action)


def semantic_policy(harness: interface.TabularHarness, output_log_probs, *,
                    invalid: str = "renormalize") -> Array:
  """`Pi_H`, `[S, A]` probabilities; see `semantic_log_policy`.

  The result puts mass only on actions available under `harness.pi_ref`, so it
  can be passed to `hx.evaluate_policy`, `hx.mismatch`, ... on `harness.mdp`.
  """
  return jnp.exp(semantic_log_policy(harness, output_log_probs, invalid=invalid))
