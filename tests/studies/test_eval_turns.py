"""The turn readings of kept evaluations (harnax.studies.eval_turns) on hand-written logs, each
count worked out by hand in the comments."""

import json
import os
import subprocess
import sys

import pytest

from harnax.studies import eval_turns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _episode(ep, task_type, goal, turns, won):
  """Records of one episode: `turns` is a list of (reasoning, action, observation)."""
  recs = [{"kind": "reset", "episode": ep, "goal": goal,
           "task": {"ident": f"t{ep}", "task_type": task_type}}]
  for i, (reasoning, action, obs) in enumerate(turns):
    recs.append({"kind": "turn", "episode": ep, "turn": i, "reasoning": reasoning,
                 "action": action, "observation": obs})
  recs.append({"kind": "episode", "episode": ep, "won": won})
  return recs


RECORDS = (
    [{"kind": "run", "format": "harnax-text-rollouts/1"}]
    # Heated, then first move to the goal's receptacle: transformed, to_goal, won.
    + _episode(0, "pick_heat_then_place_in_recep", "put a hot bread in garbagecan", [
        ("I take bread 1.", "take bread 1 from countertop 1", "You pick up the bread 1."),
        ("I heat it.", "heat bread 1 with microwave 1",
         "You heat the bread 1 using the microwave 1."),
        ("I put bread 1 in garbagecan 1.", "move bread 1 to garbagecan 1", "You move it."),
    ], True)
    # Cooled, then a malformed "move ... in ..." (not a move to anything), then the fridge:
    # elsewhere. The reasoning of the last turn names "go to fridge 1", not the action.
    + _episode(1, "pick_cool_then_place_in_recep", "put a cool egg in sidetable", [
        ("I cool egg 1.", "cool egg 1 with fridge 1", "You cool the egg 1 using the fridge 1."),
        ("I put egg 1.", "move egg 1 in sidetable 1", "Nothing happens."),
        ("I go to fridge 1.", "move egg 1 to fridge 1", "You move the egg 1 to the fridge 1."),
    ], False)
    # Cleaned, then never moved: no_move. A parse failure (no action) is not a turn counted.
    + _episode(2, "pick_clean_then_place_in_recep", "clean some cloth and put it in bathtubbasin", [
        ("I clean cloth 1 with sinkbasin 1.", "clean cloth 1 with sinkbasin 1",
         "You clean the cloth 1 using the sinkbasin 1."),
        ("", None, None),
    ], False)
    # Heat task never heated (the word appears only inside another observation): counted, not
    # transformed.
    + _episode(3, "pick_heat_then_place_in_recep", "heat some mug and put it in cabinet", [
        ("go to cabinet 10", "go to cabinet 1", "On the cabinet 1: You heat nothing."),
    ], False)
    # Not a heat/clean/cool task: skipped by the progress count, read by the mismatch count.
    + _episode(4, "pick_and_place_simple", "put some book on dresser", [
        ("Action: go to desk 1", "go to desk 1", "You arrive at desk 1."),
    ], True)
)


def test_reasoning_mismatch_counts_turns_whose_reasoning_does_not_name_the_action():
  # Turns with an action: 3 + 3 + 1 + 1 + 1 = 9 (the parse failure has none). Named: "clean
  # cloth 1 with sinkbasin 1" and "go to desk 1". Not named: the three of episode 0 (its
  # reasoning paraphrases: "I take bread 1.", "I heat it.", "I put bread 1 in garbagecan 1."),
  # the three of episode 1, and "go to cabinet 1" ("go to cabinet 10" is another object): 7.
  assert eval_turns.reasoning_mismatch(RECORDS) == (7, 9)


def test_transformation_progress_by_hand():
  p = eval_turns.transformation_progress(RECORDS)
  assert p == eval_turns.Progress(episodes=4, transformed=3, won=1, to_goal=1, elsewhere=1,
                                  no_move=1)
  assert p + p == eval_turns.Progress(8, 6, 2, 2, 2, 2)


def test_transformation_progress_refuses_an_episode_cut_mid_write():
  cut = [r for r in RECORDS if not (r.get("kind") == "episode" and r["episode"] == 2)]
  with pytest.raises(ValueError, match="episode 2 needs a 'reset' and an 'episode'"):
    eval_turns.transformation_progress(cut)


# Stages before the transformation, worked out by hand below.
STAGE_RECORDS = (
    [{"kind": "run", "format": "harnax-text-rollouts/1"}]
    # Seen at turn 0, taken at turn 1 (2 turns), carried to the microwave, heated, won.
    + _episode(0, "pick_heat_then_place_in_recep", "heat some apple and put it in countertop", [
        ("", "go to fridge 1", "You arrive at fridge 1. In it, you see a apple 2."),
        ("", "take apple 2 from fridge 1", "You pick up the apple 2 from the fridge 1."),
        ("", "go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
        ("", "heat apple 2 with microwave 1", "You heat the apple 2 using the microwave 1."),
    ], True)
    # A cool task: at the fridge before taking (not carried), seen and taken at turn 2 (3
    # turns), then to the countertop, never to the fridge again: seen, taken, not carried.
    + _episode(1, "pick_cool_then_place_in_recep", "put a cool tomato in microwave", [
        ("", "go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("", "go to microwave 1", "You arrive at microwave 1. On it, you see a tomato 1."),
        ("", "take tomato 1 from microwave 1", "You pick up the tomato 1 from the microwave 1."),
        ("", "go to countertop 1", "You arrive at countertop 1."),
    ], False)
    # "knife": only a butterknife is shown and taken, so neither seen nor taken.
    + _episode(2, "pick_clean_then_place_in_recep", "clean some knife and put it in drawer", [
        ("", "go to countertop 1", "You arrive at countertop 1. You see a butterknife 1."),
        ("", "take butterknife 1 from countertop 1",
         "You pick up the butterknife 1 from the countertop 1."),
        ("", "go to sinkbasin 1", "You arrive at sinkbasin 1."),
    ], False)
    # Taken from the fridge itself in a cool task (2 turns): carried without arriving again.
    + _episode(4, "pick_cool_then_place_in_recep", "cool some lettuce and put it in countertop", [
        ("", "go to fridge 1", "You arrive at fridge 1. In it, you see a lettuce 1."),
        ("", "take lettuce 1 from fridge 1", "You pick up the lettuce 1 from the fridge 1."),
    ], False)
    # Not a heat/clean/cool task: skipped.
    + _episode(3, "pick_and_place_simple", "put some book on dresser", [
        ("", "go to desk 1", "You arrive at desk 1. On it, you see a book 1."),
    ], True)
)


def test_transformation_stages_by_hand():
  st = eval_turns.transformation_stages(STAGE_RECORDS)
  assert st == eval_turns.Stages(episodes=4, seen=3, taken=3, carried=2, transformed=1, won=1,
                                 take_turns=2 + 3 + 2)
  # On the first log: seen in episodes 0, 1, 2 ("bread 1", "egg 1", "cloth 1" in the
  # transformation's own observation), taken in episode 0 only, at its first turn.
  assert eval_turns.transformation_stages(RECORDS) == eval_turns.Stages(4, 3, 1, 0, 3, 1, 1)


def test_transformation_stages_refuse_a_goal_phrased_otherwise():
  odd = _episode(0, "pick_heat_then_place_in_recep", "warm some egg and put it in fridge",
                 [("", "go to fridge 1", "You arrive at fridge 1.")], False)
  with pytest.raises(ValueError, match="^goal: expected 'heat some X .*'warm some egg"):
    eval_turns.transformation_stages(odd)


def _write(directory, splits=("seen", "unseen")):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "key.json"), "w") as f:
    json.dump({"tasks": {s: [f"t{i}" for i in range(5)] for s in splits}}, f)
  for split in splits:
    with open(os.path.join(directory, f"with_harness-{split}.jsonl"), "w") as f:
      f.write("\n".join(json.dumps(r) for r in RECORDS) + "\n")


def test_script_refuses_a_directory_that_is_not_a_kept_evaluation(tmp_path):
  proc = subprocess.run([sys.executable, "scripts/eval_turns.py", f"--evals={tmp_path}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode != 0
  assert "directory: expected an evaluation kept by had_study.evaluations" in proc.stderr


def test_script_pools_directories(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  _write(a)
  _write(b)
  proc = subprocess.run([sys.executable, "scripts/eval_turns.py", f"--evals={a},{b}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Two directories of the same log: every count doubles.
  assert "| seen | 14/18 (77.8 %) | 8 | 6 | 2 | 2 | 2 | 2 |" in proc.stdout
  assert "| unseen | 14/18 (77.8 %) | 8 | 6 | 2 | 2 | 2 | 2 |" in proc.stdout
  # Stages: 8 episodes, seen 6, taken 2 (one turn each), carried 0, transformed 6, won 2.
  assert "| seen | 8 | 6 | 2 | 0 | 6 | 2 | 1.0 |" in proc.stdout
