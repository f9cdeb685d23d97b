"""Harnesses as interfaces: encode, decode, execute (the harness-transfer study).

A harness sits between an environment and a model. It *encodes* an environment
state into a model context, *decodes* a model output into a semantic action
(or declares it invalid) and *executes* the semantic action:

  encode:  state            -> context (e.g. the observation text)
  decode:  (state, output)  -> semantic action id, or INVALID (-1)
  execute: (state, action)  -> (next-state distribution [S], reward)

`Interface` is exactly these three pure functions. The numerical code works on
the finite form, `TabularHarness`: a finite set of O candidate outputs shared
by all states, a decode table `[S, O]` and the executed *semantic* MDP, an
ordinary `TabularMDP`/`SparseTabularMDP` over the harness's semantic actions.
Two harnesses may differ in any of the three parts: changing `execute` (e.g. a
batch action) changes the MDP and so its optimum; changing only `encode`
(e.g. the order of observation fields, `FieldEncoder`) leaves the MDP, and every
optimal decision, unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax import pytree
from harnax.core import mdp as mdp_lib
from harnax.core import validation as val

Array = jax.Array

INVALID = -1
"""Decode-table entry of an output that is not an executable semantic action."""


class Interface(NamedTuple):
  """A harness as three pure functions (no class hierarchy; build by closure).

  Attributes:
    encode: `state -> context` (for text harnesses, a `str`).
    decode: `(state, output) -> int`, a semantic action id in `[0, A)` or
      `INVALID`.
    execute: `(state, action) -> (next_state_probs [S], reward)`.
  """

  encode: Callable[[Any], Any]
  decode: Callable[[Any, Any], int]
  execute: Callable[[Any, int], tuple[Any, Any]]


# ---------------------------------------------------------------------------
# Text encoding with an explicit field order.
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldEncoder:
  """`state -> str`: one `name: value` line per observation field, in `order`.

  Reordering fields is the harness-transfer study's representation-only
  change: the semantic MDP and its optimum are untouched, only the text the model reads
  moves.

  Attributes:
    fields: `state -> sequence of (name, value)` in the canonical order; it must
      return `num_fields` pairs for every state.
    num_fields: number of fields per state.
    order: a permutation of `range(num_fields)`: line `i` of the text shows
      canonical field `order[i]`. `None` is the canonical order.
    separator: joins the lines.
  """

  fields: Callable[[int], Sequence[tuple[str, str]]]
  num_fields: int
  order: tuple[int, ...] | None = None
  separator: str = "\n"

  def __post_init__(self):
    if not isinstance(self.num_fields, (int, np.integer)) or self.num_fields < 1:
      raise ValueError(f"num_fields: expected a positive int, got {self.num_fields!r}")
    if self.order is not None:
      order = tuple(int(i) for i in self.order)
      if sorted(order) != list(range(self.num_fields)):
        raise ValueError(f"order: expected a permutation of range({self.num_fields}), "
                         f"got {order}")
      object.__setattr__(self, "order", order)

  def __call__(self, state) -> str:
    return encode_fields(self, state)

  def reordered(self, order: Sequence[int]) -> "FieldEncoder":
    """The same fields shown in another order."""
    return dataclasses.replace(self, order=tuple(order))

  def reversed(self) -> "FieldEncoder":
    """The fields in reverse order of the current one."""
    current = self.order if self.order is not None else tuple(range(self.num_fields))
    return self.reordered(current[::-1])


def encode_fields(encoder: FieldEncoder, state) -> str:
  """Renders `state` as `name: value` lines in the encoder's field order."""
  pairs = list(encoder.fields(state))
  if len(pairs) != encoder.num_fields:
    raise ValueError(f"fields: expected {encoder.num_fields} (name, value) pairs for state "
                     f"{state!r}, got {len(pairs)}")
  order = encoder.order if encoder.order is not None else range(encoder.num_fields)
  return encoder.separator.join(f"{pairs[i][0]}: {pairs[i][1]}" for i in order)


# ---------------------------------------------------------------------------
# The tabular harness.
# ---------------------------------------------------------------------------

@pytree.container
class TabularHarness:
  """A harness over a finite set of candidate outputs (a pytree).

  Array leaves: `mdp`, `pi_ref`, `decode_table`. Everything else is static
  metadata (hashable), so a harness passes through `jit` and `vmap` (stack the
  leaves of harnesses of one shape to batch them). Construction validates;
  rebuilding from leaves (as `jit`/`vmap` do) does not (`pytree.container`).

  Attributes:
    mdp: the executed semantic MDP, `TabularMDP` or `SparseTabularMDP` over the
      harness's `A` semantic actions.
    pi_ref: `[S, A]` reference policy over semantic actions; zeros mark actions
      this harness does not offer in a state.
    decode_table: int32 `[S, O]`: `decode_table[s, o]` is the semantic action that
      output `o` decodes to in state `s`, or `INVALID`. A valid entry must be an
      action available in `s` (`pi_ref[s, a] > 0`).
    action_names: `A` names of the semantic actions (match actions across
      harnesses by these, see `readout.match_actions`).
    output_names: `O` candidate outputs (e.g. the strings a model may emit).
    noop_action: the semantic action invalid outputs execute as under
      `invalid="noop"` aggregation (it must be available wherever an output is
      invalid), or `None`.
    encoder: optional `state -> context` function (e.g. a `FieldEncoder`).
    name: a label for tables.
  """

  mdp: Any
  pi_ref: Array
  decode_table: Array
  action_names: tuple[str, ...] = pytree.field(static=True)
  output_names: tuple[str, ...] = pytree.field(static=True)
  noop_action: int | None = pytree.field(static=True)
  encoder: Callable[[int], Any] | None = pytree.field(static=True)
  name: str = pytree.field(static=True)

  def __init__(self, *, mdp, pi_ref, decode_table, action_names: Sequence[str] | None = None,
               output_names: Sequence[str] | None = None, noop_action: int | None = None,
               encoder: Callable[[int], Any] | None = None, name: str = "H"):
    mdp_lib.check_single_mdp(mdp)
    s, a = mdp.num_states, mdp.num_actions
    val.check_reference_policy(pi_ref, s, a)
    pi_ref = val.as_float_array("pi_ref", pi_ref, mdp.rewards.dtype)
    decode_table = check_decode_table(decode_table, num_states=s, num_actions=a,
                                      pi_ref=pi_ref)
    o = decode_table.shape[1]
    action_names = _names("action_names", action_names, a, "action")
    output_names = _names("output_names", output_names, o, "output")
    if noop_action is not None:
      if not isinstance(noop_action, (int, np.integer)) or not 0 <= noop_action < a:
        raise ValueError(f"noop_action: expected an action id in [0, {a}) or None, got "
                         f"{noop_action!r}")
      noop_action = int(noop_action)
      table, ref = np.asarray(decode_table), np.asarray(pi_ref)
      needs = np.any(table == INVALID, axis=1) & (ref[:, noop_action] <= 0)
      if np.any(needs):
        st = int(np.argwhere(needs)[0][0])
        raise ValueError(f"noop_action: action {noop_action} must be available (pi_ref > 0) "
                         f"in every state with an invalid output; state {st} has invalid "
                         "outputs but not the no-op")
    if encoder is not None and not callable(encoder):
      raise ValueError(f"encoder: expected a callable state -> context, got "
                       f"{type(encoder).__name__}")
    pytree.set_fields(self, mdp=mdp, pi_ref=pi_ref, decode_table=decode_table,
                      action_names=action_names, output_names=output_names,
                      noop_action=noop_action, encoder=encoder, name=str(name))

  @property
  def num_states(self) -> int:
    return self.decode_table.shape[-2]

  @property
  def num_actions(self) -> int:
    return self.pi_ref.shape[-1]

  @property
  def num_outputs(self) -> int:
    return self.decode_table.shape[-1]

  def encode(self, state):
    """The model context of `state` (requires an `encoder`)."""
    if self.encoder is None:
      raise ValueError(f"encoder: harness {self.name!r} has no encoder")
    return self.encoder(state)

  def __repr__(self):
    return (f"TabularHarness({self.name!r}, S={self.num_states}, A={self.num_actions}, "
            f"O={self.num_outputs}, noop_action={self.noop_action})")


def _names(field: str, names, n: int, prefix: str) -> tuple[str, ...]:
  if names is None:
    return tuple(f"{prefix}_{i}" for i in range(n))
  names = tuple(str(x) for x in names)
  if len(names) != n:
    raise ValueError(f"{field}: expected {n} names, got {len(names)}")
  if len(set(names)) != n:
    dup = next(x for x in names if names.count(x) > 1)
    raise ValueError(f"{field}: expected distinct names, {dup!r} appears twice")
  return names


def check_decode_table(decode_table, *, num_states: int, num_actions: int,
                       pi_ref=None) -> Array:
  """Validates a decode table and returns it as int32 `[S, O]`.

  Raises:
    ValueError: wrong shape or dtype, ids outside `[-1, num_actions)`, or (with
      `pi_ref`) a valid entry decoding to an action unavailable in its state.
  """
  if decode_table is None:
    raise ValueError("decode_table: expected an int array [S, O], got None")
  table = jnp.asarray(decode_table)
  if not jnp.issubdtype(table.dtype, jnp.integer):
    raise ValueError(f"decode_table: expected integer action ids, got dtype {table.dtype}")
  if table.ndim != 2 or table.shape[0] != num_states or table.shape[1] < 1:
    raise ValueError(f"decode_table: expected shape [{num_states}, O] with O >= 1, got "
                     f"{list(table.shape)}")
  host = val.host(table)
  if host is not None:
    bad = (host < INVALID) | (host >= num_actions)
    if np.any(bad):
      s, o = (int(i) for i in np.argwhere(bad)[0])
      raise ValueError(f"decode_table: expected action ids in [0, {num_actions}) or "
                       f"{INVALID} (invalid); output {o} in state {s} decodes to "
                       f"{int(host[s, o])}")
    ref = val.host(pi_ref) if pi_ref is not None else None
    if ref is not None:
      valid = host >= 0
      target = np.where(valid, host, 0)
      off = valid & (np.take_along_axis(ref, target, axis=1) <= 0)
      if np.any(off):
        s, o = (int(i) for i in np.argwhere(off)[0])
        raise ValueError(f"decode_table: output {o} in state {s} decodes to action "
                         f"{int(host[s, o])}, which pi_ref marks unavailable there; decode it "
                         f"to {INVALID} instead")
  return table.astype(jnp.int32)


def decode_table_from(decode: Callable[[int, Any], int], num_states: int,
                      outputs: Sequence[Any]) -> np.ndarray:
  """Tabulates a Python decoder over states and candidate outputs.

  Args:
    decode: `(state, output) -> action id or INVALID`, e.g. `Interface.decode`.
    num_states: states are `0, ..., num_states - 1`.
    outputs: the O candidate outputs.

  Returns:
    int32 `[num_states, O]`.
  """
  return np.array([[int(decode(s, o)) for o in outputs] for s in range(num_states)],
                  dtype=np.int32).reshape(num_states, len(outputs))


def as_interface(harness: TabularHarness) -> Interface:
  """The three functions of a tabular harness.

  `decode` takes an output index or one of `output_names`; `execute` returns
  `(P[s, a, :], r[s, a])` of the semantic MDP.
  """
  index = {name: i for i, name in enumerate(harness.output_names)}
  dense = mdp_lib.to_dense(harness.mdp)

  def decode(state, output):
    o = index[output] if isinstance(output, str) else output
    return harness.decode_table[state, o]

  def execute(state, action):
    return dense.transitions[state, action], dense.rewards[state, action]

  return Interface(encode=harness.encode, decode=decode, execute=execute)
