"""The text-game harness: record, action monitor, loop detector, with/without renderings.

Parser corners on transcript strings written from ALFWorld's grammar (alfworld/data/alfred.twl2)
and copied from ScienceWorld's engine; scripted episodes on the real games (slow): the record is
checked against what the observations said and against ALFWorld's true state (the PDDL facts).
"""

import pytest

from harnax.envs.text import observers
from harnax.envs.text.harness import HARNESS_BLOCK
from harnax.envs.text.harness import Harness
from harnax.envs.text.harness import HarnessConfig
from harnax.envs.text.harness import HarnessedGame
from harnax.envs.text.harness import Turn
from harnax.envs.text.harness import render_context
from harnax.envs.text.record import Record

AW_WELCOME = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking "
              "quickly around you, you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, "
              "a microwave 1, and a sinkbasin 1.\n\nYour task is to: put a hot apple in "
              "countertop.")

SW_KITCHEN = (
    "This room is called the kitchen. In it, you see: \n\tthe agent\n\ta substance called air\n"
    "\ta counter. On the counter is: a bowl (containing a red apple, a banana, an orange, a "
    "potato), a drawer.\n\ta cupboard. The cupboard door is closed. \n\ta sink, which is turned "
    "off. In the sink is: nothing.\n\ta table. On the table is: a glass cup (containing "
    "nothing).\n\ta thermometer, currently reading a temperature of 10 degrees celsius\n"
    "You also see:\n\tA door to the bathroom (that is closed)\n\tA door to the hallway (that is "
    "open)")


def _alfworld_record(steps):
  rec = Record("alfworld")
  observers.update(rec, None, AW_WELCOME)
  for action, obs in steps:
    rec.turn += 1
    observers.update(rec, action, obs)
  return rec


def test_record_render_puts_decisions_in_view():
  """The task, what can still be done here, where the task's objects were seen, and the places
  left: each is one line, naming things as commands do."""
  rec = Record("alfworld", goal="put a clean knife in drawer.")
  observers.update(rec, None, AW_WELCOME)
  for action, obs in [
      ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a apple 1,"
                             " a bread 1, and a knife 1."),
      ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed.")]:
    rec.turn += 1
    observers.update(rec, action, obs)
  rec.nearby = {"cabinet 2", "fridge 1"}
  rec.contents["fridge 1"] = ((), 2)  # looked inside from beside it: explored, not visited
  lines = rec.render().splitlines()
  assert lines[:5] == ["task: put a clean knife in drawer.", "location: cabinet 1 (closed)",
                       "also here: cabinet 2 (unexplored), fridge 1", "inventory: nothing",
                       "task objects: knife 1 in countertop 1"]
  assert "unexplored: cabinet 2, microwave 1, sinkbasin 1" in lines
  assert rec.task_objects() == ["knife 1"]  # "apple" and "bread" are not words of the goal
  assert Record("alfworld", goal="put a knife in drawer").render().splitlines()[:2] == [
      "task: put a knife in drawer", "location: unknown"]
  assert "task objects: none seen" in Record("alfworld", goal="x").render()


# ---- parser corners --------------------------------------------------------------------------


def test_alfworld_transcript_record():
  rec = _alfworld_record([
      ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a apple 1,"
                             " a bread 1, and a knife 1."),
      ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
      ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
      ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see nothing."),
      ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
      ("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1."),
      ("inventory", "You are carrying: a apple 1."),
  ])
  assert rec.places_complete and set(rec.places) == {
      "cabinet 2", "cabinet 1", "countertop 1", "fridge 1", "microwave 1", "sinkbasin 1"}
  assert rec.location == "microwave 1"
  assert {p for p, v in rec.places.items() if v.visited} == {"countertop 1", "fridge 1",
                                                             "microwave 1"}
  assert rec.contents["countertop 1"][0] == ("bread 1", "knife 1")
  assert rec.contents["fridge 1"][0] == ()
  assert rec.openness == {"fridge 1": "open", "microwave 1": "closed"}
  assert rec.inventory == ["apple 1"] and rec.inventory_complete
  assert rec.objects["apple 1"].where == "inventory"
  assert rec.objects["bread 1"].where == "countertop 1" and rec.objects["bread 1"].turn == 1
  assert rec.properties["apple 1"] == {"hot"}
  rec.turn += 1
  observers.update(rec, "move apple 1 to countertop 1",
                   "You move the apple 1 to the countertop 1.")
  assert rec.inventory == [] and "apple 1" in rec.contents["countertop 1"][0]
  observers.update(rec, "inventory", "You are not carrying anything.")
  assert rec.inventory == [] and rec.inventory_complete
  lines = rec.render().splitlines()
  assert lines[0] == "location: microwave 1 (closed)" and "inventory: nothing" in lines
  assert "unexplored: cabinet 1, cabinet 2, sinkbasin 1" in lines
  assert not any(line.startswith(("task:", "task objects:", "visited:")) for line in lines)
  assert "seen in fridge 1 (turn 4): nothing" in lines
  assert "states: apple 1 (hot)" in lines


def test_alfworld_contradictions():
  rec = _alfworld_record([
      ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a apple 1,"
                             " and a bread 1."),
      ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
  ])
  c = rec.contradiction
  assert "closed" in c("take egg 1 from fridge 1")
  assert "not at countertop 1" in c("take apple 1 from countertop 1")
  assert "no sofa 1" in c("go to sofa 1")
  assert "already at fridge 1" in c("go to fridge 1")
  assert "do not carry apple 1" in c("move apple 1 to fridge 1")
  assert "already closed" in c("close fridge 1")
  assert c("open fridge 1") is None and c("go to countertop 1") is None
  assert c("inventory") is None and c("dance wildly") is None
  rec.turn += 1
  observers.update(rec, "go to countertop 1", "You arrive at countertop 1. On the countertop 1, "
                   "you see a apple 1, and a bread 1.")
  assert "seen without egg 1" in c("take egg 1 from countertop 1")
  assert c("take apple 1 from countertop 1") is None  # never seen: unknown, not absent
  rec.turn += 1
  observers.update(rec, "take apple 1 from countertop 1",
                   "You pick up the apple 1 from the countertop 1.")
  assert "already in your inventory" in c("take apple 1 from countertop 1")
  assert "hands are full" in c("take bread 1 from countertop 1")
  assert c("move apple 1 to countertop 1") is None


def test_scienceworld_transcript_record():
  rec = Record("scienceworld")
  observers.update(rec, None, SW_KITCHEN)
  assert rec.location == "kitchen" and rec.places["kitchen"].visited
  assert rec.places["kitchen"].exits == {"bathroom": "closed", "hallway": "open"}
  assert rec.contents["kitchen"][0] == ("air", "counter", "cupboard", "sink", "table",
                                        "thermometer")
  assert rec.contents["counter"][0] == ("bowl", "drawer")
  assert rec.contents["bowl"][0] == ("red apple", "banana", "orange", "potato")
  assert rec.contents["sink"][0] == () and rec.contents["glass cup"][0] == ()
  assert rec.openness == {"cupboard": "closed"} and not rec.inventory_complete
  for action, obs in [("open cupboard", "The cupboard is now open."),
                      ("pick up thermometer", "You move the thermometer to the inventory."),
                      ("open door to bathroom", "The door is now open."),
                      ("go to bathroom", "You move to the bathroom.")]:
    rec.turn += 1
    observers.update(rec, action, obs)
  assert rec.openness["cupboard"] == "open" and rec.inventory == ["thermometer"]
  assert "thermometer" not in rec.contents["kitchen"][0]
  assert rec.places["kitchen"].exits["bathroom"] == "open" and rec.location == "bathroom"
  observers.update(rec, "inventory", "In your inventory, you see:\n\tan orange\n\ta thermometer,"
                   " currently reading a temperature of 10 degrees celsius\n")
  assert rec.inventory == ["orange", "thermometer"] and rec.inventory_complete


def test_scienceworld_contradictions():
  rec = Record("scienceworld")
  observers.update(rec, None, SW_KITCHEN)
  c = rec.contradiction
  assert "closed" in c("go to bathroom")
  assert "no door" in c("go to greenhouse")
  assert "already in the kitchen" in c("go to kitchen")
  assert "already open" in c("open door to hallway")
  assert "already closed" in c("close cupboard")
  assert c("go to hallway") is None and c("open cupboard") is None
  assert c("pick up thermometer") is None
  observers.update(rec, "pick up thermometer", "You move the thermometer to the inventory.")
  assert "already in your inventory" in c("pick up thermometer")


def test_parse_check():
  rec = _alfworld_record([])
  assert "matches no command" in observers.parse_check("alfworld", "dance", rec)
  assert "not been observed" in observers.parse_check("alfworld", "go to sofa 1", rec)
  assert observers.parse_check("alfworld", "go to fridge 1", rec) is None
  sw = Record("scienceworld")
  observers.update(sw, None, SW_KITCHEN)
  vocab = frozenset("pick up move to open close".split())
  assert "unicorn" in observers.parse_check("scienceworld", "pick up unicorn", sw, vocab)
  assert observers.parse_check("scienceworld", "pick up red apple", sw, vocab) is None
  assert observers.parse_check("scienceworld", "take thermometer", sw, vocab) is not None


def test_render_context_pure_and_blocks():
  rec = _alfworld_record([])
  turns = [Turn("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
           Turn("take egg 1 from fridge 1", "Nothing happens.", "Rejected: fridge 1 is closed.",
                accepted=False, executed=False, contradiction="fridge 1 is closed"),
           Turn("go to fridge 1", "Nothing happens.", "Loop detected.", stalled=True)]
  full = render_context("put a hot apple in countertop", turns, rec, opening=AW_WELCOME)
  bare = render_context("put a hot apple in countertop", turns, rec, opening=AW_WELCOME,
                        state_tracking=False, action_monitoring=False)
  assert full == render_context("put a hot apple in countertop", turns, rec, opening=AW_WELCOME)
  assert HARNESS_BLOCK.sub("", full) == bare
  assert full.count("<harness_feedback>") == 2 and full.count("<harness_state>") == 1
  assert bare.count("Your task is to") == 1 and "> take egg 1 from fridge 1\nNothing" in bare
  only_state = render_context("g", turns, rec, action_monitoring=False)
  only_monitor = render_context("g", turns, rec, state_tracking=False)
  assert "<harness_feedback>" not in only_state and "<harness_state>" in only_state
  assert "<harness_feedback>" in only_monitor and "<harness_state>" not in only_monitor
  with pytest.raises(ValueError, match="record"):
    render_context("g", turns, None)
  with pytest.raises(ValueError, match=r"turns\[0\]"):
    render_context("g", ["go"], rec)


def test_bad_inputs():
  for kwargs, field in [({"loop_window": 1}, "loop_window"), ({"stall_window": 0}, "stall_window"),
                        ({"state_tracking": 1}, "state_tracking"), ({"max_turns": 0}, "max_turns"),
                        ({"max_suggestions": -1}, "max_suggestions")]:
    with pytest.raises(ValueError, match=field):
      HarnessConfig(**kwargs)
  with pytest.raises(ValueError, match="game"):
    Harness("webshop")
  with pytest.raises(ValueError, match="game"):
    Record("webshop")
  with pytest.raises(ValueError, match="config"):
    Harness("alfworld", {"loop_window": 3})
  with pytest.raises(ValueError, match="action"):
    observers.normalize(None)
  with pytest.raises(ValueError, match="env"):
    HarnessedGame(object())


# ---- real ALFWorld ---------------------------------------------------------------------------


def _true_state(game):
  """ALFWorld's true state from its PDDL facts: contents, opened receptacles, held objects."""
  names = {key: info.name for key, info in game.env._env._entity_infos.items()}
  contents, opened, held = {}, set(), set()
  for fact in game.env._state["_facts"]:
    args = [names.get(v.name, v.name) for v in fact.arguments]
    if fact.name == "inreceptacle":
      contents.setdefault(args[1], set()).add(args[0])
    elif fact.name == "opened":
      opened.add(args[0])
    elif fact.name == "holds":
      held.add(args[1])
  return contents, opened, held


@pytest.fixture(scope="module")
def alfworld_game():
  alfworld = pytest.importorskip("harnax.envs.text.alfworld")
  task = next(t for t in alfworld.tasks("seen") if t.task_type == "pick_heat_then_place_in_recep")
  game = HarnessedGame(alfworld.make(task))
  yield game
  game.close()


@pytest.mark.slow
def test_alfworld_expert_plan_record_and_no_alarm(alfworld_game):
  game = alfworld_game
  obs, info = game.reset()
  assert game.record.places_complete and game.record.location is None
  plan = game.expert_plan()
  assert plan
  for action in plan:
    obs, _, terminated, _, info = game.step(action)
    h = info["harness"]
    assert h["accepted"] and h["executed"] and h["consistent"], (action, h)
    assert not h["stalled"], (action, h["loop_report"])
  assert terminated and info["won"]
  rec = game.record
  contents, opened, held = _true_state(game)
  # ALFWorld changes only by the agent's actions: what was last seen is still true.
  for where, (items, _) in rec.contents.items():
    assert set(items) == contents.get(where, set()), where
  for name, state in rec.openness.items():
    assert (state == "open") == (name in opened), name
  assert set(rec.inventory) == held
  visited = {a.removeprefix("go to ") for a in plan if a.startswith("go to ")}
  assert {p for p, v in rec.places.items() if v.visited} == visited
  assert rec.location == [a for a in plan if a.startswith("go to ")][-1].removeprefix("go to ")


@pytest.mark.slow
def test_alfworld_rejection_leaves_game_unchanged(alfworld_game):
  game = alfworld_game
  obs, info = game.reset()
  game.step(info["admissible"][0])  # "go to <somewhere>"
  where = game.record.location
  before = _true_state(game)
  moves, admissible = game.env._moves, game.harness.admissible
  bad = f"take apple 99 from {where}"
  assert bad not in admissible
  obs, reward, terminated, truncated, info = game.step(bad)
  h = info["harness"]
  assert not h["accepted"] and not h["executed"] and obs == "Nothing happens."
  assert f'Rejected "{bad}"' in h["feedback"] and "Valid actions here include" in h["feedback"]
  assert game.env._moves == moves and _true_state(game) == before
  assert game.harness.admissible == admissible and len(game.turns) == 2
  # A component switched off: the same action reaches the game, the verdict is still computed.
  off = HarnessedGame(game.env, HarnessConfig(action_monitoring=False))
  off.reset()
  off.step(f"go to {where}")
  obs, *_, info = off.step(bad)
  assert obs == "Nothing happens." and info["harness"]["executed"]
  assert not info["harness"]["accepted"] and game.env._moves == 2
  assert "<harness_feedback>" not in off.context() and "<harness_state>" in off.context()


@pytest.mark.slow
def test_alfworld_loop_detection_and_renderings(alfworld_game):
  game = alfworld_game
  game.reset()
  # Two places without doors (ALFWorld's openable receptacle types left out), so arriving
  # there shows their contents.
  openable = ("cabinet", "drawer", "fridge", "microwave", "safe", "box", "laundryhamper")
  a, b = [p for p in sorted(game.record.places) if not p.startswith(openable)][:2]
  stalled = []
  for action in [f"go to {a}", f"go to {b}"] * 3:
    stalled.append(game.step(action)[4]["harness"]["stalled"])
  # Turns 1-4 each go somewhere in a new situation; turn 5 repeats turn 3's transition.
  assert stalled == [False, False, False, False, True, True]
  assert "Loop detected" in game.turns[-1].feedback
  assert "not visited yet" in game.turns[-1].feedback
  # Contradiction: the harness saw `b` (the agent is there now) without apple 99.
  assert "seen without apple 99" in game.record.contradiction(f"take apple 99 from {b}")
  for t in range(len(game.turns) + 1):
    full = game.context_at(t, state_tracking=True, action_monitoring=True)
    bare = game.context_at(t, state_tracking=False, action_monitoring=False)
    assert HARNESS_BLOCK.sub("", full) == bare
    assert "<harness" not in bare
  assert game.context() == game.context_at(len(game.turns))
  # No progress: two invalid actions alternated; a loop window of 2 sees no repeated
  # transition, the stall window of 3 idle turns (the first "Nothing happens." was new) does.
  short = HarnessedGame(game.env, HarnessConfig(stall_window=3, loop_window=2))
  short.reset()
  kinds = [short.step(a)[4]["harness"]["loop"] for a in ["dance", "sing"] * 2]
  assert kinds == [None, None, None, "no_progress"]
  assert "No progress in the last 3 turns" in short.turns[-1].feedback


# ---- real ScienceWorld -----------------------------------------------------------------------


class _ScienceWorld:
  """The real ScienceWorld engine behind the TextGame API (only what the harness needs)."""

  def __init__(self, env, task_name):
    import types
    self.env, self.task = env, types.SimpleNamespace(game="scienceworld", name=task_name)
    env.load(task_name, 0, generateGoldPath=True)

  def reset(self, seed=None, options=None):
    obs, info = self.env.reset()
    return obs, self._info(info)

  def _info(self, info):
    return {"goal": info["taskDesc"], "admissible": tuple(info["valid"]),
            "won": info["score"] >= 100, "score": info["score"] / 100, "moves": info["moves"]}

  def step(self, action):
    obs, _, done, info = self.env.step(action)
    return obs, 0.0, done, False, self._info(info)

  def expert_plan(self):
    return self.env.get_gold_action_sequence()

  def close(self):
    pass


@pytest.fixture(scope="module")
def scienceworld_env():
  scienceworld = pytest.importorskip("scienceworld")
  env = scienceworld.ScienceWorldEnv("", envStepLimit=100)
  yield env
  env.close()


@pytest.mark.slow
def test_scienceworld_expert_plan_and_rejection(scienceworld_env):
  game = HarnessedGame(_ScienceWorld(scienceworld_env, "find-plant"))
  obs, info = game.reset()
  start = game.record.location
  assert start == "hallway" and obs.startswith(f"This room is called the {start}.")
  exits = game.record.places[start].exits
  assert exits and all(state == "closed" for state in exits.values())
  # A closed door: rejected (not executed, the room unchanged), and it contradicts the record.
  obs, *_, info = game.step("go to greenhouse")
  h = info["harness"]
  assert not h["accepted"] and not h["executed"] and "closed" in h["contradiction"]
  assert obs == "No known action matches that input."
  assert scienceworld_env.look().startswith("This room is called the hallway")
  obs, *_, info = game.step("pick up unicorn")
  assert not info["harness"]["accepted"] and "unicorn" in info["harness"]["reason"]
  stalled = []
  for action in game.expert_plan():
    obs, _, terminated, _, info = game.step(action)
    stalled.append(info["harness"]["stalled"])
    if terminated:
      break
  assert info["won"] and not any(stalled)
  rec = game.record
  assert rec.location == "kitchen"
  assert {p for p, v in rec.places.items() if v.visited} == {"hallway", "greenhouse", "kitchen"}
  assert rec.places["hallway"].exits["greenhouse"] == "open"
  assert "flower pot 3" not in rec.contents["greenhouse"][0]  # picked up there
  full, bare = game.context(), game.context(state_tracking=False, action_monitoring=False)
  assert HARNESS_BLOCK.sub("", full) == bare
