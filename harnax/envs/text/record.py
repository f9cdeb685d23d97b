"""The harness record: what the agent has observed in a text game, and what contradicts it.

The record is the state-tracking component of the text-game harness (docs/text_harness.md). It
holds only facts read from the game's own observations (by the per-game observers in
:mod:`harnax.envs.text.observers`), never the game's hidden state:

* ``location``: where the agent is (a receptacle in ALFWorld, a room in ScienceWorld);
* ``places``: every known place, whether it was visited, and (ScienceWorld) its exits with their
  door states;
* ``contents``: per receptacle/container/room, the objects seen in it at its last observation
  (and the turn of that observation), so "the fridge was seen without the apple" is a fact;
* ``objects``: per object, where it was last seen and when (``"inventory"`` when carried);
* ``openness``: per openable thing, ``"open"`` or ``"closed"`` as last observed;
* ``inventory``: what the agent carries, with whether the list is complete;
* ``properties``: object states caused by the agent (hot, cool, clean, sliced, on).

:meth:`Record.contradiction` answers "does this action contradict what the harness has
observed?" with the reason, the question HAD's validity filter asks of a teacher's action.
"""

from __future__ import annotations

import copy
import dataclasses
import re

OPEN = "open"
CLOSED = "closed"
INVENTORY = "inventory"
GAMES = ("alfworld", "scienceworld")


@dataclasses.dataclass
class Place:
  """A known place.

  Attributes:
    visited: the agent has been there.
    exits: ScienceWorld only: neighbouring room -> door state ("open", "closed"); None until
      the place's exits were observed (a "look around" there).
  """

  visited: bool = False
  exits: dict[str, str] | None = None


@dataclasses.dataclass
class Sighting:
  """Where an object was last seen (a place, a container, or "inventory") and at which turn."""

  where: str
  turn: int


@dataclasses.dataclass
class Record:
  """What the agent has observed so far in one episode (see the module docstring).

  Attributes:
    game: "alfworld" or "scienceworld" (selects the action grammar of `contradiction`).
    turn: the number of turns observed since the reset.
    location: the agent's place, or None (ALFWorld's start "in the middle of a room", or not
      yet observed).
    places: place name -> :class:`Place`.
    places_complete: every place of the episode is in `places` (ALFWorld lists them all in its
      opening text).
    contents: container/place -> (objects seen in it, turn of that observation).
    objects: object -> :class:`Sighting`.
    openness: openable receptacle/container -> "open" or "closed".
    inventory: objects carried (in the order they were observed).
    inventory_complete: `inventory` is the full list (ALFWorld starts empty; ScienceWorld's is
      complete once an "inventory" command was observed).
    properties: object -> states the game reported ("hot", "cool", "clean", "sliced", "on").
    nearby: ALFWorld only: receptacles that share the agent's spot (the game offers no "go to"
      for them, they are opened and used from here), read off the admissible commands.
    goal: the task sentence (the harness sets it at the reset); it selects the objects of the
      rendered ``task objects`` line.
  """

  game: str
  turn: int = 0
  location: str | None = None
  places: dict[str, Place] = dataclasses.field(default_factory=dict)
  places_complete: bool = False
  contents: dict[str, tuple[tuple[str, ...], int]] = dataclasses.field(default_factory=dict)
  objects: dict[str, Sighting] = dataclasses.field(default_factory=dict)
  openness: dict[str, str] = dataclasses.field(default_factory=dict)
  inventory: list[str] = dataclasses.field(default_factory=list)
  inventory_complete: bool = False
  properties: dict[str, set[str]] = dataclasses.field(default_factory=dict)
  nearby: set[str] = dataclasses.field(default_factory=set)
  goal: str = ""

  def __post_init__(self):
    if self.game not in GAMES:
      raise ValueError(f"game: expected one of {GAMES}, got {self.game!r}")

  # ---- updates (called by the observers) -------------------------------------------------

  def copy(self) -> Record:
    """An independent snapshot (the harness keeps one per turn)."""
    return copy.deepcopy(self)

  def add_place(self, name: str) -> Place:
    return self.places.setdefault(name, Place())

  def arrive(self, name: str):
    self.location = name
    self.nearby = set()
    self.add_place(name).visited = True

  def see_commands(self, admissible) -> None:
    """ALFWorld: the places the game offers no "go to" for share the agent's spot."""
    if self.game != "alfworld" or admissible is None or self.location is None:
      return
    offered = set(admissible)
    self.nearby = {p for p in self.places
                   if p != self.location and f"go to {p}" not in offered}

  def see_contents(self, where: str, items: list[str]):
    """`where` was observed to hold exactly `items` now."""
    items = tuple(dict.fromkeys(items))
    old, _ = self.contents.get(where, ((), 0))
    for gone in old:
      sighting = self.objects.get(gone)
      if gone not in items and sighting is not None and sighting.where == where:
        del self.objects[gone]  # it is no longer where it was seen; where it went is unknown
    self.contents[where] = (items, self.turn)
    for item in items:
      self.objects[item] = Sighting(where, self.turn)
      if item in self.inventory:
        self.inventory.remove(item)

  def set_openness(self, name: str, state: str):
    if state not in (OPEN, CLOSED):
      raise ValueError(f"state: expected 'open' or 'closed', got {state!r}")
    self.openness[name] = state

  def set_exit(self, place: str, neighbour: str, state: str):
    self.add_place(neighbour)
    exits = self.add_place(place).exits
    if exits is None:
      exits = self.places[place].exits = {}
    exits[neighbour] = state

  def take(self, obj: str, source: str | None = None):
    """`obj` moved into the inventory (from `source` when the game named it)."""
    sighting = self.objects.get(obj)
    where = source or (sighting.where if sighting else None)
    if where is not None and where in self.contents:
      items, turn = self.contents[where]
      self.contents[where] = (tuple(i for i in items if i != obj), turn)
    self.objects[obj] = Sighting(INVENTORY, self.turn)
    if obj not in self.inventory:
      self.inventory.append(obj)

  def put(self, obj: str, target: str):
    """`obj` moved from the agent to `target`."""
    if obj in self.inventory:
      self.inventory.remove(obj)
    sighting = self.objects.get(obj)
    if sighting is not None and sighting.where in self.contents and sighting.where != target:
      items, turn = self.contents[sighting.where]
      self.contents[sighting.where] = (tuple(i for i in items if i != obj), turn)
    if target in self.contents:
      items, turn = self.contents[target]
      if obj not in items:
        self.contents[target] = (items + (obj,), turn)
    self.objects[obj] = Sighting(target, self.turn)

  def set_inventory(self, items: list[str]):
    for item in list(self.inventory):
      if item not in items and self.objects.get(item, Sighting("", 0)).where == INVENTORY:
        del self.objects[item]
    self.inventory = list(dict.fromkeys(items))
    self.inventory_complete = True
    for item in self.inventory:
      self.objects[item] = Sighting(INVENTORY, self.turn)

  def set_property(self, obj: str, prop: str, on: bool = True):
    props = self.properties.setdefault(obj, set())
    if on:
      props.add(prop)
    else:
      props.discard(prop)

  # ---- queries ----------------------------------------------------------------------------

  def fingerprint(self, *, with_location: bool = True) -> tuple:
    """A hashable summary of the facts (turn stamps left out).

    Args:
      with_location: include where the agent is. Without it the fingerprint changes only when
        the agent learns or changes something (the loop detector's notion of progress).
    """
    facts = (
        tuple(sorted((p, v.visited, tuple(sorted((v.exits or {}).items())))
                     for p, v in self.places.items())),
        tuple(sorted((w, items) for w, (items, _) in self.contents.items())),
        tuple(sorted((o, s.where) for o, s in self.objects.items())),
        tuple(sorted(self.openness.items())),
        tuple(sorted(self.inventory)),
        self.inventory_complete,
        tuple(sorted((o, tuple(sorted(p))) for o, p in self.properties.items() if p)),
    )
    return (self.location,) + facts if with_location else facts

  def known_names(self) -> set[str]:
    """Every place, container and object name the record holds."""
    names = set(self.places) | set(self.contents) | set(self.objects) | set(self.openness)
    return names | set(self.inventory)

  def explored(self, place: str) -> bool:
    """The agent has been at `place` or has seen inside it (a receptacle beside it)."""
    known = self.places.get(place)
    return (known is not None and known.visited) or place in self.contents

  def unexplored(self) -> list[str]:
    """Known places neither visited nor seen inside, sorted by name."""
    return sorted(p for p in self.places if not self.explored(p))

  def task_objects(self) -> list[str]:
    """Objects seen whose kind (the name without its number) is a word or phrase of the goal:
    those at the agent's spot (:meth:`spot`) first, each group sorted by name."""
    goal = " ".join(re.findall(r"[a-z]+", self.goal.lower()))
    if not goal:
      return []
    def kind(name):
      return re.sub(r"\s+\d+$", "", name.lower())
    spot = set(self.spot())
    return sorted((o for o in self.objects if re.search(rf"\b{re.escape(kind(o))}\b", goal)),
                  key=lambda o: (self.objects[o].where not in spot, o))

  def spot(self) -> list[str]:
    """The places at the agent's position, as rendered: where it is, then the receptacles
    that share that spot (``also here``, sorted by name)."""
    if self.location is None:
      return []
    return [self.location] + sorted(self.nearby)

  def _status(self, place: str) -> str:
    """" (closed)" / " (unexplored)" / "": what the agent can still do at a place here."""
    if self.openness.get(place) == CLOSED:
      return " (closed)"
    return "" if self.explored(place) else " (unexplored)"

  def render(self) -> str:
    """Compact ``key: value`` lines in a stable order (sorted names), one fact group a line.

    The lines a decision rests on come first and name things exactly as commands do: the task,
    where the agent is and what can still be done there, what it carries, where the task's
    objects were seen (those at the agent's spot first, marked ``(here)``), and the places
    left to explore (sorted by name). Every choice a walkthrough expert makes from a line is
    its first fitting entry, so the order is the one a reader follows.
    """
    lines = [f"task: {self.goal.strip()}"] if self.goal.strip() else []
    spot = set(self.spot())
    lines.append(f"location: {self.location or 'unknown'}"
                 + (self._status(self.location) if self.location else ""))
    if self.nearby:
      lines.append("also here: " + ", ".join(p + self._status(p) for p in sorted(self.nearby)))
    if self.inventory:
      inv = ", ".join(self.inventory) + ("" if self.inventory_complete else " (maybe more)")
    else:
      inv = "nothing" if self.inventory_complete else "unknown"
    lines.append(f"inventory: {inv}")
    if self.goal.strip():
      seen = [f"{o} in {self.objects[o].where}" + (" (here)" if self.objects[o].where in spot
                                                   else "") for o in self.task_objects()]
      lines.append(f"task objects: {', '.join(seen) or 'none seen'}")
    if self.places_complete:  # every place is known: the ones left say it all
      lines.append(f"unexplored: {', '.join(self.unexplored()) or 'none'}")
    else:
      visited = sorted(p for p, v in self.places.items() if v.visited)
      lines.append(f"visited: {', '.join(visited) or 'none'}")
    here = self.places.get(self.location) if self.location else None
    if here is not None and here.exits is not None:
      exits = ", ".join(f"{n} ({s})" for n, s in sorted(here.exits.items()))
      lines.append(f"exits: {exits or 'none'}")
    for state in (OPEN, CLOSED):
      names = sorted(n for n, s in self.openness.items() if s == state)
      if names:
        lines.append(f"{state}: {', '.join(names)}")
    for where in sorted(self.contents):
      items, turn = self.contents[where]
      lines.append(f"seen in {where} (turn {turn}): {', '.join(items) or 'nothing'}")
    states = [f"{o} ({', '.join(sorted(p))})" for o, p in sorted(self.properties.items()) if p]
    if states:
      lines.append(f"states: {'; '.join(states)}")
    return "\n".join(lines)

  def contradiction(self, action: str) -> str | None:
    """Why `action` contradicts what the record has observed, or None if it does not.

    Only observed facts count (an object never seen is unknown, not absent): acting on a
    container the record saw closed, taking an object from where the record saw it is not,
    taking what is already carried, putting or using what the agent does not carry, acting at
    a receptacle the agent is not at (ALFWorld), going through a closed door or to a room with
    no door from here (ScienceWorld), opening what is open or closing what is closed.
    """
    from harnax.envs.text import observers  # the action grammars live with the parsers

    return observers.contradiction(self, action)
