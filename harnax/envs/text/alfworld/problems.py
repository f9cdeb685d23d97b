"""ALFWorld problems generated from the `alfworld` package's own data.

A problem is one AI2-THOR floor plan (its receptacles and the object classes it holds, from
``alfworld/gen/layouts/FloorPlan*-{objects,openable}.json``) populated with object instances
placed in receptacles that can hold them (``alfworld.gen.constants.VAL_RECEPTACLE_OBJECTS``),
with the affordances ALFWorld uses (pickupable, cleanable, heatable, coolable, sliceable,
toggleable, openable) and a goal from ``alfworld.gen.goal_library`` for one of the six task
types. The text is PDDL for ALFWorld's domain (``alfworld/data/alfred.pddl``) in the order Fast
Downward reads it (objects, init, goal); with the domain and the grammar
(``alfworld/data/alfred.twl2``, its "UNKNOWN GOAL" replaced by the task sentence) it forms a
game file in the ALFWorld dataset's ``game.tw-pddl`` format.

Every generated problem is solvable by construction: the target object class is present, at
least one (two for ``pick_two_obj_and_place``) instance starts outside every receptacle of the
target class, the appliance the task needs (sink basin, microwave, fridge, desk lamp) is in the
room, and every receptacle is reachable. The tests check this with the planner.

Generation is deterministic: the same (floor plan, task type, seed) gives the same text in
every process (the random stream is seeded with a string, which Python hashes with SHA-512).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import random

TASK_TYPES = (
  "pick_and_place_simple",
  "look_at_obj_in_light",
  "pick_clean_then_place_in_recep",
  "pick_heat_then_place_in_recep",
  "pick_cool_then_place_in_recep",
  "pick_two_obj_and_place",
)

# Room types and their AI2-THOR scene numbers (alfworld.gen.constants.SCENE_TYPE).
ROOM_TYPES = {
  "kitchen": range(1, 31),
  "livingroom": range(201, 231),
  "bedroom": range(301, 331),
  "bathroom": range(401, 431),
}


def _plans(first: int, last: int) -> tuple[str, ...]:
  return tuple(f"FloorPlan{base + n}" for base in (0, 200, 300, 400)
               for n in range(first, last + 1))


# The split of `alfworld.gen.constants` (TRAIN_SCENE_NUMBERS / TEST_SCENE_NUMBERS): scenes 7-30
# of each room type are the training rooms, scenes 1-6 the held-out ones. Unseen tasks are
# played in rooms whose layout no seen task ever shows.
SEEN_FLOORPLANS = _plans(7, 30)
UNSEEN_FLOORPLANS = _plans(1, 6)

# Objects that ALFWorld's text game lets the agent carry: every class some receptacle can hold
# (alfworld.gen.constants.VAL_RECEPTACLE_OBJECTS), less the sliced variants (slicing is not
# part of the six task types).
_LIGHTS = {"DeskLamp": ("Desk", "Dresser", "SideTable")}  # toggleable lamp -> where it stands
_SINK, _MICROWAVE, _FRIDGE = "SinkBasin", "Microwave", "Fridge"
_APPLIANCE = {
  "pick_clean_then_place_in_recep": (_SINK, "Cleanable"),
  "pick_heat_then_place_in_recep": (_MICROWAVE, "Heatable"),
  "pick_cool_then_place_in_recep": (_FRIDGE, "Coolable"),
}


DISTRACTORS = 8

class ProblemError(ValueError):
  """A problem cannot be generated (unknown floor plan or task type, unsupported room)."""


@dataclasses.dataclass(frozen=True)
class Scene:
  """One floor plan's inventory.

  Attributes:
    floorplan: e.g. "FloorPlan1".
    receptacles: (THOR id, class, location id) per receptacle, sorted by id; receptacles
      facing the same pose share a location, as in ALFWorld.
    classes: the object classes the room holds (its objects.json), sorted.
  """

  floorplan: str
  receptacles: tuple[tuple[str, str, str], ...]
  classes: tuple[str, ...]

  @property
  def receptacle_classes(self) -> tuple[str, ...]:
    return tuple(sorted({c for _, c, _ in self.receptacles}))


@dataclasses.dataclass(frozen=True)
class Problem:
  """A generated problem.

  Attributes:
    floorplan, task_type, seed: what generated it.
    goal: the task sentence ("put a clean egg in microwave").
    targets: the goal's classes: "obj", "recep" (or "toggle" for look_at_obj_in_light).
    pddl_problem: the PDDL problem text.
  """

  floorplan: str
  task_type: str
  seed: int
  goal: str
  targets: tuple[tuple[str, str], ...]
  pddl_problem: str

  def game_data(self) -> dict:
    """The problem as an ALFWorld ``game.tw-pddl`` dictionary."""
    return {
      "pddl_domain": domain_text(),
      "grammar": grammar_text(self.goal),
      "pddl_problem": self.pddl_problem,
      "solvable": True,
    }


def _alfworld():
  try:
    from alfworld.gen import constants
    from alfworld.gen import goal_library
  except ImportError as e:  # pragma: no cover - the text extra installs it
    raise ImportError("ALFWorld problems need the `alfworld` package: "
                      "pip install 'harnax[text]' (or pip install alfworld)") from e
  return constants, goal_library


@functools.cache
def domain_text() -> str:
  """ALFWorld's PDDL domain (``alfworld/data/alfred.pddl``)."""
  return importlib.resources.files("alfworld").joinpath("data/alfred.pddl").read_text()


@functools.cache
def _grammar_template() -> str:
  return importlib.resources.files("alfworld").joinpath("data/alfred.twl2").read_text()


def grammar_text(goal: str) -> str:
  """ALFWorld's text grammar with the task sentence in place of "UNKNOWN GOAL"."""
  return _grammar_template().replace("UNKNOWN GOAL", goal)


def mangle(thor_id: str) -> str:
  """A THOR id ("Cabinet|+00.68|-02.20") as a PDDL name ("Cabinet_bar__plus_00_dot_68...")."""
  for a, b in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_"),
               (",", "_comma_")):
    thor_id = thor_id.replace(a, b)
  return thor_id


def _receptacle_class(thor_id: str) -> str:
  # Sinks and bathtubs are receptacles through their basin: "Sink|x|y|z|SinkBasin".
  parts = thor_id.split("|")
  return parts[4] if len(parts) == 5 else parts[0]


@functools.cache
def load_scene(floorplan: str) -> Scene:
  """The receptacles and object classes of one floor plan (from ALFWorld's layouts)."""
  if floorplan not in SEEN_FLOORPLANS + UNSEEN_FLOORPLANS:
    raise ProblemError(f"floorplan: expected one of FloorPlan1-30, 201-230, 301-330, 401-430, "
                       f"got {floorplan!r}")
  layouts = importlib.resources.files("alfworld").joinpath("gen/layouts")
  classes = json.loads(layouts.joinpath(f"{floorplan}-objects.json").read_text())
  poses = json.loads(layouts.joinpath(f"{floorplan}-openable.json").read_text())
  receptacles = []
  for thor_id in sorted(poses):
    x, z, rotation, horizon = poses[thor_id]
    # The pose the agent takes to interact with the receptacle, on ALFWorld's 0.25 m grid.
    loc = f"loc|{round(x * 4)}|{round(z * 4)}|{int(rotation) // 90}|{int(horizon)}"
    receptacles.append((thor_id, _receptacle_class(thor_id), loc))
  return Scene(floorplan, tuple(receptacles), tuple(sorted(set(classes))))


@functools.cache
def _pickupable() -> frozenset[str]:
  constants, _ = _alfworld()
  held = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
  return frozenset(c for c in held if not c.endswith("Sliced"))


@functools.cache
def _can_hold(receptacle_class: str, object_class: str) -> bool:
  constants, _ = _alfworld()
  if object_class in _LIGHTS:
    return receptacle_class in _LIGHTS[object_class]
  return object_class in constants.VAL_RECEPTACLE_OBJECTS.get(receptacle_class, ())


def _affordance(object_class: str, name: str) -> bool:
  constants, _ = _alfworld()
  return object_class in constants.VAL_ACTION_OBJECTS[name]


@functools.cache
def candidate_targets(scene: Scene, task_type: str) -> tuple[tuple[tuple[str, str], ...], ...]:
  """Every achievable goal of `task_type` in `scene`, as sorted ((role, class), ...) tuples.

  Empty when the room cannot host the task type (no appliance, no lamp, no object class).
  """
  if task_type not in TASK_TYPES:
    raise ProblemError(f"task_type: expected one of {TASK_TYPES}, got {task_type!r}")
  rclasses = scene.receptacle_classes
  objects = [c for c in scene.classes if c in _pickupable()
             and any(_can_hold(r, c) for r in rclasses)]
  if task_type == "look_at_obj_in_light":
    lights = [lamp for lamp in _LIGHTS if lamp in scene.classes
              and any(_can_hold(r, lamp) for r in rclasses)]
    return tuple((("obj", o), ("toggle", lamp)) for lamp in lights for o in objects)
  appliance, affordance = _APPLIANCE.get(task_type, (None, None))
  if appliance is not None and appliance not in rclasses:
    return ()
  out = []
  for o in objects:
    if affordance is not None and not _affordance(o, affordance):
      continue
    for r in rclasses:
      if r == appliance or not _can_hold(r, o):
        continue
      # The object must be able to start somewhere else (so the goal is not met at the start);
      # several instances may share that receptacle.
      elsewhere = [rc for rc in rclasses if rc != r and _can_hold(rc, o)]
      if not elsewhere:
        continue
      out.append((("obj", o), ("recep", r)))
  return tuple(out)


def _goal_sentence(goal_library, task_type: str, targets: dict, rng: random.Random) -> str:
  template = rng.choice(goal_library.gdict[task_type]["templates"])
  return template.format(obj=targets["obj"].lower(), recep=targets.get("recep", "").lower(),
                         toggle=targets.get("toggle", "").lower())


def generate(floorplan: str, task_type: str, seed: int, *,
             distractors: int | None = DISTRACTORS) -> Problem:
  """Generates one problem.

  Args:
    floorplan: an ALFWorld floor plan ("FloorPlan1" ... "FloorPlan430").
    task_type: one of :data:`TASK_TYPES`.
    seed: generator seed (any int); the same triple always gives the same problem.

  Returns:
    The problem.

  Raises:
    ProblemError: unknown floor plan or task type, or a room that cannot host the task type.
  """
  constants, goal_library = _alfworld()
  scene = load_scene(floorplan)
  candidates = candidate_targets(scene, task_type)
  if not candidates:
    raise ProblemError(f"task_type: {task_type!r} cannot be played in {floorplan} (the room "
                       f"lacks the appliance, lamp or objects it needs)")
  rng = random.Random(f"alfworld/{floorplan}/{task_type}/{int(seed)}")
  targets = dict(rng.choice(candidates))
  target_obj, target_recep = targets["obj"], targets.get("recep")
  goal = _goal_sentence(goal_library, task_type, targets, rng)

  # Object instances: 1-3 of each class the room holds (ALFRED's MAX_NUM_OF_OBJ_INSTANCES),
  # at least 2 of the target for pick_two_obj_and_place, each in a receptacle that can hold
  # it; the target never starts in a receptacle of the target class.
  rclasses = scene.receptacle_classes
  placeable = [c for c in scene.classes
               if (c in _pickupable() or c in _LIGHTS) and any(_can_hold(r, c) for r in rclasses)]
  if task_type == "look_at_obj_in_light":
    placeable = [c for c in placeable if c not in _LIGHTS or c == targets["toggle"]]
  else:
    placeable = [c for c in placeable if c not in _LIGHTS]
  if distractors is not None:
    others = [c for c in placeable if c not in targets.values()]
    keep = set(rng.sample(others, min(distractors, len(others)))) | set(targets.values())
    placeable = [c for c in placeable if c in keep]
  placed = []  # (object THOR id, class, receptacle THOR id, location)
  for c in placeable:
    low = 2 if (task_type == "pick_two_obj_and_place" and c == target_obj) else 1
    n = 1 if c in _LIGHTS else rng.randint(low, constants.MAX_NUM_OF_OBJ_INSTANCES)
    hosts = [rec for rec in scene.receptacles if _can_hold(rec[1], c)
             and not (c == target_obj and rec[1] == target_recep)]
    for k in range(n):
      rid, _, loc = rng.choice(hosts)
      placed.append((f"{c}|{k + 1:02d}", c, rid, loc))

  pddl = _pddl_text(constants, goal_library, scene, placed, task_type, targets,
                    f"harnax_{floorplan}_{task_type}_{int(seed)}")
  return Problem(floorplan, task_type, int(seed), goal, tuple(sorted(targets.items())), pddl)


def _pddl_text(constants, goal_library, scene, placed, task_type, targets, name) -> str:
  static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
  otypes = sorted(set(constants.OBJECTS) - static)
  rtypes = sorted(static)
  locations = sorted({loc for _, _, loc in scene.receptacles})
  start = "loc|start"  # the middle of the room: no receptacle is there

  decl = ["agent1 - agent"]
  decl += [f"{mangle(loc)} - location" for loc in [start] + locations]
  decl += [f"{mangle(rid)} - receptacle" for rid, _, _ in scene.receptacles]
  decl += [f"{mangle(oid)} - object" for oid, _, _, _ in placed]
  decl += [f"{t}Type - otype" for t in otypes]
  decl += [f"{t}Type - rtype" for t in rtypes]

  init = [f"(atLocation agent1 {mangle(start)})"]
  for rid, rc, loc in scene.receptacles:
    init.append(f"(receptacleType {mangle(rid)} {rc}Type)")
    init.append(f"(receptacleAtLocation {mangle(rid)} {mangle(loc)})")
    if rc in constants.OPENABLE_CLASS_SET:
      init.append(f"(openable {mangle(rid)})")
  affordances = (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"),
                 ("Sliceable", "sliceable"))
  for oid, c, rid, loc in placed:
    o = mangle(oid)
    init += [f"(objectType {o} {c}Type)", f"(inReceptacle {o} {mangle(rid)})",
             f"(objectAtLocation {o} {mangle(loc)})"]
    if c in _LIGHTS:
      init.append(f"(toggleable {o})")
      continue
    init.append(f"(pickupable {o})")
    if c in constants.MOVABLE_RECEPTACLES_SET:
      init.append(f"(isReceptacleObject {o})")
    init += [f"({pred} {o})" for key, pred in affordances if _affordance(c, key)]
  # The planner's translation needs the compatibility table of every type pair in play.
  oclasses = sorted({c for _, c, _, _ in placed if c not in _LIGHTS})
  for rc in scene.receptacle_classes:
    init += [f"(canContain {rc}Type {c}Type)" for c in oclasses if _can_hold(rc, c)]

  # The goal library writes types as "?x # type" and closes the problem's `define`.
  goal = goal_library.gdict[task_type]["pddl"].replace("#", "-")
  goal = goal.format(obj=targets["obj"], recep=targets.get("recep", ""),
                     toggle=targets.get("toggle", ""))
  sep = "\n    "
  return (f"(define (problem {name})\n(:domain alfred)\n(:objects{sep}{sep.join(decl)}\n)\n"
          f"(:init{sep}{sep.join(init)}\n)\n{goal.strip()}\n")
