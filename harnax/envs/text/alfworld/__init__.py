"""ALFWorld on its own engine: generated problems played through TextWorld's PDDL environment.

  tasks = alfworld.tasks("seen", per_type=5)        # deterministic GameTask list
  env = alfworld.make(tasks[0])                      # AlfWorldGame (a TextGame)
  obs, info = env.reset()                            # "-= Welcome to TextWorld, ALFRED! =- ..."
  obs, reward, terminated, truncated, info = env.step(info["admissible"][0])
  env.expert_plan()                                  # the planner's commands from here

Problems are generated from the `alfworld` package's floor plans, compatibility tables and goal
library (:mod:`.problems`); a ``game.tw-pddl`` file of the ALFWorld dataset plays through the
same code (:func:`load_game_file`). Docs: docs/text_games.md, section "ALFWorld".
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re

from harnax.envs.text.alfworld.game import AlfWorldGame
from harnax.envs.text.alfworld.game import demangle
from harnax.envs.text.alfworld.game import read_game_file
from harnax.envs.text.alfworld.problems import DISTRACTORS
from harnax.envs.text.alfworld.problems import ROOM_TYPES
from harnax.envs.text.alfworld.problems import SEEN_FLOORPLANS
from harnax.envs.text.alfworld.problems import TASK_TYPES
from harnax.envs.text.alfworld.problems import UNSEEN_FLOORPLANS
from harnax.envs.text.alfworld.problems import Problem
from harnax.envs.text.alfworld.problems import ProblemError
from harnax.envs.text.alfworld.problems import candidate_targets
from harnax.envs.text.alfworld.problems import generate
from harnax.envs.text.alfworld.problems import load_scene
from harnax.envs.text.base import SPLITS
from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask

__all__ = [
  "TASK_TYPES", "SEEN_FLOORPLANS", "UNSEEN_FLOORPLANS", "ROOM_TYPES", "DISTRACTORS",
  "AlfWorldGame", "Problem", "ProblemError", "GameLoadError", "tasks", "make", "problem",
  "load_game_file", "write_game_file", "generate", "demangle",
]

GAME = "alfworld"


def _check_task_types(task_types) -> tuple[str, ...]:
  if isinstance(task_types, str):
    task_types = (task_types,)
  task_types = tuple(task_types)
  bad = [t for t in task_types if t not in TASK_TYPES]
  if bad or not task_types:
    raise ValueError(f"task_types: expected a non-empty subset of {TASK_TYPES}, got {bad or '()'}")
  return task_types


def _room(floorplan: str) -> str:
  n = int(floorplan.removeprefix("FloorPlan"))
  return next(room for room, nums in ROOM_TYPES.items() if n in nums)


def tasks(split: str, *, per_type: int = 5, task_types=TASK_TYPES, seed: int = 0,
          distractors: int | None = DISTRACTORS, rooms=tuple(ROOM_TYPES)) -> list[GameTask]:
  """A deterministic list of generated task instances.

  For each task type, instances cycle through the room types that can host it (kitchen,
  living room, bedroom, bathroom, in that order) and, within a room type, through the split's
  floor plans in a seeded order; each instance has its own generator seed. Every instance is
  solvable by construction (see :mod:`.problems`; the tests confirm it with the planner).

  Args:
    split: "seen" (:data:`SEEN_FLOORPLANS`) or "unseen" (:data:`UNSEEN_FLOORPLANS`).
    per_type: instances per task type (>= 1).
    task_types: a subset of :data:`TASK_TYPES`.
    seed: seed of the list (different seeds give different instances).
    distractors: object classes placed besides the goal's (None: every class the room holds,
      as in ALFWorld's scenes); see :func:`.problems.generate`.
    rooms: the room types to draw floor plans from (a subset of :data:`ROOM_TYPES`, in any
      order; the cycle keeps the order above). A task type no listed room can host is an
      error.

  Returns:
    GameTask(game="alfworld", task_type, split, ident,
    params=(floorplan, generator_seed, distractors)), grouped by task type in the order of
    `task_types`.
  """
  if split not in SPLITS:
    raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
  if not isinstance(per_type, int) or per_type < 1:
    raise ValueError(f"per_type: expected a positive int, got {per_type!r}")
  task_types = _check_task_types(task_types)
  if distractors is not None and (not isinstance(distractors, int) or distractors < 0):
    raise ValueError(f"distractors: expected None or an int >= 0, got {distractors!r}")
  if isinstance(rooms, str):
    rooms = (rooms,)
  bad = [r for r in rooms if r not in ROOM_TYPES]
  if bad or not tuple(rooms):
    raise ValueError(f"rooms: expected a non-empty subset of {tuple(ROOM_TYPES)}, got "
                     f"{tuple(rooms)!r}")
  plans = SEEN_FLOORPLANS if split == "seen" else UNSEEN_FLOORPLANS
  out = []
  for task_type in task_types:
    rng = random.Random(f"alfworld-tasks/{split}/{task_type}/{int(seed)}")
    by_room = {room: [] for room in ROOM_TYPES}
    for fp in plans:
      if candidate_targets(load_scene(fp), task_type):
        by_room[_room(fp)].append(fp)
    hosts = [room for room, fps in by_room.items() if fps and room in rooms]
    if not hosts:
      raise ValueError(f"rooms: no floor plan of {tuple(rooms)} hosts {task_type!r}")
    for fps in by_room.values():
      rng.shuffle(fps)
    for i in range(per_type):
      fps = by_room[hosts[i % len(hosts)]]
      fp = fps[(i // len(hosts)) % len(fps)]
      gen_seed = rng.randrange(1_000_000)
      size = "all" if distractors is None else distractors
      out.append(GameTask(game=GAME, task_type=task_type, split=split,
                          ident=f"alfworld-{fp}-{task_type}-{gen_seed}-d{size}",
                          params=(fp, gen_seed, distractors)))
  return out


def problem(task: GameTask) -> Problem:
  """The generated problem of a task from :func:`tasks`."""
  if not isinstance(task, GameTask) or task.game != GAME:
    raise ValueError(f"task: expected an ALFWorld GameTask, got {task!r}")
  params = task.params
  if len(params) not in (2, 3) or not isinstance(params[1], int):
    raise ValueError(f"task.params: expected (floorplan, seed[, distractors]) of a generated "
                     f"task, got {params!r}")
  distractors = params[2] if len(params) == 3 else DISTRACTORS
  return generate(params[0], task.task_type, params[1], distractors=distractors)


def make(task: GameTask, *, admissible: bool = True, max_steps: int = 50,
         check_solvable: bool = True) -> AlfWorldGame:
  """The environment that plays `task` (a generated task, or one from :func:`load_game_file`).

  Args:
    task: a GameTask with game "alfworld".
    admissible: report admissible commands in ``info["admissible"]``.
    max_steps: actions per episode before truncation.
    check_solvable: run the planner once at load time (GameLoadError if there is no plan).

  Raises:
    ValueError: not an ALFWorld task, or bad params.
    GameLoadError: the game cannot be loaded or played (see :class:`AlfWorldGame`).
  """
  if not isinstance(task, GameTask) or task.game != GAME:
    raise ValueError(f"task: expected an ALFWorld GameTask, got {task!r}")
  if task.params and task.params[0] == "file":
    path = task.params[1]
    return AlfWorldGame(read_game_file(path), task, admissible=admissible, max_steps=max_steps,
                        check_solvable=check_solvable, source=str(path))
  try:
    prob = problem(task)
  except ProblemError as e:
    raise ValueError(str(e)) from e
  return AlfWorldGame(prob.game_data(), task, admissible=admissible, max_steps=max_steps,
                      check_solvable=check_solvable, source=task.ident)


def _task_type_from_path(path: pathlib.Path, data: dict) -> str:
  # ALFWorld's dataset folders are named "<task_type>-<obj>-<mrecep>-<recep>-<scene>".
  for part in reversed(path.parts):
    head = part.split("-", 1)[0]
    if head in TASK_TYPES:
      return head
  goal = data["pddl_problem"]
  if "isToggled" in goal:
    return "look_at_obj_in_light"
  for key, name in (("isClean", "clean"), ("isHot", "heat"), ("isCool", "cool")):
    if f"({key} ?o)" in goal:
      return f"pick_{name}_then_place_in_recep"
  return "pick_two_obj_and_place" if "?o2" in goal else "pick_and_place_simple"


def load_game_file(path: str | os.PathLike, *, admissible: bool = True, max_steps: int = 50,
                   split: str = "seen", task_type: str | None = None, goal: str | None = None,
                   check_solvable: bool = True) -> AlfWorldGame:
  """Plays a ``game.tw-pddl`` file (the ALFWorld dataset's format, or :func:`write_game_file`).

  Args:
    path: the game file.
    admissible, max_steps, check_solvable: as in :func:`make`.
    split: the split to record in the task ("seen" or "unseen").
    task_type: the task type to record; inferred from the dataset's folder name or the goal.
    goal: the task sentence, needed only when the grammar still says "UNKNOWN GOAL".

  Raises:
    GameLoadError: unreadable or malformed file, missing key, engine error, unsolvable game.
  """
  path = pathlib.Path(path)
  data = read_game_file(path)
  if task_type is None:
    task_type = _task_type_from_path(path.resolve(), data)
  elif task_type not in TASK_TYPES:
    raise ValueError(f"task_type: expected one of {TASK_TYPES}, got {task_type!r}")
  name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(path.resolve().parts[-3:-1]) or path.stem)
  task = GameTask(game=GAME, task_type=task_type, split=split, ident=f"alfworld-file-{name}",
                  params=("file", str(path)))
  return AlfWorldGame(data, task, admissible=admissible, max_steps=max_steps, goal=goal,
                      check_solvable=check_solvable, source=str(path))


def write_game_file(task_or_problem: GameTask | Problem, path: str | os.PathLike) -> pathlib.Path:
  """Writes a generated task's game in the ALFWorld dataset's ``game.tw-pddl`` format.

  Returns:
    The path written.
  """
  prob = task_or_problem if isinstance(task_or_problem, Problem) else problem(task_or_problem)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(prob.game_data()))
  return path
