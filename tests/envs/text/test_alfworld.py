"""ALFWorld on TextWorld's PDDL engine: generated problems, the split, game files, errors.

References are independent of the code under test: ALFWorld's own constants (scene split,
receptacle/object compatibility), ALFWorld's own demangler, and TextWorld's PDDL engine driven
directly; wins are the engine's goal check.
"""

import json
import random
import re

import pytest

alfworld = pytest.importorskip("harnax.envs.text.alfworld")
pytest.importorskip("alfworld")
pytest.importorskip("textworld")
pytest.importorskip("fast_downward")

from alfworld.gen import constants  # noqa: E402

from harnax.envs.text.base import INFO_KEYS  # noqa: E402
from harnax.envs.text.base import GameLoadError  # noqa: E402
from harnax.envs.text.base import GameTask  # noqa: E402
from harnax.envs.text.base import TextGame  # noqa: E402

SMALL = 3  # distractor classes in the tests' games: loads stay short, every mechanism is kept


def _task(task_type, split, i=0):
  return alfworld.tasks(split, per_type=i + 1, task_types=(task_type,), distractors=SMALL)[i]


@pytest.fixture(scope="module")
def games():
  """One seen and one unseen game per task type, built on first use."""
  cache = {}

  def get(task_type, split):
    if (task_type, split) not in cache:
      cache[task_type, split] = alfworld.make(_task(task_type, split))
    return cache[task_type, split]

  yield get
  for game in cache.values():
    game.close()


# ----------------------------------------------------------------------------- no engine


def test_split_is_alfworlds_scene_split_and_disjoint():
  seen = {int(fp.removeprefix("FloorPlan")) for fp in alfworld.SEEN_FLOORPLANS}
  unseen = {int(fp.removeprefix("FloorPlan")) for fp in alfworld.UNSEEN_FLOORPLANS}
  assert seen == set(constants.TRAIN_SCENE_NUMBERS)
  assert unseen == set(constants.TEST_SCENE_NUMBERS)
  assert not seen & unseen
  for split, plans in (("seen", seen), ("unseen", unseen)):
    used = {int(t.params[0].removeprefix("FloorPlan")) for t in alfworld.tasks(split, per_type=4)}
    assert used <= plans


def test_tasks_are_deterministic_and_cover_every_type():
  a = alfworld.tasks("seen", per_type=3)
  assert a == alfworld.tasks("seen", per_type=3)
  assert a != alfworld.tasks("seen", per_type=3, seed=1)
  assert [t.task_type for t in a] == [tt for tt in alfworld.TASK_TYPES for _ in range(3)]
  assert len({t.ident for t in a}) == len(a)
  assert all(t.game == "alfworld" and t.split == "seen" for t in a)
  first = a[0]  # a kitchen first: the instances cycle through the room types
  assert first.task_type == "pick_and_place_simple"
  assert int(first.params[0].removeprefix("FloorPlan")) in constants.SCENE_TYPE["Kitchen"]


def test_tasks_from_chosen_room_types():
  baths = alfworld.tasks("seen", per_type=3, task_types=("pick_and_place_simple",),
                         rooms=("bathroom",))
  assert all(int(t.params[0].removeprefix("FloorPlan")) in constants.SCENE_TYPE["Bathroom"]
             for t in baths)
  assert len({t.params for t in baths}) == 3
  # Every room type listed is the default: the same instances as before the option existed.
  assert alfworld.tasks("seen", per_type=2, rooms=tuple(alfworld.ROOM_TYPES)) == alfworld.tasks(
      "seen", per_type=2)
  with pytest.raises(ValueError, match="rooms"):
    alfworld.tasks("seen", rooms=("garage",))
  with pytest.raises(ValueError, match="rooms.*hosts"):  # no microwave, no heating in a bathroom
    alfworld.tasks("seen", task_types=("pick_heat_then_place_in_recep",), rooms=("bathroom",))


def test_generated_problems_are_deterministic_per_seed():
  p = alfworld.generate("FloorPlan12", "pick_cool_then_place_in_recep", 5)
  assert p == alfworld.generate("FloorPlan12", "pick_cool_then_place_in_recep", 5)
  assert p.pddl_problem != alfworld.generate("FloorPlan12", "pick_cool_then_place_in_recep",
                                             6).pddl_problem


def _facts(text, predicate):
  return re.findall(rf"\({predicate} (\S+) (\S+)\)", text)


@pytest.mark.parametrize("task_type", alfworld.TASK_TYPES)
def test_placements_follow_alfworlds_tables_and_goal_is_open(task_type):
  for task in alfworld.tasks("unseen", per_type=2, task_types=(task_type,), distractors=None):
    p = alfworld.problem(task)
    text = p.pddl_problem
    assert text.index("(:objects") < text.index("(:init") < text.index("(:goal")
    assert ":metric" not in text and "#" not in text
    text = text[:text.index("(:goal")]  # the initial state
    otype = dict(_facts(text, "objectType"))
    rtype = dict(_facts(text, "receptacleType"))
    contain = set(_facts(text, "canContain"))
    targets = dict(p.targets)
    for o, r in _facts(text, "inReceptacle"):
      ocls, rcls = otype[o].removesuffix("Type"), rtype[r].removesuffix("Type")
      if ocls == "DeskLamp":
        continue
      assert ocls in constants.VAL_RECEPTACLE_OBJECTS[rcls]
      assert (rtype[r], otype[o]) in contain
      # The goal's object never starts in a receptacle of the goal's class.
      assert not (ocls == targets["obj"] and rcls == targets.get("recep"))
    n_target = sum(1 for c in otype.values() if c == targets["obj"] + "Type")
    assert n_target >= (2 if task_type == "pick_two_obj_and_place" else 1)
    if "toggle" in targets:
      assert targets["toggle"] + "Type" in otype.values()
    assert targets["obj"].lower() in p.goal


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="split"):
    alfworld.tasks("test")
  with pytest.raises(ValueError, match="task_types"):
    alfworld.tasks("seen", task_types=("pick_and_fly",))
  with pytest.raises(ValueError, match="per_type"):
    alfworld.tasks("seen", per_type=0)
  with pytest.raises(ValueError, match="distractors"):
    alfworld.tasks("seen", distractors=-1)
  with pytest.raises(alfworld.ProblemError, match="task_type"):
    alfworld.generate("FloorPlan1", "pick_and_fly", 0)
  with pytest.raises(alfworld.ProblemError, match="floorplan"):
    alfworld.generate("FloorPlan99", "pick_and_place_simple", 0)
  # No microwave in a bathroom.
  with pytest.raises(alfworld.ProblemError, match="cannot be played"):
    alfworld.generate("FloorPlan401", "pick_heat_then_place_in_recep", 0)
  with pytest.raises(ValueError, match="task"):
    alfworld.make(GameTask("scienceworld", "boil", "seen", "x", ()))
  with pytest.raises(ValueError, match="params"):
    alfworld.make(GameTask("alfworld", "pick_and_place_simple", "seen", "x", ("FloorPlan1",)))


def test_demangle_matches_alfworlds_demangler():
  misc = pytest.importorskip("alfworld.agents.utils.misc")
  text = alfworld.generate("FloorPlan3", "pick_clean_then_place_in_recep", 1).pddl_problem
  ids = [i.lower() for i in re.findall(r"^\s*(\S+_bar_\S+) - (?:object|receptacle)$", text,
                                       re.M)]

  class Info:
    def __init__(self, i):
      self.id = i

  ref = misc.Demangler(game_infos={i: Info(i) for i in ids})
  names = alfworld.demangle(ids)
  assert {i: ref.demangle_alfred_name(i) for i in ids} == names
  assert any(n.startswith("sinkbasin ") for n in names.values())


# ----------------------------------------------------------------------------- engine


@pytest.mark.slow
@pytest.mark.parametrize("split", ["seen", "unseen"])
@pytest.mark.parametrize("task_type", alfworld.TASK_TYPES)
def test_expert_plan_wins_with_admissible_actions(games, task_type, split):
  game = games(task_type, split)
  assert isinstance(game, TextGame)
  obs, info = game.reset()
  assert set(INFO_KEYS) <= set(info)
  assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
  assert "You are in the middle of a room. Looking quickly around you, you see" in obs
  assert obs.rstrip().endswith(f"Your task is to: {info['goal']}.")
  assert not info["won"] and info["score"] == 0.0 and info["moves"] == 0
  plan = game.expert_plan()
  assert plan
  total = 0.0
  for k, action in enumerate(plan):
    assert action in info["admissible"], (k, action, info["admissible"])
    obs, reward, terminated, truncated, info = game.step(action)
    total += reward
    assert terminated == (k == len(plan) - 1) and not truncated
    assert info["moves"] == k + 1
  assert info["won"] and info["score"] == 1.0 and total == 1.0
  assert game.expert_plan() == []
  with pytest.raises(RuntimeError, match="over"):
    game.step("look")


@pytest.mark.slow
def test_transcript_matches_textworld_with_alfworlds_demangler(games):
  textworld = pytest.importorskip("textworld")
  misc = pytest.importorskip("alfworld.agents.utils.misc")
  from textworld.envs.pddl import PddlEnv

  task = _task("pick_heat_then_place_in_recep", "seen")
  game = games("pick_heat_then_place_in_recep", "seen")
  ref = PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True))
  ref.load(alfworld.problem(task).game_data())
  demangler = misc.Demangler(game_infos=ref._entity_infos)
  for info in ref._entity_infos.values():
    info.name = demangler.demangle_alfred_name(info.id)
  state = ref.reset()
  obs, info = game.reset()
  assert obs == state.feedback and info["admissible"] == tuple(state["admissible_commands"])
  for action in ["look", "examine " + info["admissible"][0][6:], "inventory", "dance"] + \
      game.expert_plan():
    state, _, _ = ref.step(action)
    obs, _, _, _, info = game.step(action)
    assert obs == state.feedback
    assert info["admissible"] == tuple(state["admissible_commands"])
    assert info["won"] == state["won"]
  assert info["won"]


@pytest.mark.slow
def test_random_agent_rarely_wins(games):
  rng = random.Random(0)
  wins = 0
  episodes = 0
  for task_type in ("pick_and_place_simple", "pick_two_obj_and_place"):
    game = games(task_type, "unseen")
    game.max_steps = 25
    for _ in range(2):
      obs, info = game.reset()
      done = False
      while not done:
        obs, _, terminated, truncated, info = game.step(rng.choice(info["admissible"]))
        done = terminated or truncated
      wins += info["won"]
      episodes += 1
    game.max_steps = 50
  # The expert wins every one of these games (test above); a random agent almost never does.
  assert wins <= 1, f"random agent won {wins}/{episodes}"


@pytest.mark.slow
def test_admissible_off_and_truncation(games):
  task = _task("look_at_obj_in_light", "seen")
  game = alfworld.make(task, admissible=False, max_steps=2)
  try:
    obs, info = game.reset()
    assert info["admissible"] is None
    assert obs == games("look_at_obj_in_light", "seen").reset()[0]
    _, r, term, trunc, info = game.step("look")
    assert (r, term, trunc) == (0.0, False, False)
    _, r, term, trunc, info = game.step("inventory")
    assert (r, term, trunc) == (0.0, False, True) and info["moves"] == 2
    game.reset()  # a new episode after truncation
    assert game.step("look")[3] is False
  finally:
    game.close()
  with pytest.raises(RuntimeError, match="closed|reset"):
    game.step("look")


@pytest.mark.slow
def test_game_file_roundtrip(tmp_path, games):
  task = _task("pick_two_obj_and_place", "unseen")
  # The dataset's layout: <task_type>-<obj>-<mrecep>-<recep>-<scene>/<trial>/game.tw-pddl.
  path = tmp_path / "pick_two_obj_and_place-X-None-Y-1" / "trial_T0" / "game.tw-pddl"
  alfworld.write_game_file(task, path)
  data = json.loads(path.read_text())
  assert {"pddl_domain", "grammar", "pddl_problem"} <= set(data)
  assert "UNKNOWN GOAL" not in data["grammar"]
  game = alfworld.load_game_file(path, split="unseen")
  try:
    assert game.task.task_type == "pick_two_obj_and_place"
    assert game.task.params == ("file", str(path))
    obs, info = game.reset()
    obs_ref, info_ref = games("pick_two_obj_and_place", "unseen").reset()
    assert obs == obs_ref and info["goal"] == info_ref["goal"]
    for action in game.expert_plan():
      obs, _, terminated, _, info = game.step(action)
    assert terminated and info["won"]
  finally:
    game.close()
  # make() replays a file task too.
  again = alfworld.make(game.task)
  assert again.reset()[0] == obs_ref
  again.close()


@pytest.mark.slow
def test_bad_game_files_raise_game_load_error(tmp_path):
  bad = tmp_path / "corrupt.tw-pddl"
  bad.write_text("{not json")
  with pytest.raises(GameLoadError, match="JSON"):
    alfworld.load_game_file(bad)
  with pytest.raises(GameLoadError, match="cannot read"):
    alfworld.load_game_file(tmp_path / "missing.tw-pddl")
  data = alfworld.generate("FloorPlan401", "pick_and_place_simple", 0).game_data()
  partial = tmp_path / "partial.tw-pddl"
  partial.write_text(json.dumps({k: v for k, v in data.items() if k != "grammar"}))
  with pytest.raises(GameLoadError, match="grammar"):
    alfworld.load_game_file(partial)
  # Still "UNKNOWN GOAL": the task sentence must be given.
  unknown = tmp_path / "unknown.tw-pddl"
  unknown.write_text(json.dumps({**data, "grammar": alfworld.problems.grammar_text(
    "UNKNOWN GOAL")}))
  with pytest.raises(GameLoadError, match="UNKNOWN GOAL"):
    alfworld.load_game_file(unknown)
  # Unsolvable: the goal asks for a receptacle class this bathroom does not have.
  goal_part = data["pddl_problem"][data["pddl_problem"].index("(:goal"):]
  recep = re.search(r"\(receptacleType \?r (\w+)\)", goal_part).group(1)
  unsolvable = tmp_path / "unsolvable.tw-pddl"
  text = data["pddl_problem"].replace(f"(receptacleType ?r {recep})",
                                      "(receptacleType ?r FridgeType)")
  unsolvable.write_text(json.dumps({**data, "pddl_problem": text}))
  with pytest.raises(GameLoadError, match="unsolvable"):
    alfworld.load_game_file(unsolvable)
  # The engine rejects a broken problem.
  broken = tmp_path / "broken.tw-pddl"
  broken.write_text(json.dumps({**data, "pddl_problem": data["pddl_problem"].replace(
    "(:init", "(:init (", 1)}))
  with pytest.raises(GameLoadError, match="engine rejected"):
    alfworld.load_game_file(broken)


@pytest.mark.slow
def test_expert_plan_is_as_short_as_textworlds_own_plan():
  textworld = pytest.importorskip("textworld")
  from textworld.envs.pddl import PddlEnv

  # A bathroom (few openable receptacles): TextWorld's planner on the whole room stays quick.
  task = _task("pick_clean_then_place_in_recep", "unseen", 1)
  assert int(task.params[0].removeprefix("FloorPlan")) in constants.SCENE_TYPE["Bathroom"]
  ref = PddlEnv(textworld.EnvInfos(policy_commands=True, won=True))
  ref.load(alfworld.problem(task).game_data())
  reference = ref.reset()["policy_commands"]
  game = alfworld.make(task)
  try:
    game.reset()
    plan = game.expert_plan()
    assert reference and len(plan) == len(reference)
  finally:
    game.close()
