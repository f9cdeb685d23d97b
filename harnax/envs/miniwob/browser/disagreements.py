"""Comparing a replayed page episode with its compiled MDP.

Per semantic action the harness state (page state, verified flag, end of the
episode), the raw reward, the sign of the time-decayed reward, the elements
shown, that the state is reachable in the MDP and that every clicked element
was on the page; before the first action the initial state and elements. Each
difference is one `Disagreement`. Why only the sign of the env reward:
docs/browser.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob.browser import episodes as episodes_lib


@dataclasses.dataclass(frozen=True)
class Disagreement:
  """A place where the real page and the compiled MDP differ.

  Attributes:
    family, seed, harness: the episode.
    sequence: `"random-<k>"` or `"optimal"`.
    step: index of the semantic action (-1: the initial page).
    actions: the action names executed up to and including `step`.
    field: what differs (`"state"`, `"raw_reward"`, `"env_reward_sign"`,
      `"visible"`, `"clickable"`, `"reachable"`, `"timed_out"`).
    expected, observed: the MDP's and the page's values.
  """

  family: str
  seed: int
  harness: str
  sequence: str
  step: int
  actions: tuple[str, ...]
  field: str
  expected: Any
  observed: Any

  def __str__(self):
    return (f"{self.family} seed={self.seed} {self.harness} {self.sequence} step {self.step} "
            f"after {list(self.actions)}: {self.field} expected {self.expected!r}, observed "
            f"{self.observed!r}")


def reachable_states(compiled: harnesses_lib.CompiledHarness) -> frozenset[int]:
  """States of the compiled MDP reachable from its initial state."""
  p = np.asarray(compiled.harness.mdp.transitions)
  avail = np.asarray(compiled.harness.pi_ref) > 0
  start = compiled.state_of(compiled.task.initial_state)
  seen, frontier = {start}, [start]
  while frontier:
    s = frontier.pop()
    for k in np.flatnonzero(avail[s]):
      for s2 in np.flatnonzero(p[s, k] > 0):
        if int(s2) not in seen:
          seen.add(int(s2))
          frontier.append(int(s2))
  return frozenset(seen)


def compare(result: episodes_lib.Replay, *, sequence: str = "") -> list[Disagreement]:
  """The disagreements between a `Replay` and its compiled MDP.

  Args:
    result: the replayed episode.
    sequence: its label in the records (`"random-<k>"`, `"optimal"`).

  Returns:
    The `Disagreement`s, in step order (empty: page and MDP agree).
  """
  compiled, task = result.compiled, result.compiled.task
  reachable = reachable_states(compiled)
  found: list[tuple[int, str, Any, Any]] = []  # (step, field, expected, observed)

  start = compiled.state_of(task.initial_state)
  if result.initial_state != start:
    found.append((-1, "state", start, result.initial_state))
  if result.initial_visible != task.visible(task.initial_state):
    found.append((-1, "visible", task.visible(task.initial_state), result.initial_visible))
  for t, s in enumerate(result.steps):
    if s.reason == "timed out":
      # MiniWoB++ ends an episode after 10 s of wall time: a slow machine, not the model.
      found.append((t, "timed_out", "episode within 10 s", s.reason))
    if s.missing:
      found.append((t, "clickable", "every clicked element on the page",
                    f"missing {list(s.missing)}"))
    if s.state not in reachable:
      found.append((t, "reachable", sorted(reachable), s.state))
    if s.state != s.expected_state:
      found.append((t, "state", (s.expected_page, s.expected_state), (s.page, s.state)))
    if abs(s.raw_reward - s.expected_reward) > 1e-6:
      found.append((t, "raw_reward", s.expected_reward, s.raw_reward))
    if np.sign(s.env_reward) != np.sign(s.raw_reward):
      found.append((t, "env_reward_sign", float(np.sign(s.raw_reward)), s.env_reward))
    if s.page is not None and s.visible != task.visible(s.page):
      found.append((t, "visible", task.visible(s.page), s.visible))
  return [Disagreement(result.family, result.seed, compiled.spec.name, sequence, step,
                       tuple(s.name for s in result.steps[:step + 1]), field, expected, observed)
          for step, field, expected, observed in found]
