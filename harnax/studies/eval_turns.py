"""What the turns of a kept evaluation show, beyond who won (docs/had.md).

Two readings of the greedy evaluations `had_study.evaluations` keeps, counted turn by turn:

- `reasoning_mismatch`: the turns whose action the turn's own reasoning does not name
  (`had.names_action`: the action's words in order, so a paraphrase names nothing and the
  count is an upper bound on real disagreement).
- `transformation_progress`: ALFWorld's heat, clean and cool tasks (find the object, take
  it, heat/clean/cool it with the appliance, put it in the goal's receptacle): whether the
  episode got as far as the transformation, and where its first `move` after it went.
- `transformation_stages`: the same episodes, stage by stage before the transformation: the
  goal's object seen, taken, carried to the appliance; and the turns it took to take it.

  python scripts/eval_turns.py --evals=DIR[,DIR...]

(`compare_evaluations.read_logs` reads and checks the kept evaluations.)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from harnax.train import had
from harnax.train import rollouts

# The observation ALFWorld prints when the transformation succeeds, by the word the task type
# carries ("pick_heat_then_place_in_recep").
TRANSFORMATIONS = {"heat": "You heat", "clean": "You clean", "cool": "You cool"}
_MOVE = re.compile(r"^move .+ to (.+?)(?: \d+)?$")
# The appliance each transformation needs (ALFWorld's receptacle types).
APPLIANCES = {"heat": "microwave", "clean": "sinkbasin", "cool": "fridge"}
# ALFWorld's two goal phrasings of these tasks: "heat some egg and put it in fridge" and
# "put a hot egg in fridge"; group 1 or 2 is the object type, the last word the receptacle.
_GOAL = re.compile(r"^(?:(?:heat|clean|cool) some (\w+) and put it in|"
                   r"put a (?:hot|clean|cool) (\w+) in) \w+$")


@dataclasses.dataclass(frozen=True)
class _Counts:
  """Integer counts that add field by field (one evaluation's, then pooled)."""

  def __add__(self, other):
    return type(self)(*(a + b for a, b in zip(dataclasses.astuple(self),
                                              dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True)
class Progress(_Counts):
  """Counts over heat/clean/cool episodes.

  Attributes:
    episodes: such episodes; transformed: those whose object was heated/cleaned/cooled;
    won: those won; to_goal / elsewhere: transformed episodes whose first `move` after the
    transformation went to the goal's receptacle type / to another; no_move: transformed
    episodes with no `move` after it.
  """
  episodes: int = 0
  transformed: int = 0
  won: int = 0
  to_goal: int = 0
  elsewhere: int = 0
  no_move: int = 0


@dataclasses.dataclass(frozen=True)
class Stages(_Counts):
  """Counts over heat/clean/cool episodes, each stage counted on its own.

  Attributes:
    episodes: such episodes; seen: those where an observation showed an object of the goal's
    type ("egg 2"); taken: those where the agent picked one up; carried: those that arrived at
    the transformation's appliance (`APPLIANCES`) after picking one up, or picked it up
    there; transformed: those whose object was heated/cleaned/cooled; won: those won.
    take_turns: over the taken episodes, the turns played up to and including the first
    pick-up (their sum).
  """
  episodes: int = 0
  seen: int = 0
  taken: int = 0
  carried: int = 0
  transformed: int = 0
  won: int = 0
  take_turns: int = 0


def _turns(records: Iterable[Mapping]) -> list[Mapping]:
  return [r for r in records if r.get("kind") == "turn"]


def reasoning_mismatch(records: Iterable[Mapping]) -> tuple[int, int]:
  """`(k, n)`: of the `n` turns with a parsed action, the `k` whose reasoning does not name it."""
  k = n = 0
  for r in _turns(records):
    if not r.get("action"):
      continue
    n += 1
    k += not had.names_action(r.get("reasoning") or "", r["action"])
  return k, n


def _transformation(task_type: str) -> str | None:
  words = task_type.split("_")
  return next((w for w in words if w in TRANSFORMATIONS), None)


def _heat_clean_cool(records: Iterable[Mapping]):
  """Yields `(verb, reset, end, turns)` for each heat/clean/cool episode of a log."""
  for episode, recs in rollouts.episodes(list(records)).items():
    reset = next((r for r in recs if r.get("kind") == "reset"), None)
    end = next((r for r in recs if r.get("kind") == "episode"), None)
    if reset is None or end is None:
      raise ValueError(f"records: episode {episode} needs a 'reset' and an 'episode' record "
                       "(an evaluation stopped mid-write?)")
    verb = _transformation(str(reset["task"].get("task_type", "")))
    if verb is not None:
      yield verb, reset, end, _turns(recs)


def transformation_stages(records: Iterable[Mapping]) -> Stages:
  """`Stages` of one evaluation log's heat/clean/cool episodes (other episodes are skipped).

  The goal's object type comes from its phrasing (`_GOAL`); an episode whose goal is phrased
  otherwise is refused (ValueError naming the goal), as its stages could not be told.
  """
  total = Stages()
  for verb, reset, end, turns in _heat_clean_cool(records):
    goal = str(reset.get("goal") or "")
    m = _GOAL.match(goal)
    if m is None:
      raise ValueError(f"goal: expected 'heat some X and put it in Y' or 'put a hot X in Y' "
                       f"(or clean/cool), got {goal!r}")
    obj = m.group(1) or m.group(2)
    shown = re.compile(rf"\b{re.escape(obj)} \d+")
    observations = [str(reset.get("observation") or "")] + [
        str(r.get("observation") or "") for r in turns]
    taken = next((i for i, r in enumerate(turns)
                  if str(r.get("observation") or "").startswith(f"You pick up the {obj} ")),
                 None)
    # At the appliance with the object: arrived there after the pick-up, or picked it up
    # there ("You pick up the egg 1 from the fridge 1." in a cool task).
    carried = taken is not None and (
        f" from the {APPLIANCES[verb]} " in str(turns[taken].get("observation") or "")
        or any(str(r.get("observation") or "").startswith(f"You arrive at {APPLIANCES[verb]} ")
               for r in turns[taken + 1:]))
    total += Stages(
        episodes=1, seen=int(any(shown.search(o) for o in observations)),
        taken=int(taken is not None), carried=int(carried),
        transformed=int(any(str(r.get("observation") or "").startswith(TRANSFORMATIONS[verb])
                            for r in turns)),
        won=int(bool(end.get("won"))), take_turns=0 if taken is None else taken + 1)
  return total


def transformation_progress(records: Iterable[Mapping]) -> Progress:
  """`Progress` of one evaluation log's heat/clean/cool episodes (other episodes are skipped).

  The goal's receptacle is the goal's last word ("put a hot bread in garbagecan" ->
  "garbagecan"); a `move X to Y N` goes to receptacle type Y.
  """
  total = Progress()
  for verb, reset, end, turns in _heat_clean_cool(records):
    at = next((i for i, r in enumerate(turns)
               if (r.get("observation") or "").startswith(TRANSFORMATIONS[verb])), None)
    won = bool(end.get("won"))
    if at is None:
      total += Progress(episodes=1, won=int(won))
      continue
    words = str(reset.get("goal") or "").split()
    receptacle = words[-1] if words else None
    moves = [_MOVE.match(r.get("action") or "") for r in turns[at + 1:]]
    first = next((m.group(1) for m in moves if m), None)
    total += Progress(episodes=1, transformed=1, won=int(won),
                      to_goal=int(first is not None and first == receptacle),
                      elsewhere=int(first is not None and first != receptacle),
                      no_move=int(first is None))
  return total
