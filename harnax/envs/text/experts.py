"""Walkthrough experts that act from what the harness has observed, with their reasoning.

A planner's plan (``expert_plan()``) knows where every object is: imitating it teaches a model to
guess. The teacher of the HAD study is instead trained on walkthroughs of an expert that sees
only what the agent sees — the goal, the harness record and the admissible commands — and
explains each action by the record facts it rests on. Every decision is a simple function of
the rendered context, so a small model can learn it (docs/text_agents.md).

ALFWorld (:func:`alfworld_step`), from the goal sentence (the six task types' templates):

1. carrying a target object that still needs its change (heat / cool / clean): do it when the
   appliance is here, else go to the appliance;
2. carrying a ready target: ``look at … under the lamp`` uses the lamp when it is here, else goes
   where the lamp was seen (or explores); placement puts it in a target receptacle when here,
   else goes to one (opening it first when it is closed);
3. a target object seen somewhere (not already placed): take it when here, else go there;
4. otherwise explore: open the closed receptacle here, or go to the first place the record has
   not explored (the record lists them sorted, so the choice is "the first name of that line").

Every choice is the first fitting entry of a rendered record line, and the thought quotes that
line up to the entry before the action names it (:func:`cite`): "task objects: none seen.
unexplored: cabinet 11. I go to cabinet 11." While carrying a target, the thought quotes its
inventory entry: "inventory: plate 1. It is not hot yet. I go to microwave 1."

ScienceWorld's expert is its gold path (``expert_plan()``), replayed with a generic thought.
"""

from __future__ import annotations

import dataclasses
import re

from harnax.envs.text.record import CLOSED
from harnax.envs.text.record import INVENTORY
from harnax.envs.text.record import Record

# The change each task needs, and the receptacle classes that make it (ALFWorld's appliances).
CHANGES = {"heat": ("hot", ("microwave",)), "cool": ("cool", ("fridge",)),
           "clean": ("clean", ("sinkbasin", "bathtubbasin"))}

_GOALS = (
    (re.compile(r"put a clean (?P<obj>\w+) in (?P<recep>\w+)"), "clean", 1),
    (re.compile(r"clean some (?P<obj>\w+) and put it in (?P<recep>\w+)"), "clean", 1),
    (re.compile(r"put a hot (?P<obj>\w+) in (?P<recep>\w+)"), "heat", 1),
    (re.compile(r"heat some (?P<obj>\w+) and put it in (?P<recep>\w+)"), "heat", 1),
    (re.compile(r"put a cool (?P<obj>\w+) in (?P<recep>\w+)"), "cool", 1),
    (re.compile(r"cool some (?P<obj>\w+) and put it in (?P<recep>\w+)"), "cool", 1),
    (re.compile(r"put two (?P<obj>\w+) in (?P<recep>\w+)"), None, 2),
    (re.compile(r"find two (?P<obj>\w+) and put them in (?P<recep>\w+)"), None, 2),
    (re.compile(r"look at (?P<obj>\w+) under the (?P<lamp>\w+)"), None, 1),
    (re.compile(r"examine the (?P<obj>\w+) with the (?P<lamp>\w+)"), None, 1),
    (re.compile(r"put a (?P<obj>\w+) in (?P<recep>\w+)"), None, 1),
    (re.compile(r"put some (?P<obj>\w+) on (?P<recep>\w+)"), None, 1),
)


@dataclasses.dataclass(frozen=True)
class AlfWorldGoal:
  """An ALFWorld goal sentence, parsed.

  Attributes:
    obj: the target object class ("apple").
    recep: the target receptacle class ("fridge"), or None (look-at tasks).
    change: "heat", "cool", "clean" or None.
    count: objects to place (2 for pick_two_obj_and_place).
    lamp: the light class of a look-at task ("desklamp"), or None.
  """

  obj: str
  recep: str | None = None
  change: str | None = None
  count: int = 1
  lamp: str | None = None


def parse_alfworld_goal(goal: str) -> AlfWorldGoal:
  """Parses an ALFWorld task sentence ("put a clean egg in microwave").

  Raises:
    ValueError: the sentence matches none of the six task types' templates.
  """
  text = goal.strip().lower().rstrip(".")
  text = re.sub(r"^your task is to:\s*", "", text)
  for pattern, change, count in _GOALS:
    m = pattern.fullmatch(text)
    if m:
      groups = m.groupdict()
      return AlfWorldGoal(obj=groups["obj"], recep=groups.get("recep"), change=change,
                          count=count, lamp=groups.get("lamp"))
  raise ValueError(f"goal: {goal!r} matches none of ALFWorld's six task templates")


def name_class(name: str) -> str:
  """"apple 1" -> "apple"."""
  return name.rsplit(" ", 1)[0]


@dataclasses.dataclass(frozen=True)
class ExpertStep:
  """The expert's action and the thought that explains it from the record."""

  action: str
  thought: str


def _first(commands, prefix: str) -> str | None:
  return next((c for c in commands if c.startswith(prefix)), None)


def cite(record: Record, header: str, item: str | None = None) -> str:
  """The record's rendered ``header:`` line, cut after `item` and its status mark.

  A thought quotes the line its decision rests on verbatim, so the name in the action is a
  copy of a copy: from the line into the thought (the header's tokens are the same on both
  sides, an induction a small model learns), then from the thought into the command.

  Args:
    record: the record now.
    header: a line's key ("location", "also here", "task objects", "unexplored", ...).
    item: an entry of that line: the quote ends after it (and after its "(closed)" /
      "(unexplored)" / "(here)" mark). None: the whole line.
  Raises:
    ValueError: the record renders no such line, or `item` is not on it.
  """
  prefix = f"{header}: "
  line = next((ln for ln in record.render().splitlines() if ln.startswith(prefix)), None)
  if line is None:
    raise ValueError(f"header: the record renders no {header!r} line")
  if item is None:
    return line
  m = re.search(rf"(?:(?<=: )|(?<=, )){re.escape(item)}(?: \([a-z, ]+\))?(?=,|$| in )", line)
  if m is None:
    raise ValueError(f"item: {item!r} is not on the record's {header!r} line {line!r}")
  end = m.end()
  if line[end:].startswith(" in "):  # "task objects": the entry names where it was seen
    tail = re.match(r" in [a-z]+ \d+(?: \(here\))?", line[end:])
    end += tail.end() if tail else 0
  return line[:end]


def _go(place: str, why: str) -> ExpertStep:
  return ExpertStep(f"go to {place}", f"{why} I go to {place}.")


def _places_of(record: Record, cls: str) -> list[str]:
  """The known places of a class, by instance number ("shelf 1" first)."""
  return sorted((p for p in record.places if name_class(p) == cls), key=_number)


def _number(name: str) -> int:
  tail = name.rsplit(" ", 1)[-1]
  return int(tail) if tail.isdigit() else 0


def _placed(record: Record, goal: AlfWorldGoal) -> list[str]:
  """Target objects the record saw in a receptacle of the target class."""
  return sorted(o for o, s in record.objects.items()
                if name_class(o) == goal.obj and goal.recep is not None
                and s.where != INVENTORY and name_class(s.where) == goal.recep)


def _where_line(record: Record, place: str) -> str:
  """The quote that says `place` is at the agent's spot: its location or also-here line."""
  return cite(record, "location" if place == record.location else "also here", place)


def _explore(record: Record, want: str, commands: tuple[str, ...]) -> ExpertStep:
  for place in record.spot():
    if record.openness.get(place) == CLOSED or (
        not record.explored(place) and f"open {place}" in commands):
      return ExpertStep(f"open {place}", f"{_where_line(record, place)}. I open {place}.")
    if not record.explored(place) and f"examine {place}" in commands:
      return ExpertStep(f"examine {place}", f"{_where_line(record, place)}. I examine {place}.")
  unexplored = record.unexplored()  # sorted by name, as the record renders them
  seen = cite(record, "task objects") + ". " if record.goal.strip() else ""
  if unexplored:
    return _go(unexplored[0], f"No {want} seen yet. {seen}"
                              f"{cite(record, 'unexplored', unexplored[0])}.")
  closed = sorted(p for p, s in record.openness.items() if s == CLOSED)
  if closed:
    return _go(closed[0], f"No {want} seen yet. {cite(record, 'closed', closed[0])}.")
  return ExpertStep("look", f"No {want} seen anywhere; I look around again.")


def alfworld_step(goal: AlfWorldGoal | str, record: Record,
                  admissible: tuple[str, ...] | None) -> ExpertStep:
  """The expert's next action from the goal, the harness record and the admissible commands.

  Every choice is the first fitting entry of one rendered record line, and the thought quotes
  that line up to the entry (:func:`cite`) before naming the action.

  Args:
    goal: the parsed goal or the task sentence.
    record: the harness record now (ALFWorld).
    admissible: the game's admissible commands (None: the expert writes commands itself).

  Returns:
    The action and its thought.
  """
  if isinstance(goal, str):
    goal = parse_alfworld_goal(goal)
  if record.game != "alfworld":
    raise ValueError(f"record: expected an ALFWorld record, got {record.game!r}")
  commands = tuple(admissible or ())
  local = record.spot()
  carried = [o for o in record.inventory if name_class(o) == goal.obj]

  if carried:
    obj = carried[0]
    # Only the carried object's entry: the eighth and ninth builds, whose thoughts also quoted
    # the task line here, copied names worse (docs/text_agents.md, "Status").
    inventory = cite(record, "inventory", obj)
    if goal.change is not None:
      prop, appliances = CHANGES[goal.change]
      if prop not in record.properties.get(obj, set()):
        for place in local:
          if name_class(place) in appliances:
            return ExpertStep(f"{goal.change} {obj} with {place}",
                              f"{inventory}. It is not {prop} yet. {_where_line(record, place)}. "
                              f"I {goal.change} {obj} with {place}.")
        for cls in appliances:
          places = _places_of(record, cls)
          if places:
            return _go(places[0], f"{inventory}. It is not {prop} yet.")
        return _explore(record, " or ".join(appliances), commands)
    if goal.lamp is not None:
      lamps = [o for o in record.task_objects() if name_class(o) == goal.lamp]
      for lamp in lamps:
        where = record.objects[lamp].where
        if where in local:
          return ExpertStep(f"use {lamp}", f"{inventory}. {cite(record, 'task objects', lamp)}."
                                           f" I use {lamp}.")
      if lamps:
        return _go(record.objects[lamps[0]].where,
                   f"{inventory}. {cite(record, 'task objects', lamps[0])}.")
      return _explore(record, goal.lamp, commands)
    targets = _places_of(record, goal.recep)
    for place in local:
      if name_class(place) != goal.recep:
        continue
      if record.openness.get(place) == CLOSED:
        return ExpertStep(f"open {place}", f"{inventory}. {_where_line(record, place)}. "
                                           f"I open {place}.")
      put = _first(commands, f"move {obj} to {place}") or _first(commands, f"put {obj} ")
      return ExpertStep(put or f"move {obj} to {place}",
                        f"{inventory}. {_where_line(record, place)}. I put {obj} in {place}.")
    if targets:
      return _go(targets[0], f"{inventory}. It goes in a {goal.recep}.")
    return _explore(record, goal.recep, commands)

  others = [o for o in record.inventory if name_class(o) != goal.obj]
  if others and local:
    # Carrying something the task does not need (a learner's detour): put it down first, the
    # agent holds one object at a time.
    put = _first(commands, f"move {others[0]} to {local[0]}") or _first(commands,
                                                                         f"put {others[0]} ")
    return ExpertStep(put or f"move {others[0]} to {local[0]}",
                      f"{cite(record, 'inventory', others[0])}. The task needs no "
                      f"{name_class(others[0])}. I put {others[0]} down here.")

  placed = _placed(record, goal)
  # The record's task-objects order: those at the agent's spot first.
  seen = [o for o in record.task_objects() if name_class(o) == goal.obj
          and record.objects[o].where != INVENTORY and o not in placed]
  if seen:
    obj = seen[0]
    where = record.objects[obj].where
    quote = cite(record, "task objects", obj)
    if where in local:
      if record.openness.get(where) == CLOSED:
        return ExpertStep(f"open {where}", f"{quote}. {_where_line(record, where)}. "
                                           f"I open {where}.")
      return ExpertStep(f"take {obj} from {where}", f"{quote}. I take {obj} from {where}.")
    return _go(where, f"{quote}.")
  want = goal.obj if not placed else f"second {goal.obj}"
  return _explore(record, want, commands)


def alfworld_mistakes(record: Record, admissible: tuple[str, ...]) -> list[str]:
  """Commands a learner writes wrongly in this state, none of them admissible.

  The kinds a trained agent was seen to repeat (docs/text_agents.md, "Status"): opening what
  is open or cannot be opened, a heat / cool / clean step with the wrong receptacle or none
  needed, taking a task object from where it is not, going to a name the room does not have.
  The walkthroughs insert some of them (`text_agents.walkthroughs(rejections=)`), so that the
  turn after a rejection, its feedback in the context, is in the training data.

  Returns:
    Candidate commands, sorted; empty when none applies.
  """
  here = record.spot()
  wrong = {f"open {p}" for p in here}
  for obj in record.inventory:
    wrong |= {f"{verb} {obj} with {p}" for verb in CHANGES for p in here}
  for obj in record.task_objects():
    where = record.objects[obj].where
    if where != INVENTORY and here and where not in here:
      wrong.add(f"take {obj} from {here[0]}")
  for p in here:
    numbers = [_number(q) for q in record.places if name_class(q) == name_class(p)]
    wrong.add(f"go to {name_class(p)} {max(numbers) + 1}")
  allowed = set(admissible)
  return sorted(w for w in wrong if w not in allowed)


def scienceworld_thought(record: Record, action: str) -> str:
  """A thought for a ScienceWorld gold-path action, from the record facts it rests on."""
  from harnax.envs.text import observers  # the action grammars live with the parsers

  here = record.location or "an unknown place"
  intent = observers.parse_action("scienceworld", action)
  verb = intent.verb if intent is not None else None
  if verb == "open_door":
    return f"I am in the {here}; the door to the {intent.target} is closed, so I open it."
  if verb == "goto":
    exits = (record.places.get(record.location).exits or {}) if record.location in record.places \
        else {}
    state = exits.get(intent.target)
    door = f" (the door is {state})" if state else ""
    return f"I am in the {here}; I go to the {intent.target}{door}."
  if verb == "focus":
    return f"I am in the {here}; {intent.obj} is what the task asks for, so I focus on it."
  if verb == "take":
    return f"I am in the {here}; I pick up {intent.obj} to carry it."
  return f"I am in the {here}; next I {action}."
