"""Per-game text parsers of the harness: observations -> record updates, actions -> intents.

ALFWorld's texts come from its TextWorld grammar (``alfworld/data/alfred.twl2``): "You arrive at
countertop 1. On the countertop 1, you see a apple 1, and a bread 1.", "The fridge 1 is closed.",
"You open the fridge 1. The fridge 1 is open. In it, you see nothing.", "You pick up the apple 1
from the countertop 1.", "You move the apple 1 to the sinkbasin 1." (older releases: "You put
..."), "You heat the apple 1 using the microwave 1.", "You are carrying: a apple 1.", and the
opening "You are in the middle of a room. Looking quickly around you, you see a cabinet 4, ...".
Every ALFWorld name ends in its instance number ("countertop 1"), which makes lists unambiguous.

ScienceWorld's come from its engine: "This room is called the kitchen. In it, you see: \\n\\ta
counter. On the counter is: a bowl (containing a red apple, a banana), a drawer.\\n... You also
see:\\n\\tA door to the hallway (that is open)", "You move to the kitchen.", "The door is now
open.", "The cupboard is now open.", "You move the metal pot to the inventory.", "You move the
metal pot to the sink.", "In your inventory, you see:\\n\\tan orange".

Text a parser does not recognize changes nothing: the record holds only what was read.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from harnax.envs.text.record import CLOSED
from harnax.envs.text.record import GAMES
from harnax.envs.text.record import INVENTORY
from harnax.envs.text.record import OPEN

if TYPE_CHECKING:
  from harnax.envs.text.record import Record

# What each game answers to a command it cannot execute: shown in place of a rejected action's
# outcome, so a context without the harness reads as if the game itself had refused it.
INVALID_RESPONSE = {"alfworld": "Nothing happens.",
                    "scienceworld": "No known action matches that input."}


def normalize(action: str) -> str:
  """Lower case, single spaces, no surrounding blanks or final period."""
  if not isinstance(action, str):
    raise ValueError(f"action: expected a string, got {type(action).__name__}")
  return " ".join(action.strip().lower().rstrip(".").split())


def _check_game(game: str):
  if game not in GAMES:
    raise ValueError(f"game: expected one of {GAMES}, got {game!r}")


# ---- actions ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Intent:
  """A parsed action: its verb and up to two arguments (object, target), as written."""

  verb: str
  obj: str | None = None
  target: str | None = None


_ALFWORLD_ACTIONS = (
    ("look", re.compile(r"look")),
    ("inventory", re.compile(r"inventory")),
    ("help", re.compile(r"help")),
    ("goto", re.compile(r"go to (?P<target>.+)")),
    ("open", re.compile(r"open (?P<target>.+)")),
    ("close", re.compile(r"close (?P<target>.+)")),
    ("take", re.compile(r"take (?P<obj>.+?) from (?P<target>.+)")),
    ("put", re.compile(r"(?:move|put) (?P<obj>.+?) (?:to|in/on|into|in|on) (?P<target>.+)")),
    ("heat", re.compile(r"heat (?P<obj>.+?) with (?P<target>.+)")),
    ("cool", re.compile(r"cool (?P<obj>.+?) with (?P<target>.+)")),
    ("clean", re.compile(r"clean (?P<obj>.+?) with (?P<target>.+)")),
    ("slice", re.compile(r"slice (?P<obj>.+?) with (?P<target>.+)")),
    ("use", re.compile(r"use (?P<obj>.+)")),
    ("examine", re.compile(r"examine (?P<obj>.+)")),
)

_SCIENCEWORLD_ACTIONS = (
    ("look", re.compile(r"look around")),
    ("inventory", re.compile(r"inventory")),
    ("task", re.compile(r"task")),
    ("wait", re.compile(r"wait\d*(?: \d+)?")),
    ("open_door", re.compile(r"open door to (?P<target>.+)")),
    ("close_door", re.compile(r"close door to (?P<target>.+)")),
    ("goto", re.compile(r"(?:go to|go|teleport to) (?P<target>.+)")),
    ("open", re.compile(r"open (?P<target>.+)")),
    ("close", re.compile(r"close (?P<target>.+)")),
    ("take", re.compile(r"pick up (?P<obj>.+)")),
    ("drop", re.compile(r"put down (?P<obj>.+)")),
    ("put", re.compile(r"move (?P<obj>.+?) to (?P<target>.+)")),
    ("pour", re.compile(r"pour (?P<obj>.+?) (?:in|into) (?P<target>.+)")),
    ("dunk", re.compile(r"dunk (?P<obj>.+?) (?:in|into) (?P<target>.+)")),
    ("use", re.compile(r"use (?P<obj>.+?)(?: on (?P<target>.+))?")),
    ("connect", re.compile(r"connect (?P<obj>.+?) to (?P<target>.+)")),
    ("disconnect", re.compile(r"disconnect (?P<obj>.+)")),
    ("focus", re.compile(r"focus on (?P<obj>.+)")),
    ("look_at", re.compile(r"(?:look at|look in|examine) (?P<obj>.+)")),
    ("apply", re.compile(r"(?:activate|deactivate|eat|flush|mix|read) (?P<obj>.+)")),
)

_GRAMMARS = {"alfworld": _ALFWORLD_ACTIONS, "scienceworld": _SCIENCEWORLD_ACTIONS}


def parse_action(game: str, action: str) -> Intent | None:
  """The intent of `action` in `game`'s command grammar, or None if no command matches."""
  _check_game(game)
  text = normalize(action)
  for verb, pattern in _GRAMMARS[game]:
    m = pattern.fullmatch(text)
    if m:
      groups = m.groupdict()
      return Intent(verb, groups.get("obj"), groups.get("target"))
  return None


def _referent(record: Record, name: str | None) -> str | None:
  """The record's name for a ScienceWorld referent ("thermometer in inventory" -> "thermometer")
  or ALFWorld name, None when the record does not know it."""
  if name is None:
    return None
  known = record.known_names()
  if name in known:
    return name
  m = re.fullmatch(r"(.+?) in (?:the )?(.+)", name)
  if m and m.group(1) in known:
    return m.group(1)
  return None


def contradiction(record: Record, action: str) -> str | None:
  """Why `action` contradicts `record` (see :meth:`Record.contradiction`), or None."""
  intent = parse_action(record.game, action)
  if intent is None:
    return None
  if record.game == "alfworld":
    return _alfworld_contradiction(record, intent)
  return _scienceworld_contradiction(record, intent)


def _not_here(record: Record, target: str) -> str | None:
  # ALFWorld acts only on the receptacle the agent stands at.
  if (record.location is not None and target != record.location
      and target not in record.nearby and target in record.places):
    return f"you are at {record.location}, not at {target}"
  if record.location is None and target in record.places:
    return f"you have not gone to {target}"
  return None


def _alfworld_contradiction(record: Record, it: Intent) -> str | None:
  if it.verb in ("goto", "open", "close", "take", "put", "heat", "cool", "clean"):
    if record.places_complete and it.target not in record.places:
      return f"there is no {it.target} in this room"
  carried = record.inventory
  if it.verb == "goto" and it.target == record.location:
    return f"you are already at {it.target}"
  if it.verb == "take":
    if it.obj in carried:
      return f"{it.obj} is already in your inventory"
    if record.inventory_complete and carried:
      return f"your hands are full: you carry {', '.join(carried)}"
    reason = _not_here(record, it.target)
    if reason:
      return reason
    if record.openness.get(it.target) == CLOSED:
      return f"{it.target} is closed"
    if it.target in record.contents:
      items, turn = record.contents[it.target]
      if it.obj not in items:
        seen = record.objects.get(it.obj)
        also = f"; {it.obj} was last seen in {seen.where} (turn {seen.turn})" if seen else ""
        return f"{it.target} was seen without {it.obj} (turn {turn}){also}"
    return None
  if it.verb in ("put", "heat", "cool", "clean", "slice"):
    if record.inventory_complete and it.obj not in carried:
      return f"you do not carry {it.obj}"
    if it.verb == "slice":
      return None
    reason = _not_here(record, it.target)
    if reason:
      return reason
    if it.verb == "put" and record.openness.get(it.target) == CLOSED:
      return f"{it.target} is closed"
    return None
  if it.verb in ("open", "close"):
    reason = _not_here(record, it.target)
    if reason:
      return reason
    state = OPEN if it.verb == "open" else CLOSED
    if record.openness.get(it.target) == state:
      return f"{it.target} is already {state}"
    return None
  if it.verb == "use":
    seen = record.objects.get(it.obj)
    if seen is not None and seen.where not in (INVENTORY, record.location,
                                                *sorted(record.nearby)):
      return f"{it.obj} was seen in {seen.where}, and you are at {record.location or 'no place'}"
  return None


def _scienceworld_contradiction(record: Record, it: Intent) -> str | None:
  here = record.location
  exits = record.places[here].exits if here in record.places else None
  if it.verb == "goto":
    if it.target == here:
      return f"you are already in the {here}"
    if exits is not None:
      if it.target not in exits:
        return f"there is no door from the {here} to the {it.target}"
      if exits[it.target] == CLOSED:
        return f"the door to the {it.target} is closed"
    return None
  if it.verb in ("open_door", "close_door"):
    state = OPEN if it.verb == "open_door" else CLOSED
    if exits is not None:
      if it.target not in exits:
        return f"there is no door from the {here} to the {it.target}"
      if exits[it.target] == state:
        return f"the door to the {it.target} is already {state}"
    return None
  if it.verb in ("open", "close"):
    name = _referent(record, it.target)
    state = OPEN if it.verb == "open" else CLOSED
    if name is not None and record.openness.get(name) == state:
      return f"the {name} is already {state}"
    return None
  if it.verb == "take":
    name = _referent(record, it.obj)
    if name is not None and it.obj == name and name in record.inventory:
      return f"the {name} is already in your inventory"
    return None
  if it.verb == "drop":
    name = _referent(record, it.obj)
    if name is not None and record.inventory_complete and name not in record.inventory:
      return f"you do not carry the {name}"
  return None


_FILLER = frozenset("a an the in on to into of and containing inventory agent".split())


def parse_check(game: str, action: str, record: Record,
                vocabulary: frozenset[str] | None = None) -> str | None:
  """Why `action` is not a valid command here by the game's grammar and the record, or None.

  The monitor's check where the game's admissible commands are unknown (or, in ScienceWorld,
  incomplete: its engine accepts many phrasings of one command). An action must match a
  command of the game's grammar, name only things the harness has observed (ALFWorld) or words
  of the game's vocabulary (ScienceWorld: `vocabulary`, the words of its admissible commands,
  plus the record's names), and not contradict the record.

  Args:
    game: "alfworld" or "scienceworld".
    action: the command.
    record: the harness record.
    vocabulary: words the game's parser knows (None: only the record's names).
  """
  _check_game(game)
  intent = parse_action(game, action)
  if intent is None:
    return "it matches no command of the game"
  names = [n for n in (intent.obj, intent.target) if n is not None]
  if game == "alfworld":
    known = record.known_names()
    unknown = [n for n in names if n not in known]
    if unknown:
      return f"{' and '.join(unknown)} {'has' if len(unknown) == 1 else 'have'} not been observed"
  else:
    words = set(vocabulary or ()) | _FILLER
    for name in record.known_names():
      words.update(name.split())
    unknown = sorted({w for n in names for w in n.split()} - words)
    if unknown and not all(w.isdigit() for w in unknown):
      return f"the game knows no {', '.join(repr(w) for w in unknown)} here"
  return contradiction(record, action)


# ---- observations ----------------------------------------------------------------------------


def update(record: Record, action: str | None, observation: str):
  """Update `record` (in place) with the outcome `observation` of `action` (None: the opening)."""
  if not isinstance(observation, str):
    raise ValueError(f"observation: expected a string, got {type(observation).__name__}")
  if record.game == "alfworld":
    _alfworld_update(record, observation)
  else:
    _scienceworld_update(record, normalize(action) if action else "", observation)


_AW_NAME = r"[a-z][a-z]*(?: [a-z]+)*? \d+"
_AW_ENTITY = re.compile(rf"\b(?:a|an|the)\s+({_AW_NAME})\b")


def _aw_list(text: str) -> list[str]:
  """Names in an ALFWorld list ("a apple 1, a bread 1, and a knife 1"; "nothing")."""
  return _AW_ENTITY.findall(text)


def _alfworld_update(rec: Record, obs: str):
  text = " ".join(obs.split())
  m = re.search(r"Looking quickly around you, you see (.*?)\.(?: |$)", text)
  if m:
    for name in _aw_list(m.group(1)):
      rec.add_place(name)
    rec.places_complete = True
    rec.inventory_complete = True  # an ALFWorld episode starts with empty hands
    if "You are in the middle of a room" in text:
      rec.location = None
  m = re.search(rf"You arrive at (?:the )?({_AW_NAME})\.", text)
  if m:
    rec.arrive(m.group(1))
  m = re.search(rf"You are facing the ({_AW_NAME})", text)
  if m:
    rec.arrive(m.group(1))
  m = re.search(rf"You open the ({_AW_NAME})\.", text)
  if m:
    rec.set_openness(m.group(1), OPEN)
  m = re.search(rf"You close the ({_AW_NAME})\.", text)
  if m:
    rec.set_openness(m.group(1), CLOSED)
  for m in re.finditer(rf"The ({_AW_NAME}) is closed\.", text):
    rec.set_openness(m.group(1), CLOSED)
  for m in re.finditer(rf"The ({_AW_NAME}) is open\. In it, you see (.*?)\.(?: |$)", text):
    rec.set_openness(m.group(1), OPEN)
    rec.see_contents(m.group(1), _aw_list(m.group(2)))
  for m in re.finditer(rf"On the ({_AW_NAME}), you see (.*?)\.(?: |$)", text):
    rec.see_contents(m.group(1), _aw_list(m.group(2)))
  for m in re.finditer(rf"This is a normal ({_AW_NAME})\. In it, you see (.*?)\.(?: |$)", text):
    rec.see_contents(m.group(1), _aw_list(m.group(2)))
  m = re.search(rf"You pick up the ({_AW_NAME}) from the ({_AW_NAME})\.", text)
  if m:
    rec.take(m.group(1), m.group(2))
  m = re.search(rf"You (?:move|put) the ({_AW_NAME}) (?:to|in|on|in/on) the ({_AW_NAME})\.", text)
  if m:
    rec.put(m.group(1), m.group(2))
  m = re.search(rf"You (heat|cool|clean) the ({_AW_NAME}) using the ({_AW_NAME})\.", text)
  if m:
    rec.set_property(m.group(2), {"heat": "hot", "cool": "cool", "clean": "clean"}[m.group(1)])
  m = re.search(rf"You sliced the ({_AW_NAME}) with the ({_AW_NAME})\.", text)
  if m:
    rec.set_property(m.group(1), "sliced")
  m = re.search(rf"You turn (on|off) the ({_AW_NAME})\.", text)
  if m:
    rec.set_property(m.group(2), "on", m.group(1) == "on")
  m = re.search(r"You are carrying: (.*?)\.(?: |$)", text)
  if m:
    rec.set_inventory(_aw_list(m.group(1)))
  if "You are not carrying anything." in text:
    rec.set_inventory([])


_SW_CONTINUATION = re.compile(r"(?:currently|which|that|with|and|in the|on the) ")


def _sw_split(text: str) -> list[str]:
  """Top-level items of a ScienceWorld list ("a bowl (containing a, b), a drawer")."""
  pieces, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    if ch == "(":
      depth += 1
    elif ch == ")":
      depth -= 1
    elif ch == "," and depth == 0:
      pieces.append(text[start:i])
      start = i + 1
  pieces.append(text[start:])
  items: list[str] = []
  for piece in (p.strip() for p in pieces):
    if not piece:
      continue
    if items and _SW_CONTINUATION.match(piece):
      items[-1] += ", " + piece  # "a thermometer, currently reading ..." is one item
    else:
      items.append(piece)
  return items


def _sw_name(desc: str) -> str:
  name = re.sub(r"^(?:a|an|the) ", "", desc.strip())
  name = re.sub(r"^substance called ", "", name)
  cut = re.search(r" \(|,|\. | in the | with | which |\.$", name)
  return (name[:cut.start()] if cut else name).strip()


def _sw_describe(rec: Record, desc: str) -> str | None:
  """Record what one item description shows (its nested contents and door); its name."""
  desc = desc.strip()
  if not desc:
    return None
  name = _sw_name(desc)
  if not name or name == "agent":
    return None
  start = desc.find("(containing ")
  listing = desc.find(" is: ")
  if start >= 0 and (listing < 0 or start < listing):
    # The outermost "(containing ...)": match its closing parenthesis (contents nest).
    start += len("(containing ")
    depth, end = 1, len(desc)
    for i in range(start, len(desc)):
      depth += {"(": 1, ")": -1}.get(desc[i], 0)
      if depth == 0:
        end = i
        break
    rec.see_contents(name, _sw_children(rec, desc[start:end]))
  m = re.search(rf"The {re.escape(name)} door is (open|closed)\.", desc)
  if m:
    rec.set_openness(name, m.group(1))
  m = re.search(rf"(?:In|On) the {re.escape(name)} is: (.*?)\.?\s*$", desc)
  if m:
    rec.see_contents(name, _sw_children(rec, m.group(1)))
  return name


def _sw_children(rec: Record, text: str) -> list[str]:
  text = text.strip().rstrip(".")
  if text in ("", "nothing"):
    return []
  return [n for n in (_sw_describe(rec, item) for item in _sw_split(text)) if n]


def _scienceworld_update(rec: Record, action: str, obs: str):
  text = obs.strip()
  m = re.match(r"This room is called the (.+?)\. In it, you see: ?\n(.*)", text, re.S)
  if m:
    room = m.group(1)
    rec.arrive(room)
    body, _, doors = m.group(2).partition("You also see:")
    items = [line.strip() for line in body.split("\n") if line.strip()]
    rec.see_contents(room, [n for n in (_sw_describe(rec, i) for i in items) if n])
    rec.places[room].exits = {}
    for d in re.finditer(r"A door to the (.+?) \(that is (open|closed)\)", doors):
      rec.set_exit(room, d.group(1), d.group(2))
    return
  m = re.fullmatch(r"You (?:move|teleport) to the (.+?)\.", text)
  if m:
    rec.arrive(m.group(1))
    return
  door = re.fullmatch(r"(?:open|close) door to (.+)", action)
  m = re.fullmatch(r"The door is (?:now|already) (open|closed)\.", text)
  if door and m and rec.location is not None:
    _sw_door(rec, rec.location, door.group(1), m.group(1))
    return
  goto = re.fullmatch(r"(?:go to|go) (.+)", action)
  if goto and text == "The door is not open." and rec.location is not None:
    _sw_door(rec, rec.location, goto.group(1), CLOSED)
    return
  m = re.fullmatch(r"The (.+?) is (?:now|already) (open|closed)\.", text)
  if m:
    rec.set_openness(m.group(1), m.group(2))
    return
  m = re.fullmatch(r"You move the (.+?) to the inventory\.", text)
  if m:
    rec.take(m.group(1))
    return
  m = re.fullmatch(r"You move the (.+?) to the (.+?)\.", text)
  if m:
    rec.put(m.group(1), m.group(2))
    return
  m = re.match(r"In your inventory, you see:\s*\n(.*)", text, re.S)
  if m:
    items = [line.strip() for line in m.group(1).split("\n") if line.strip()]
    rec.set_inventory([n for n in (_sw_describe(rec, i) for i in items) if n])
    return
  if re.match(r"(?:look at|examine|look in) ", action) and re.match(r"(?:a|an|the) ", text):
    _sw_describe(rec, text)


def _sw_door(rec: Record, here: str, there: str, state: str):
  rec.set_exit(here, there, state)
  # One door joins both rooms: its state is known from the other side too, once that side's
  # exits were observed.
  if there in rec.places and rec.places[there].exits is not None:
    rec.set_exit(there, here, state)
