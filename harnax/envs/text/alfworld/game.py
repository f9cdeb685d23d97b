"""The ALFWorld text game on TextWorld's PDDL engine (`textworld.envs.pddl`).

:class:`AlfWorldGame` plays one ALFWorld game file (a ``game.tw-pddl`` dictionary: PDDL domain,
grammar, PDDL problem) through ``textworld.envs.pddl.PddlEnv``, whose state lives in Fast
Downward (package ``fast-downward-textworld``). On top of the engine it

* names entities as ALFWorld shows them ("countertop 1", "sinkbasin 2"; :func:`demangle`),
* keeps the gymnasium-style API of :class:`harnax.envs.text.base.TextGame` (reward = change of
  score, terminated when won, truncated after ``max_steps`` actions),
* asks the planner for the expert plan on demand only (:meth:`AlfWorldGame.expert_plan`),
* translates each problem once: the engine translates PDDL to Fast Downward's SAS form on every
  load and reset (seconds for an ALFWorld room); the translation is a pure function of the
  domain and problem texts, so it is memoized per process.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import sys

from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask

GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
_INTRO_TASK = re.compile(r"Your task is to: (.*?)\.?\s*$", re.S)


def demangle(ids) -> dict[str, str]:
  """ALFWorld's display names of PDDL entity ids.

  "countertop_bar__minus_01_dot_87_bar_..." -> "countertop 1": the class is the part before the
  first "_bar_" (with "basin" appended for sink and bathtub basins), numbered per class. As in
  ALFWorld's demangler, instances are numbered in sorted-id order from the highest number down,
  so a game file shows the same names here as in ALFWorld. Ids without "_bar_" (the agent, type
  constants) keep their id as name.

  Args:
    ids: iterable of PDDL ids (lower case, as Fast Downward reports them).

  Returns:
    id -> name.
  """
  ids = sorted(set(ids))
  groups = collections.defaultdict(list)
  names = {}
  for i in ids:
    head, sep, _ = i.partition("_bar_")
    if not sep:
      names[i] = i
      continue
    groups[head + ("basin" if "basin" in i else "")].append(i)
  for cls, members in groups.items():
    for k, i in enumerate(members):
      names[i] = f"{cls} {len(members) - k}"
  return names


@functools.lru_cache(maxsize=64)
def _translate(domain: str, problem: str, optimize: bool):
  from fast_downward import interface
  return interface.pddl2sas(domain, problem, optimize=optimize)


@contextlib.contextmanager
def _engine_call():
  """Memoized PDDL->SAS translation during an engine call, and the process's argv untouched.

  Fast Downward's translator overwrites ``sys.argv`` (its options module parses it) and is
  called by name (`fast_downward.pddl2sas`) inside TextWorld's state constructor; both are
  restored on exit.
  """
  import fast_downward
  argv, original = list(sys.argv), fast_downward.pddl2sas

  def memoized(domain, problem, verbose=False, optimize=False):
    return _translate(domain, problem, bool(optimize))

  fast_downward.pddl2sas = memoized
  try:
    yield
  finally:
    fast_downward.pddl2sas = original
    sys.argv[:] = argv


def _check_data(data, source: str) -> dict:
  if not isinstance(data, dict):
    raise GameLoadError(f"{source}: expected a game.tw-pddl JSON object with keys {GAME_KEYS}, "
                        f"got {type(data).__name__}")
  missing = [k for k in GAME_KEYS if not isinstance(data.get(k), str) or not data[k].strip()]
  if missing:
    raise GameLoadError(f"{source}: missing or empty key(s) {missing}; an ALFWorld game file "
                        f"holds {GAME_KEYS} (regenerate it, e.g. with write_game_file)")
  if data.get("solvable") is False:
    raise GameLoadError(f"{source}: the file marks the game unsolvable ('solvable': false); "
                        f"ALFWorld skips such games, pick another")
  return data


class AlfWorldGame:
  """One ALFWorld game (see the module docstring).

  Args:
    data: the game.tw-pddl dictionary (keys ``pddl_domain``, ``grammar``, ``pddl_problem``).
    task: the task instance this game plays.
    admissible: report the admissible commands in ``info["admissible"]`` (else None).
    max_steps: actions per episode before truncation.
    goal: the task sentence, for grammars that still say "UNKNOWN GOAL".
    check_solvable: ask the planner at load time whether the goal is reachable (raises
      GameLoadError if not).
    source: where the data came from, for error messages.

  Raises:
    GameLoadError: missing planner package, malformed data, a problem the engine rejects, or
      (with `check_solvable`) an unsolvable one.
  """

  def __init__(self, data: dict, task: GameTask, *, admissible: bool = True,
               max_steps: int = 50, goal: str | None = None, check_solvable: bool = True,
               source: str = "game data"):
    if not isinstance(max_steps, int) or max_steps < 1:
      raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")
    data = dict(_check_data(data, source))
    if "UNKNOWN GOAL" in data["grammar"]:
      if not goal:
        raise GameLoadError(f"{source}: the grammar's task is 'UNKNOWN GOAL'; pass goal='...' "
                            f"(ALFWorld fills it from the trajectory's task description)")
      data["grammar"] = data["grammar"].replace("UNKNOWN GOAL", goal)
    try:
      import fast_downward  # noqa: F401
      import textworld
      from textworld.envs.pddl import PddlEnv
    except ImportError as e:
      raise GameLoadError("ALFWorld games need textworld and fast-downward-textworld: "
                          "pip install 'harnax[text]' (or pip install textworld "
                          "fast-downward-textworld)") from e
    self.task = task
    self.admissible = bool(admissible)
    self.max_steps = max_steps
    self._env = PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True))
    try:
      with _engine_call():
        self._env.load(data)
    except Exception as e:  # the engine raises bare parser / translator / KeyError errors
      self.close()
      raise GameLoadError(f"{source}: TextWorld's PDDL engine rejected the game "
                          f"({type(e).__name__}: {e}); check the problem's objects, init facts "
                          f"and goal against the domain") from e
    infos = self._env._entity_infos
    for key, name in demangle(infos).items():
      infos[key].name = name
    self._state = None
    self._moves = 0
    self._score = 0.0
    self._done = False
    obs, _ = self.reset()
    found = _INTRO_TASK.search(obs)
    self.goal = goal or (found.group(1).strip() if found else "")
    if check_solvable and not self._state["won"] and not self.expert_plan():
      self.close()
      raise GameLoadError(f"{source}: the planner finds no plan to the goal ({self.goal!r}): "
                          f"the game is unsolvable; regenerate it or drop it")

  def _info(self) -> dict:
    st = self._state
    return {
      "goal": self.goal if hasattr(self, "goal") else "",
      "admissible": tuple(st["admissible_commands"]) if self.admissible else None,
      "won": bool(st["won"]),
      "score": self._score,
      "moves": self._moves,
    }

  def reset(self, *, seed: int | None = None, options: dict | None = None
            ) -> tuple[str, dict]:
    """Starts the episode (the game is deterministic: `seed` and `options` are unused)."""
    del seed, options
    if self._env is None:
      raise RuntimeError("reset: the game is closed")
    with _engine_call():
      self._state = self._env.reset()
    self._moves = 0
    self._score = 1.0 if self._state["won"] else 0.0
    self._done = False
    return self._state.feedback, self._info()

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    """Executes one command ("Nothing happens." when the game does not accept it).

    Raises:
      RuntimeError: before reset, after the episode ended, or after close.
      TypeError: `action` is not a string.
    """
    if self._env is None or self._state is None:
      raise RuntimeError("step: call reset() first (or the game is closed)")
    if self._done:
      raise RuntimeError("step: the episode is over (won or truncated); call reset()")
    if not isinstance(action, str):
      raise TypeError(f"action: expected a str command, got {type(action).__name__}")
    self._state, _, _ = self._env.step(action)
    self._moves += 1
    score = 1.0 if self._state["won"] else 0.0
    reward, self._score = score - self._score, score
    terminated = bool(self._state["won"])
    truncated = not terminated and self._moves >= self.max_steps
    self._done = terminated or truncated
    return self._state.feedback, reward, terminated, truncated, self._info()

  def expert_plan(self) -> list[str]:
    """The planner's plan from the current state, as commands the game accepts ([] if won)."""
    if self._env is None or self._state is None:
      raise RuntimeError("expert_plan: call reset() first (or the game is closed)")
    if self._state["won"]:
      return []
    # TextWorld computes the plan only inside its per-step info gathering; asking its state
    # directly plans once, on demand.
    plan = self._env._pddl_state.replan(self._env._entity_infos)
    return list(plan)

  def close(self) -> None:
    """Frees the engine (its private copy of Fast Downward's library)."""
    env, self._env = getattr(self, "_env", None), None
    if env is not None and getattr(env, "downward_lib", None) is not None:
      import fast_downward
      fast_downward.close_lib(env.downward_lib)
      env.downward_lib = None

  def __del__(self):
    with contextlib.suppress(Exception):
      self.close()


def read_game_file(path: str | os.PathLike) -> dict:
  """Reads a game.tw-pddl file (GameLoadError names what is wrong with it)."""
  try:
    with open(path) as f:
      data = json.load(f)
  except OSError as e:
    raise GameLoadError(f"{path}: cannot read the game file ({e})") from e
  except json.JSONDecodeError as e:
    raise GameLoadError(f"{path}: not a JSON game.tw-pddl file ({e}); re-download or "
                        f"regenerate it") from e
  return _check_data(data, str(path))
