"""Evaluation summaries (harnax.studies.eval_summary): a hand-written kept evaluation with
multi-turn episodes, summarized and read back, gives the same traces, the same harness counts
and the same task-level comparison as the directory; bad files are refused by field."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from harnax.studies import compare_evaluations
from harnax.studies import eval_summary
from harnax.studies import text_metrics

TASKS = {"seen": ["s0", "s1", "s2", "s3"], "unseen": ["u0", "u1", "u2"]}
TYPES = {"s0": "heat", "s1": "pick", "s2": "heat", "s3": "cool", "u0": "pick", "u1": "clean",
         "u2": "heat"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _episodes(rng, names):
  """Per task: (won, accepted, consistent, stalled) of 1-6 turns, drawn at random."""
  out = []
  for _ in names:
    n = int(rng.integers(1, 7))
    out.append((bool(rng.random() < 0.5),) + tuple(rng.random(n) < 0.5 for _ in range(3)))
  return out


def _write(directory, rng, *, params="p", setting="with_harness", log_splits=None):
  """A kept evaluation (key.json and one rollout log per split) with random multi-turn
  episodes; returns (directory, {split: episodes as drawn})."""
  os.makedirs(directory, exist_ok=True)
  key = dict(format=1, params=params, vocab_size=50, window=1, max_steps=10, max_new_tokens=8,
             tasks=TASKS)
  with open(os.path.join(directory, "key.json"), "w") as f:
    json.dump(key, f)
  drawn = {}
  for split in log_splits or TASKS:
    names = TASKS[split]
    drawn[split] = _episodes(rng, names)
    lines = [{"kind": "run", "format": "harnax-text-rollouts/1"}]
    for ep, (name, (won, acc, con, stall)) in enumerate(zip(names, drawn[split])):
      lines.append({"kind": "reset", "episode": ep,
                    "task": {"ident": name, "task_type": TYPES[name]}})
      for t in range(len(acc)):
        lines.append({"kind": "turn", "episode": ep, "won": won and t == len(acc) - 1,
                      "harness": {"accepted": bool(acc[t]), "consistent": bool(con[t]),
                                  "stalled": bool(stall[t])}})
    with open(os.path.join(directory, f"{setting}-{split}.jsonl"), "w") as f:
      f.write("\n".join(json.dumps(r) for r in lines) + "\n")
  return str(directory), drawn


def _summary_file(directory, path):
  key, traces, types = compare_evaluations.read(directory)
  eval_summary.write(eval_summary.summarize(key, traces, types), str(path))
  return str(path)


def test_a_summary_reads_back_as_the_directory_it_summarizes(tmp_path):
  directory, drawn = _write(tmp_path / "eval", np.random.default_rng(0))
  path = _summary_file(directory, tmp_path / "had-seed0.json")
  key, traces, types = eval_summary.load(path)
  assert key["params"] == "p" and key["tasks"] == TASKS
  for split, names in TASKS.items():
    assert types[split] == [TYPES[n] for n in names]
    for t, (won, acc, con, stall) in zip(traces[split], drawn[split], strict=True):
      assert t.won == won
      np.testing.assert_array_equal(t.accepted, acc)
      np.testing.assert_array_equal(t.consistent, con)
      np.testing.assert_array_equal(t.stalled, stall)
    # Every harness count is the directory's.
    _, from_logs, _ = compare_evaluations.read(directory)
    assert text_metrics.summarize(traces[split]) == text_metrics.summarize(from_logs[split])
  # compare_evaluations reads the file wherever it reads a directory.
  assert compare_evaluations.read(path)[0] == key


def test_comparisons_against_a_summary_equal_those_against_its_directory(tmp_path):
  rng = np.random.default_rng(1)
  before = [_write(tmp_path / f"b{k}", rng, params=f"b{k}")[0] for k in range(2)]
  after = [_write(tmp_path / f"a{k}", rng, params=f"a{k}")[0] for k in range(2)]
  files = [_summary_file(d, tmp_path / f"b{k}.json") for k, d in enumerate(before)]
  from_dirs = compare_evaluations.compare(before, after)
  from_files = compare_evaluations.compare(files, after)
  assert compare_evaluations.render(from_files, by_type=True) == compare_evaluations.render(
      from_dirs, by_type=True)
  # A summary of another decoding is refused as its directory would be.
  other, _ = _write(tmp_path / "w2", rng)
  with open(os.path.join(other, "key.json")) as f:
    key = json.load(f)
  key["window"] = 2
  with open(os.path.join(other, "key.json"), "w") as f:
    json.dump(key, f)
  with pytest.raises(ValueError, match="^window: "):
    compare_evaluations.compare([_summary_file(other, tmp_path / "w2.json")], [after[0]])


def _good(tmp_path):
  directory, _ = _write(tmp_path / "good", np.random.default_rng(2))
  with open(_summary_file(directory, tmp_path / "good.json")) as f:
    return json.load(f)


def _edit(summary, field):
  s = json.loads(json.dumps(summary))
  if field == "format":
    s["format"] = "harnax-eval-summary/0"
  elif field == "order":
    s["splits"]["seen"][:2] = s["splits"]["seen"][1::-1]
  elif field == "won":
    s["splits"]["unseen"][1]["won"] = 1
  elif field == "verdict":
    s["splits"]["seen"][0]["stalled"] = "012"
  elif field == "lengths":
    s["splits"]["seen"][0]["accepted"] += "1"
  elif field == "split":
    del s["splits"]["unseen"]
  return s


@pytest.mark.parametrize("field, message", [
    ("format", r"format: expected 'harnax-eval-summary/1'"),
    ("order", r"splits\.seen: expected the key's 4 tasks in its order"),
    ("won", r"splits\.unseen\[1\]\.won: expected true or false"),
    ("verdict", r"splits\.seen\[0\]\.stalled: expected a string of 0 and 1"),
    ("lengths", r"splits\.seen\[0\]: expected accepted, consistent and stalled of one length"),
    ("split", r"splits: expected the key's splits \['seen', 'unseen'\]"),
])
def test_malformed_summaries_are_refused_by_field(tmp_path, field, message):
  path = tmp_path / f"{field}.json"
  path.write_text(json.dumps(_edit(_good(tmp_path), field)))
  with pytest.raises(ValueError, match=message):
    eval_summary.load(str(path))
  # Writing checks the same, so a malformed summary is never committed.
  with pytest.raises(ValueError, match=message):
    eval_summary.write(_edit(_good(tmp_path), field), str(tmp_path / "out.json"))
  assert not (tmp_path / "out.json").exists()


def test_a_file_that_is_not_a_summary_or_of_another_setting_is_refused(tmp_path):
  broken = tmp_path / "broken.json"
  broken.write_text("{not json")
  with pytest.raises(ValueError, match="expected a JSON evaluation summary"):
    compare_evaluations.read(str(broken))
  good = tmp_path / "good.json"
  good.write_text(json.dumps(_good(tmp_path)))
  with pytest.raises(ValueError, match="^setting: .* not 'harness_removed'"):
    compare_evaluations.read(str(good), setting="harness_removed")


def test_the_script_summarizes_a_study_and_names_what_it_leaves_out(tmp_path):
  study = tmp_path / "study"
  rng = np.random.default_rng(3)
  _write(study / "eval" / "student", rng, params="s")
  _write(study / "runs" / "had-seed0" / "eval", rng, params="h")
  # A run whose evaluation stopped after the seen split: named, not summarized.
  _write(study / "runs" / "opd-seed0" / "eval", rng, params="o", log_splits=("seen",))
  os.makedirs(study / "runs" / "sopd-seed0")  # still training: no eval/ yet
  out_dir = tmp_path / "summaries"
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "scripts", "summarize_evaluations.py"),
       f"--study_dir={study}", f"--out_dir={out_dir}"], capture_output=True, text=True,
      check=True, env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}).stdout
  assert sorted(os.listdir(out_dir)) == ["had-seed0.json", "student.json"]
  assert "| opd-seed0 | left out: setting: " in out
  for name, directory in (("student", study / "eval" / "student"),
                          ("had-seed0", study / "runs" / "had-seed0" / "eval")):
    key, traces, _ = eval_summary.load(str(out_dir / f"{name}.json"))
    _, from_logs, _ = compare_evaluations.read(str(directory))
    assert key["params"] == name[0]
    for split in TASKS:
      assert [t.won for t in traces[split]] == [t.won for t in from_logs[split]]
      wins = text_metrics.success(traces[split]).successes
      assert f"{split} {wins}/{len(TASKS[split])}" in out
