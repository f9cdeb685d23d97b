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
import copy
import functools
import json
import os
import re
import sys

from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask

GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
# Receptacle types the domain's clean / heat / cool actions need.
_APPLIANCES = frozenset({"sinkbasintype", "microwavetype", "fridgetype"})
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


# Copies of Fast Downward's library (TextWorld loads one per environment; the engine's state
# lives in it). A copy is never unloaded: the library's plugin registry is a process-wide
# unique symbol, so unloading a copy and loading another crashes the process. Closed games
# return their copy here and new games reuse it (loading a problem resets a copy entirely).
_LIBRARIES: list = []
_PLANNER: list = []  # the one copy that expert plans run in


def _library():
  import fast_downward
  return _LIBRARIES.pop() if _LIBRARIES else fast_downward.load_lib()


def _planner():
  if not _PLANNER:
    import fast_downward
    _PLANNER.append(fast_downward.load_lib())
  return _PLANNER[0]


@functools.lru_cache(maxsize=256)
def _translate_goal_part(domain: str, problem: str):
  # The expert's problems (see AlfWorldGame.expert_plan) repeat along an episode and across
  # resets; translated as TextWorld translates a problem for its own planner.
  with _engine_call():
    from fast_downward import interface
    return interface.pddl2sas(domain, problem, optimize=True)


def _memoized_parser(parse):
  """`parse` (a pure function of its string arguments) memoized; callers get a fresh copy.

  TextWorld parses every command template and every grammar condition with tatsu on every
  step, which is most of a step's time; the results are attached to a derivation's context
  afterwards, hence the copy.
  """
  cached = functools.lru_cache(maxsize=4096)(
    lambda args, kwargs: parse(*args, **dict(kwargs)))

  def memoized(*args, **kwargs):
    return copy.deepcopy(cached(args, tuple(sorted(kwargs.items()))))

  return memoized


@functools.cache
def _patches():
  import fast_downward
  from textworld import logic
  from textworld.envs.pddl import textgen

  def translate(domain, problem, verbose=False, optimize=False):
    return _translate(domain, problem, bool(optimize))

  return ((fast_downward, "pddl2sas", translate),
          (textgen, "_parse_and_convert", _memoized_parser(textgen._parse_and_convert)),
          (logic, "_parse_and_convert", _memoized_parser(logic._parse_and_convert)))


@contextlib.contextmanager
def _engine_call():
  """Runs an engine call with pure functions memoized and the process's argv untouched.

  Memoized during the call: Fast Downward's PDDL->SAS translation (TextWorld reruns it on every
  reset) and TextWorld's template and query parsers (rerun on every step); they are looked up
  by name at call time, so they are swapped in here and restored on exit. Fast Downward's
  translator overwrites ``sys.argv`` (its options module parses it); it is restored as well.
  Not thread-safe: play games of one process from one thread.
  """
  argv = list(sys.argv)
  saved = [(module, name, getattr(module, name)) for module, name, _ in _patches()]
  for module, name, function in _patches():
    setattr(module, name, function)
  try:
    yield
  finally:
    for module, name, function in saved:
      setattr(module, name, function)
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
    # PddlEnv's constructor loads a fresh copy of the library; reuse a pooled one instead.
    self._env = PddlEnv.__new__(PddlEnv)
    textworld.Environment.__init__(self._env, textworld.EnvInfos(admissible_commands=True,
                                                                 won=True))
    self._env.downward_lib = _library()
    self._domain = data["pddl_domain"]
    found = re.search(r"\(:goal", data["pddl_problem"], re.I)
    if found is None:
      self.close()
      raise GameLoadError(f"{source}: the PDDL problem has no (:goal ...) section")
    self._goal_pddl = data["pddl_problem"][found.start():].strip()
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
    with _engine_call():
      self._state, _, _ = self._env.step(action)
    self._moves += 1
    score = 1.0 if self._state["won"] else 0.0
    reward, self._score = score - self._score, score
    terminated = bool(self._state["won"])
    truncated = not terminated and self._moves >= self.max_steps
    self._done = terminated or truncated
    return self._state.feedback, reward, terminated, truncated, self._info()

  def expert_plan(self) -> list[str]:
    """The planner's plan from the current state, as commands the game accepts ([] if won).

    Fast Downward plans on the goal-relevant part of the current state: the facts of the
    objects of the classes the goal names and of the held object, of the receptacles that hold
    them, of the receptacles of the classes the goal names, and of the sink basins, microwaves
    and fridges (the clean / heat / cool actions), and every fact about locations, types and
    the agent. Everything else is inert in ALFWorld's domain (no receptacle fills up, nothing
    blocks an action), so a plan for the relevant part is a plan for the whole state; for the
    six task types an optimal one stays optimal, as moving other objects or parking a goal
    object elsewhere only adds steps. The planner's own search is uniform-cost, exponential in
    the number of objects and of openable receptacles; planning on the whole room takes up to
    minutes where the relevant part takes well under a second.

    Raises:
      RuntimeError: before reset or after close.
    """
    if self._env is None or self._state is None:
      raise RuntimeError("expert_plan: call reset() first (or the game is closed)")
    if self._state["won"]:
      return []
    state = self._env._pddl_state
    text = self._planning_problem(state)
    _, sas = _translate_goal_part(self._domain, text)
    planner = _planner()
    planner.load_sas(sas.encode("utf-8"))
    if not planner.solve(False):
      return []
    from fast_downward import Operator
    ops = (Operator * planner.get_last_plan_length())()
    planner.get_last_plan(ops)
    return list(state.plan_to_templated_actions([op.name for op in ops],
                                                self._env._entity_infos))

  @staticmethod
  def _goal_receptacles(facts, goal_types, keep) -> set:
    """The receptacles of the goal's classes an optimal plan may need.

    Every "go to" costs the same, so a goal receptacle at a location the plan visits anyway
    (the agent's, those of the kept objects and appliances) can save a step and is kept; of
    the others, any closed openable one costs the same as any other, and so does any open or
    not openable one: one representative of each kind is enough.
    """
    where = {f.arguments[0].name: f.arguments[1].name for f in facts
             if f.name == "receptacleatlocation"}
    visited = {f.arguments[1].name for f in facts if f.name == "atlocation"}
    visited |= {where[r] for r in keep if r in where}
    openable = {f.arguments[0].name for f in facts if f.name == "openable"}
    opened = {f.arguments[0].name for f in facts if f.name == "opened"}
    out, kinds = set(), set()
    for r in sorted(f.arguments[0].name for f in facts
                    if f.name == "receptacletype" and f.arguments[1].name in goal_types):
      kind = r in openable and r not in opened
      if where.get(r) in visited or kind not in kinds:
        out.add(r)
        kinds.add(kind)
    return out

  def _planning_problem(self, state) -> str:
    """The goal-relevant part of `state` as a PDDL problem (see :meth:`expert_plan`)."""
    facts = [f for f in state.facts if not f.name.startswith(("new-axiom", "not_"))]
    goal_types = set(re.findall(r"\b([a-z0-9]+type)\b", self._goal_pddl.lower()))
    kinds = state.name2type
    keep = {f.arguments[0].name for f in facts
            if f.name == "objecttype" and f.arguments[1].name in goal_types}
    keep |= {f.arguments[1].name for f in facts if f.name == "holds"}
    keep |= {f.arguments[0].name for f in facts
             if f.name == "receptacletype" and f.arguments[1].name in _APPLIANCES}
    keep |= {f.arguments[1].name for f in facts
             if f.name == "inreceptacle" and f.arguments[0].name in keep}
    keep |= self._goal_receptacles(facts, goal_types, keep)
    drop = {n for n, t in kinds.items() if t in ("object", "receptacle")} - keep
    decl = [f"{n} - {t}" for n, t in sorted(state.name2type.items()) if n not in drop]
    init = sorted(f"({f.name} {' '.join(v.name for v in f.arguments)})" for f in facts
                  if not any(v.name in drop for v in f.arguments))
    sep = "\n  "
    return (f"(define (problem expert)\n(:domain alfred)\n(:objects{sep}{sep.join(decl)}\n)\n"
            f"(:init{sep}{sep.join(init)}\n)\n{self._goal_pddl}\n")

  def close(self) -> None:
    """Ends the game; its copy of Fast Downward's library goes back to the pool."""
    env, self._env = getattr(self, "_env", None), None
    lib = getattr(env, "downward_lib", None)
    if lib is not None:
      env.downward_lib = None
      _LIBRARIES.append(lib)

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
