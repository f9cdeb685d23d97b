"""Harnesses H0–H5 over MiniWoB++ task instances, compiled to `TabularHarness`.

A harness fixes three things (docs/harnesses.md):

* its **semantic actions**: `wait` (MiniWoB++'s no-op, action 0 everywhere),
  one click per page element, and what its additions bring;
* their **execution** on the page, which defines the semantic MDP and so the
  ceiling C;
* its **encoding**: the observation text, made of fields (the task utterance,
  the harness's notes — its commands and, where it has them, instructions,
  check and verification results — and one line per visible element with id,
  kind, text and state) in a field order that is a parameter. Notes come
  before the page, as a harness's tool description precedes the observation
  in a prompt, so a harness with more notes also moves the element lines.

The additions of the harness-transfer study (H1–H4 add one each; H5 has all four):

| harness | addition | changes |
|---|---|---|
| H0 | none: one primitive click per step | — |
| H1 | batch clicks: one action clicks a sequence of elements | execution |
| H2 | automatic checking: every step shows the harness's check of the page, | execution |
|    | and a finishing click the check fails is blocked (a no-op)             |           |
| H3 | a verification tool: an action `verify` that shows the check until the | execution |
|    | next action (one more action; states carry "verified")                 |           |
| H4 | additional instructions in the notes | representation only |
| H5 | H1 + H2 + H3 + H4 | execution |

`reverse_fields=True` reverses the order of all observation fields (the
representation-only change of the harness-transfer study); it leaves the MDP untouched.

Every harness of a task instance shares one set of candidate outputs (the
strings a model may emit): `wait`, `click [k]` per element, the batch commands,
`verify`, and two never-valid ones. A harness decodes those it does not offer
(or that name an element not visible now) as invalid.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import mdp as mdp_lib
from harnax.envs.miniwob import tasks as tasks_lib
from harnax.harness import interface

HARNESSES = ("H0", "H1", "H2", "H3", "H4", "H5")
ADDITIONS = ("batch", "check", "verify", "instructions")
_ADDED = {"H0": (), "H1": ("batch",), "H2": ("check",), "H3": ("verify",),
          "H4": ("instructions",), "H5": ADDITIONS}
FIELD_GROUPS = ("task", "notes", "elements")
SWAPS = (("H0", "H1"), ("H0", "H2"), ("H0", "H3"), ("H0", "H4"), ("H0", "H5"),
         ("H1", "H5"), ("H2", "H5"), ("H3", "H5"), ("H4", "H5"))
"""The nine swaps of the harness-transfer study: each addition on its own, and each single
addition to the full harness."""

WAIT = 0
DISTRACTORS = ("scroll down", "click [0]")


@dataclasses.dataclass(frozen=True)
class HarnessSpec:
  """What a harness adds and how it lays out the observation.

  Attributes:
    name: `"H0"` ... `"H5"`.
    batch, check, verify, instructions: the four additions.
    field_order: the order of the field groups `("task", "notes", "elements")`.
    reverse_fields: reverse the order of every observation field (lines).
  """

  name: str
  batch: bool = False
  check: bool = False
  verify: bool = False
  instructions: bool = False
  field_order: tuple[str, ...] = FIELD_GROUPS
  reverse_fields: bool = False

  def __post_init__(self):
    order = tuple(self.field_order)
    if sorted(order) != sorted(FIELD_GROUPS):
      raise ValueError(f"field_order: expected a permutation of {FIELD_GROUPS}, got {order}")
    object.__setattr__(self, "field_order", order)


def harness_spec(name: str, *, reverse_fields: bool = False,
                 field_order: Sequence[str] = FIELD_GROUPS) -> HarnessSpec:
  """The spec of harness `name` (one of `HARNESSES`)."""
  if name not in _ADDED:
    raise ValueError(f"harness: expected one of {HARNESSES}, got {name!r}")
  return HarnessSpec(name, **{a: a in _ADDED[name] for a in ADDITIONS},
                     field_order=tuple(field_order), reverse_fields=bool(reverse_fields))


@dataclasses.dataclass(frozen=True)
class Action:
  """A semantic action: `clicks` executed in order, or `wait` / `verify`.

  Attributes:
    name: `"wait"`, `"click [k]"`, `"click [i] [j] ..."` or `"verify"`.
    clicks: element indices clicked in order (empty for wait and verify).
  """

  name: str
  clicks: tuple[int, ...] = ()


def _verdict(task, page) -> str:
  ready, message = task.check(page)
  return f"{'pass' if ready else 'fail'} ({message})"


def _click_name(clicks) -> str:
  return "click " + " ".join(f"[{e + 1}]" for e in clicks)


def candidate_outputs(task: tasks_lib.Task) -> tuple[str, ...]:
  """The outputs every harness of `task` decodes (shared across harnesses)."""
  e = len(task.elements)
  return (("wait",) + tuple(_click_name((i,)) for i in range(e))
          + tuple(_click_name(b) for b in task.batches()) + ("verify",) + DISTRACTORS)


class CompiledHarness:
  """A task instance under one harness: the `TabularHarness` and its bookkeeping.

  States are `(page state, verified flag)` pairs numbered
  `page + num_page_states * verified`, then the absorbing end state last
  (`done_state`); without the verification tool the flag is always 0.

  Attributes:
    task: the `Task`.
    spec: the `HarnessSpec`.
    actions: the `A` semantic `Action`s (action 0 is `wait`).
    harness: the `TabularHarness` (its `mdp` is a dense `TabularMDP`).
    page_of_state: int `[S]`, each state's page state (-1 for the end).
    verified_of_state: bool `[S]`.
  """

  def __init__(self, task: tasks_lib.Task, spec: HarnessSpec, *, discount: float = 0.9,
               dtype=None):
    if not isinstance(task, tasks_lib.Task):
      raise ValueError(f"task: expected a Task instance, got {type(task).__name__}")
    if not 0.0 <= float(discount) < 1.0:
      raise ValueError(f"discount: expected a float in [0, 1), got {discount!r}")
    self.task, self.spec = task, spec
    dtype = jax.dtypes.canonicalize_dtype(dtype if dtype is not None else jnp.float64)
    p_pages = task.num_page_states
    flags = 2 if spec.verify else 1
    self.done_state = p_pages * flags
    s = self.done_state + 1
    self.page_of_state = np.array([st % p_pages for st in range(self.done_state)] + [-1])
    self.verified_of_state = np.array([st >= p_pages for st in range(self.done_state)]
                                      + [False])
    actions = [Action("wait")] + [Action(_click_name((e,)), (e,))
                                  for e in range(len(task.elements))]
    if spec.batch:
      actions += [Action(_click_name(b), tuple(b)) for b in task.batches()]
    if spec.verify:
      actions.append(Action("verify"))
    self.actions = tuple(actions)
    a = len(actions)
    # Every single click once (pages x visible elements); batches compose from this.
    self._click_table = {(page, e): task.click(page, e) for page in range(p_pages)
                         for e in task.visible(page)}

    p = np.zeros((s, a, s))
    r = np.zeros((s, a))
    avail = np.zeros((s, a), bool)
    for st in range(self.done_state):
      page, verified = int(self.page_of_state[st]), bool(self.verified_of_state[st])
      for k, act in enumerate(actions):
        nxt = self._execute(page, verified, act)
        if nxt is None:
          continue
        (next_page, next_verified), reward = nxt
        avail[st, k] = True
        dest = self.done_state if next_page is None else next_page + p_pages * next_verified
        p[st, k, dest] = 1.0
        r[st, k] = reward
      # Unavailable actions: a self-loop with reward 0 (never taken: pi_ref = 0).
      p[st, ~avail[st], st] = 1.0
    p[self.done_state, :, self.done_state] = 1.0
    avail[self.done_state, WAIT] = True
    pi_ref = avail / avail.sum(axis=1, keepdims=True)
    mu0 = np.zeros(s)
    mu0[task.initial_state] = 1.0
    mdp = mdp_lib.TabularMDP(transitions=p.astype(dtype), rewards=r.astype(dtype),
                             discount=np.asarray(discount, dtype), initial=mu0.astype(dtype))

    self.outputs = candidate_outputs(task)
    index = {act.name: k for k, act in enumerate(actions)}
    table = np.full((s, len(self.outputs)), interface.INVALID, np.int32)
    for st in range(s):
      for o, out in enumerate(self.outputs):
        k = index.get(out)
        if k is not None and avail[st, k]:
          table[st, o] = k
    self.harness = interface.TabularHarness(
        mdp=mdp, pi_ref=pi_ref.astype(dtype), decode_table=table,
        action_names=tuple(act.name for act in actions), output_names=self.outputs,
        noop_action=WAIT, encoder=self.observation, name=spec.name)

  # -- execution --------------------------------------------------------------

  def _execute(self, page: int, verified: bool, act: Action):
    """`((next page or None, verified), reward)`, or None if unavailable."""
    if act.name == "wait":
      return (page, False), 0.0
    if act.name == "verify":
      return (page, True), 0.0
    for e in act.clicks:  # a batch must be executable click by click
      outcome = self._click_table.get((page, e))  # None: e not visible on this page
      if outcome is None:
        return None
      next_page, reward = outcome
      if next_page is None and self.spec.check and reward < tasks_lib.SUCCESS_REWARD:
        return (page, False), 0.0  # the check blocks a failing finish; the batch stops
      page = next_page
      if page is None:
        return (None, False), reward
    return (page, False), 0.0

  # -- encoding ---------------------------------------------------------------

  def fields(self, state: int) -> list[tuple[str, str]]:
    """The observation fields of `state` as `(name, value)` pairs, in order."""
    self._check_state(state)
    task, spec = self.task, self.spec
    if state == self.done_state:
      groups = {"task": [("task", "done")], "elements": [], "notes": []}
    else:
      page = int(self.page_of_state[state])
      elements = []
      for e in task.visible(page):
        el = task.elements[e]
        status = task.status(page, e)
        elements.append((f"[{e + 1}]", f'{el.kind} "{el.text}"' + (f" ({status})"
                                                                     if status else "")))
      notes = [("commands", self._commands())]
      if spec.instructions:
        notes.append(("instructions", task.instructions))
      if spec.check:
        notes.append(("check", _verdict(task, page)))
      if spec.verify:
        notes.append(("verify", _verdict(task, page) if self.verified_of_state[state]
                      else "not run"))
      groups = {"task": [("task", task.utterance)], "elements": elements, "notes": notes}
    out = [f for g in spec.field_order for f in groups[g]]
    return out[::-1] if spec.reverse_fields else out

  def observation(self, state: int) -> str:
    """The text a model reads in `state`: one `name: value` line per field."""
    return "\n".join(f"{k}: {v}" for k, v in self.fields(int(state)))

  def _commands(self) -> str:
    cmds = ["click [id]", "wait"]
    if self.spec.batch:
      cmds.insert(1, "click [id] [id] ... (several at once)")
    if self.spec.verify:
      cmds.append("verify")
    return ", ".join(cmds)

  def _check_state(self, state):
    if not isinstance(state, (int, np.integer)) or not 0 <= state <= self.done_state:
      raise ValueError(f"state: expected a state id in [0, {self.done_state}], got {state!r}")

  def state_of(self, page: int | None, verified: bool = False) -> int:
    """The state id of a page state (None: the end) and verified flag."""
    if page is None:
      return self.done_state
    return int(page) + self.task.num_page_states * int(bool(verified) and self.spec.verify)

  def __repr__(self):
    return (f"CompiledHarness({self.task.family}, {self.spec.name}, S={self.done_state + 1}, "
            f"A={len(self.actions)}, O={len(self.outputs)})")


def compile_harness(task: tasks_lib.Task, harness: str | HarnessSpec = "H0", *,
                    discount: float = 0.9, reverse_fields: bool = False,
                    dtype=None) -> CompiledHarness:
  """A task instance under harness `harness` (a name from `HARNESSES` or a spec).

  Args:
    task: a `Task` (e.g. `tasks.sample_task("click-option", seed)`).
    harness: `"H0"` ... `"H5"`, or a `HarnessSpec`.
    discount: gamma, the per-step factor that stands in for MiniWoB++'s time
      decay of the reward (docs/harnesses.md §2).
    reverse_fields: reverse the observation field order (ignored for a spec).
    dtype: float dtype of the MDP (default: JAX's default float).

  Returns:
    `CompiledHarness`; `.harness` is the `TabularHarness`.
  """
  spec = harness if isinstance(harness, HarnessSpec) else harness_spec(
      harness, reverse_fields=reverse_fields)
  return CompiledHarness(task, spec, discount=discount, dtype=dtype)


def compile_all(task: tasks_lib.Task, *, discount: float = 0.9, reverse_fields: bool = False,
                dtype=None) -> dict[str, CompiledHarness]:
  """`{"H0": ..., "H5": ...}` for one task instance."""
  return {h: compile_harness(task, h, discount=discount, reverse_fields=reverse_fields,
                             dtype=dtype) for h in HARNESSES}
