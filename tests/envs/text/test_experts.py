"""The record-based walkthrough expert (harnax.envs.text.experts) on real ALFWorld games."""

import pytest

from harnax.envs.text import HarnessConfig
from harnax.envs.text import HarnessedGame
from harnax.envs.text import experts
from harnax.envs.text import render_context
from harnax.envs.text.harness import Turn
from harnax.envs.text.record import Record


@pytest.mark.parametrize("sentence,expected", [
    ("put a clean egg in microwave", ("egg", "microwave", "clean", 1, None)),
    ("clean some egg and put it in microwave", ("egg", "microwave", "clean", 1, None)),
    ("put a hot apple in countertop.", ("apple", "countertop", "heat", 1, None)),
    ("heat some apple and put it in countertop", ("apple", "countertop", "heat", 1, None)),
    ("put a cool tomato in sinkbasin", ("tomato", "sinkbasin", "cool", 1, None)),
    ("cool some tomato and put it in sinkbasin", ("tomato", "sinkbasin", "cool", 1, None)),
    ("put two pillow in sofa", ("pillow", "sofa", None, 2, None)),
    ("find two pillow and put them in sofa", ("pillow", "sofa", None, 2, None)),
    ("look at cd under the desklamp", ("cd", None, None, 1, "desklamp")),
    ("examine the cd with the desklamp", ("cd", None, None, 1, "desklamp")),
    ("put a creditcard in drawer", ("creditcard", "drawer", None, 1, None)),
    ("Your task is to: put some creditcard on drawer.", ("creditcard", "drawer", None, 1, None)),
])
def test_goal_templates(sentence, expected):
  g = experts.parse_alfworld_goal(sentence)
  assert (g.obj, g.recep, g.change, g.count, g.lamp) == expected


def test_bad_goal_and_record():
  with pytest.raises(ValueError, match="goal"):
    experts.parse_alfworld_goal("make me a sandwich")
  with pytest.raises(ValueError, match="record"):
    experts.alfworld_step("put a apple in fridge", Record("scienceworld"), None)


def test_window_shows_only_recent_turns():
  turns = [Turn(f"go to shelf {i}", f"You arrive at shelf {i}.") for i in range(1, 6)]
  full = render_context("g", turns, None, state_tracking=False)
  last2 = render_context("g", turns, None, state_tracking=False, window=2)
  assert "shelf 3" in full and "shelf 3" not in last2 and "shelf 5" in last2
  assert render_context("g", turns, None, state_tracking=False, window=0) == "Your task is to: g\n"
  with pytest.raises(ValueError, match="window"):
    render_context("g", turns, None, state_tracking=False, window=-1)


@pytest.mark.slow
def test_expert_wins_from_observations_only():
  # One task of each type: the expert reads only the goal, the harness record and the
  # admissible commands, never the game's hidden state, and must win most of them without a
  # single rejected or record-contradicting action.
  from harnax.envs.text import alfworld

  wins, lengths = 0, []
  tasks = alfworld.tasks("seen", per_type=1)
  for task in tasks:
    game = HarnessedGame(alfworld.make(task, max_steps=50), HarnessConfig())
    _, info = game.reset()
    goal = experts.parse_alfworld_goal(info["goal"])
    for _ in range(50):
      step = experts.alfworld_step(goal, game.record, info["admissible"])
      assert step.action in info["admissible"], (task.ident, step.action)
      _, _, term, trunc, info = game.step(step.action)
      assert info["harness"]["accepted"] and info["harness"]["consistent"], task.ident
      if term or trunc:
        break
    wins += bool(info["won"])
    lengths.append(len(game.turns))
    game.close()
  assert wins >= len(tasks) - 1, (wins, lengths)


@pytest.mark.slow
def test_expert_puts_down_what_the_task_does_not_need():
  from harnax.envs.text import alfworld

  task = alfworld.tasks("seen", per_type=1, task_types=("pick_and_place_simple",))[0]
  game = HarnessedGame(alfworld.make(task, max_steps=50), HarnessConfig())
  _, info = game.reset()
  goal = experts.parse_alfworld_goal(info["goal"])
  # Walk the places until one holds an object of another class, and take it (a detour).
  taken = None
  for place in sorted(game.record.places):
    _, _, _, _, info = game.step(f"go to {place}")
    if f"open {place}" in info["admissible"]:
      _, _, _, _, info = game.step(f"open {place}")
    other = next((c for c in info["admissible"] if c.startswith("take ")
                  and experts.name_class(c.split(" from ")[0][5:]) != goal.obj), None)
    if other:
      _, _, _, _, info = game.step(other)
      taken = other.split(" from ")[0][5:]
      break
  assert taken is not None and taken in game.record.inventory
  step = experts.alfworld_step(goal, game.record, info["admissible"])
  assert step.action in info["admissible"] and step.action.startswith(f"move {taken} to ")
  game.close()
