"""harnax.studies.had_pairs: a run's kept pairs read against its rollout log, counted by hand."""

import json
import os
import subprocess
import sys

import pytest

from harnax.studies import had_pairs
from harnax.train import rollouts


def _turn(episode, turn, action, reasoning):
  return dict(kind="turn", episode=episode, turn=turn, action=action, reasoning=reasoning)


def _pair(episode, turn, action, positive, negative, differ=True, valid=True, after=False):
  return dict(episode=episode, turn=turn, action=action, positive=positive, negative=negative,
              differ=differ, valid=valid, unparsable=False, reason=None, after_rejection=after)


LOG = [_turn(0, 0, "go to cabinet 1", "Nothing seen. I go to cabinet 1."),
       _turn(1, 0, "go to cabinet 10", "I go to cabinet 10."),
       _turn(0, 1, "open cabinet 1", "It is closed. I open cabinet 1."),
       _turn(1, 1, "take apple 1 from cabinet 10", "I take apple 1 from cabinet 10."),
       _turn(0, 2, "look", "Lost. I look.")]
PAIRS = [
    # a⁺ is the student's action, named.
    _pair(0, 0, "go to cabinet 1", "go to cabinet 1", "look"),
    # "go to cabinet 1" is not named by "cabinet 10", the student's own action is: against.
    _pair(1, 0, "go to cabinet 10", "go to cabinet 1", "go to cabinet 10"),
    # Not active: the teacher's two answers agree.
    _pair(0, 1, "open cabinet 1", "open cabinet 1", "open cabinet 1", differ=False),
    # Not active: a⁺ contradicts the record.
    _pair(1, 1, "take apple 1 from cabinet 10", "take knife 1 from cabinet 10", "look",
          valid=False),
    # After a rejection; a⁺ not named, the student's "look" is: against.
    _pair(0, 2, "look", "go to fridge 1", "inventory", after=True),
]
# After a rejection, a⁺ the student's own action (turn 3 of episode 1).
LOG += [_turn(1, 2, "open drawer 1", "I open drawer 1.")]
PAIRS += [_pair(1, 2, "open drawer 1", "open drawer 1", "go to desk 1", after=True)]


def test_pairs_are_counted_against_the_reasoning():
  c = had_pairs.summarize([{"kind": "run"}] + LOG, PAIRS)
  assert c == had_pairs.PairCounts(states=6, differ=5, active=4, positive_is_action=2,
                                   positive_named=2, against_reasoning=2, after_rejection=2,
                                   after_rejection_is_action=1)
  assert c + c == had_pairs.PairCounts(*(2 * v for v in (6, 5, 4, 2, 2, 2, 2, 1)))
  # A reasoning that paraphrases the student's action names nothing: not counted against.
  put = [_turn(0, 0, "move apple 1 to fridge 1", "I put apple 1 in fridge 1.")]
  c = had_pairs.summarize(put, [_pair(0, 0, "move apple 1 to fridge 1", "go to fridge 1",
                                      "look")])
  assert (c.active, c.positive_named, c.against_reasoning) == (1, 0, 0)


def test_verb_pairs_count_the_active_pairs_by_hand():
  # Active: (go, look), (go, go), (go, inventory), (open, go); the agreeing and the invalid
  # pair are not.
  assert had_pairs.verb_pairs(PAIRS) == {("go", "look"): 1, ("go", "go"): 1,
                                         ("go", "inventory"): 1, ("open", "go"): 1}


def test_a_pair_without_its_turn_is_refused():
  bad = [_pair(0, 1, "look", "look", "open cabinet 1")]    # turn 1 of episode 0 opened
  with pytest.raises(ValueError, match="episode 0 turn 1 has no turn with action 'look'"):
    had_pairs.summarize(LOG, bad)


def test_a_run_is_read_step_by_step(tmp_path):
  logs = tmp_path / "rollouts"
  logs.mkdir()
  for step, pairs in ((0, PAIRS[:2]), (1, PAIRS[2:])):
    (logs / f"step_{step:06d}.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [{"format": rollouts.LOG_FORMAT}] + LOG) + "\n")
    (logs / f"pairs_step_{step:06d}.jsonl").write_text(
        "".join(json.dumps(p) + "\n" for p in pairs))
  counts = had_pairs.run_counts(str(tmp_path))
  assert sorted(counts) == [0, 1]
  assert counts[0].active == 2 and counts[1].active == 2
  assert counts[0] + counts[1] == had_pairs.summarize(LOG, PAIRS)
  assert had_pairs.run_verb_pairs(str(tmp_path)) == had_pairs.verb_pairs(PAIRS)
  with pytest.raises(ValueError, match="kept no pairs"):
    had_pairs.run_counts(str(tmp_path / "elsewhere"))
  with pytest.raises(ValueError, match="kept no pairs"):
    had_pairs.run_verb_pairs(str(tmp_path / "elsewhere"))
  # The script: the pairs table, then the verb pairs over both steps (PAIRS' four active
  # pairs, one row each).
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, os.path.join(root, "scripts", "had_pairs.py"),
                        f"--runs={tmp_path}", "--verbs=5"], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONPATH": root}).stdout
  assert "| a⁺ verb / a⁻ verb | active pairs |" in out
  assert out.count(f"| {tmp_path} | go / ") == 3 and "| open / go | 1/4 (25 %) |" in out
  assert "| 2/4 (50 %) | 1/2 (50 %) |" in out    # after a rejection; of those, a⁺ = action
  # Both steps in one block of 5: that row is the whole run, so no "all" row repeats it; one
  # update per block gives a row per step and the total.
  assert f"| {tmp_path} | 0-4 |" in out and f"| {tmp_path} | all |" not in out
  out = subprocess.run([sys.executable, os.path.join(root, "scripts", "had_pairs.py"),
                        f"--runs={tmp_path}", "--block=1"], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONPATH": root}).stdout
  assert [line.split(" | ")[1] for line in out.splitlines()[2:]] == ["0-0", "1-1", "all"]
