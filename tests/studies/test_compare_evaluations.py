"""Kept evaluations compared task by task (harnax.studies.compare_evaluations) on hand-written
evaluation directories, with the pooled test checked against a brute-force enumeration."""

import itertools
import json
import os

import numpy as np
import pytest

from harnax.studies import compare_evaluations

TASKS = {"seen": [f"s{i}" for i in range(7)], "unseen": [f"u{i}" for i in range(5)]}
# Two task types, interleaved as a study's task lists are not (each split's by-type rows must
# pick their episodes by type, not by position).
TYPES = {name: ("pick" if i % 2 else "heat") for names in TASKS.values()
         for i, name in enumerate(names)}


def _write(directory, wins, *, params="p0", setting="with_harness", tasks=TASKS, window=1,
           swap_first_two=False):
  """An evaluation directory as had_study.evaluations keeps it: key.json and one rollout log
  per split whose episodes are `tasks[split]`, won where `wins[split]` says."""
  os.makedirs(directory, exist_ok=True)
  key = dict(format=1, params=params, vocab_size=50, window=window, max_steps=10,
             max_new_tokens=8, tasks=tasks)
  with open(os.path.join(directory, "key.json"), "w") as f:
    json.dump(key, f)
  for split, names in tasks.items():
    names = list(names)
    if swap_first_two:
      names[:2] = names[1::-1]
    lines = [{"kind": "run", "format": "harnax-text-rollouts/1"}]
    for ep, (name, won) in enumerate(zip(names, wins[split])):
      lines.append({"kind": "reset", "episode": ep,
                    "task": {"ident": name, "task_type": TYPES[name]}})
      lines.append({"kind": "turn", "episode": ep, "won": bool(won),
                    "harness": {"accepted": True, "consistent": True, "stalled": False}})
    with open(os.path.join(directory, f"{setting}-{split}.jsonl"), "w") as f:
      f.write("\n".join(json.dumps(r) for r in lines) + "\n")
  return str(directory)


def _random_wins(rng):
  return {split: rng.random(len(names)) < 0.5 for split, names in TASKS.items()}


def _brute_force_p(diffs):
  """P(|Σ ε_t d_t| >= |Σ d_t|) over every sign pattern of the non-zero d_t."""
  nz = [d for d in diffs if d]
  observed = abs(sum(nz))
  hits = sum(abs(sum(s * d for s, d in zip(signs, nz))) >= observed
             for signs in itertools.product((1, -1), repeat=len(nz)))
  return hits / 2 ** len(nz)


def test_pooled_comparison_matches_a_hand_count_and_brute_force_p(tmp_path):
  rng = np.random.default_rng(3)
  wins_b = [_random_wins(rng) for _ in range(3)]
  wins_a = [_random_wins(rng) for _ in range(3)]
  before = [_write(tmp_path / f"b{k}", w, params=f"b{k}") for k, w in enumerate(wins_b)]
  after = [_write(tmp_path / f"a{k}", w, params=f"a{k}") for k, w in enumerate(wins_a)]
  result = compare_evaluations.compare(before, after)
  for split in TASKS:
    d = sum(wins_a[k][split].astype(int) - wins_b[k][split].astype(int) for k in range(3))
    p = result["splits"][split]["paired"]
    assert (p.ahead, p.behind) == (int(np.sum(d > 0)), int(np.sum(d < 0)))
    assert p.p_value == pytest.approx(_brute_force_p(d.tolist()), abs=1e-12)
    assert result["splits"][split]["after"].successes == sum(int(w[split].sum()) for w in wins_a)
    assert result["splits"][split]["after"].trials == 3 * len(TASKS[split])
  assert result["same_weights"] == []
  table = compare_evaluations.render(result, before="student", after="HAD")
  assert "| split | student | HAD |" in table and table.count("\n") == 4
  # By task type: the same count on each type's tasks alone.
  for split, names in TASKS.items():
    assert set(result["types"][split]) == {"pick", "heat"}
    for kind in ("pick", "heat"):
      rows = [i for i, n in enumerate(names) if TYPES[n] == kind]
      d = sum(wins_a[k][split][rows].astype(int) - wins_b[k][split][rows].astype(int)
              for k in range(3))
      p = result["types"][split][kind]["paired"]
      assert (p.ahead, p.behind) == (int(np.sum(d > 0)), int(np.sum(d < 0)))
      assert p.p_value == pytest.approx(_brute_force_p(d.tolist()), abs=1e-12)
      assert result["types"][split][kind]["before"].successes == sum(
          int(w[split][rows].sum()) for w in wins_b)
  by_type = compare_evaluations.render(result, by_type=True)
  assert "| seen: pick |" in by_type and by_type.count("\n") == 4 + 4


def test_a_directory_repeated_on_one_side_counts_once_in_its_success(tmp_path):
  rng = np.random.default_rng(0)
  wins_student = _random_wins(rng)
  student = _write(tmp_path / "student", wins_student, params="s")
  runs = [_write(tmp_path / f"run{k}", _random_wins(rng), params=f"r{k}") for k in range(2)]
  result = compare_evaluations.compare([student, student], runs)
  for split in TASKS:
    assert result["splits"][split]["before"].trials == len(TASKS[split])
    assert result["splits"][split]["before"].successes == int(wins_student[split].sum())
    assert result["splits"][split]["paired"].seeds == 2


def test_two_names_for_one_model_are_reported_and_tie(tmp_path):
  wins = _random_wins(np.random.default_rng(1))
  a = _write(tmp_path / "opd", wins, params="same")
  b = _write(tmp_path / "no_preference", wins, params="same")
  result = compare_evaluations.compare([a], [b])
  assert result["same_weights"] == [0]
  for split in TASKS:
    assert result["splits"][split]["paired"].ahead == result["splits"][split]["paired"].behind == 0
  assert "same weights" in compare_evaluations.render(result)


@pytest.mark.parametrize("change, field", [
    (dict(tasks={"seen": TASKS["seen"][::-1], "unseen": TASKS["unseen"]}), "tasks"),
    (dict(window=2), "window"),
])
def test_evaluations_of_other_tasks_or_decoding_are_refused(tmp_path, change, field):
  wins = _random_wins(np.random.default_rng(2))
  if "tasks" in change:
    wins = {split: wins[split] for split in TASKS}
  a = _write(tmp_path / "a", wins)
  b = _write(tmp_path / "b", wins, **change)
  with pytest.raises(ValueError, match=f"^{field}: "):
    compare_evaluations.compare([a], [b])


def test_bad_directories_get_a_clear_error(tmp_path):
  wins = _random_wins(np.random.default_rng(4))
  good = _write(tmp_path / "good", wins)
  os.makedirs(tmp_path / "empty")
  with pytest.raises(ValueError, match="a key.json"):
    compare_evaluations.compare([good], [str(tmp_path / "empty")])
  with pytest.raises(ValueError, match="setting: .*'harness_removed'"):
    compare_evaluations.compare([good], [good], setting="harness_removed")
  # A log whose episodes are not the key's tasks in the key's order (a log from another key).
  shuffled = _write(tmp_path / "shuffled", wins, swap_first_two=True)
  with pytest.raises(ValueError, match="expected the 7 tasks of key.json"):
    compare_evaluations.compare([good], [shuffled])
  with pytest.raises(ValueError, match="^after: expected 2"):
    compare_evaluations.compare([good, good], [good])
  with pytest.raises(ValueError, match="^before: expected at least one"):
    compare_evaluations.compare([], [])


def test_the_script_prints_the_table(tmp_path):
  import subprocess
  import sys

  rng = np.random.default_rng(5)
  a = _write(tmp_path / "a", _random_wins(rng), params="a")
  b = _write(tmp_path / "b", _random_wins(rng), params="b")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(
      [sys.executable, os.path.join(root, "scripts", "compare_evaluations.py"), f"--before={a}",
       f"--after={b}", "--labels=student,HAD"], capture_output=True, text=True, check=True,
      env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"}).stdout
  expected = compare_evaluations.render(compare_evaluations.compare([a], [b]), before="student",
                                        after="HAD")
  assert out == expected
