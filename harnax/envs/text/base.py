"""The interface every text game in `harnax.envs.text` implements.

A text game is a gymnasium environment whose observations and actions are strings:

  obs, info = env.reset(seed=None, options=None)
  obs, reward, terminated, truncated, info = env.step("take apple 1 from countertop 1")

`info` always carries the keys of :data:`INFO_KEYS`:

* ``"goal"`` (str): the task text shown to the agent ("put a clean egg in microwave").
* ``"admissible"`` (tuple[str, ...] | None): the commands the game accepts in this state, or
  None where the game was asked not to compute them (their list can dominate the step time).
* ``"won"`` (bool): the task is solved.
* ``"score"`` (float): task progress in [0, 1] (1 when won).
* ``"moves"`` (int): actions executed since the reset.

Rewards are the change in ``score``. An episode terminates when won (or, in ScienceWorld, lost)
and is truncated after the environment's step limit.

:class:`GameTask` names one playable task instance; a game's ``tasks(split)`` lists them and
``make(task)`` builds the environment that plays it. ``expert_plan()`` returns an action sequence
that wins from the current state (ALFWorld: the planner's; ScienceWorld: the gold path).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

INFO_KEYS = ("goal", "admissible", "won", "score", "moves")
SPLITS = ("seen", "unseen")


class GameLoadError(RuntimeError):
  """A game could not be loaded or started; the message names the cause and the fix."""


@dataclasses.dataclass(frozen=True)
class GameTask:
  """One playable task instance.

  Attributes:
    game: "alfworld" or "scienceworld".
    task_type: the family, e.g. "pick_and_place_simple" or "boil".
    split: "seen" or "unseen" (ALFWorld: unseen floor plans; ScienceWorld: its test variations).
    ident: unique, stable name of the instance, usable as a file name
      (e.g. "alfworld-FloorPlan1-pick_and_place_simple-3", "scienceworld-boil-12").
    params: game-specific, hashable parameters that rebuild the instance
      (floor plan and generator seed; task name and variation index; a game-file path).
  """

  game: str
  task_type: str
  split: str
  ident: str
  params: tuple = ()

  def __post_init__(self):
    if self.split not in SPLITS:
      raise ValueError(f"split: expected one of {SPLITS}, got {self.split!r}")


@runtime_checkable
class TextGame(Protocol):
  """The gymnasium-style API of a text game (see the module docstring for `info`)."""

  task: GameTask

  def reset(self, *, seed: int | None = None, options: dict | None = None
            ) -> tuple[str, dict]: ...

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...

  def expert_plan(self) -> list[str]: ...

  def close(self) -> None: ...
