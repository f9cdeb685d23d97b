"""A kept evaluation in a few kilobytes, to commit beside the report that quotes it.

`had_study.evaluations` keeps each greedy evaluation as megabytes of rollout logs (every
prompt and response) in a results folder that a repository does not carry; a later session
that wants to compare a new run with an earlier one task by task would have to play the earlier
one again. A summary keeps what the task-level comparisons and the harness counts read, and no
text: the evaluation's key (weights' digest, tasks, decoding) and, per split and episode, the
task, its type, whether it was won and the harness's verdict on each turn (accepted by the
action monitor, consistent with the record, loop reported) as strings of ``0``/``1``. That is
every count of `text_metrics` (success, utilization, stall prevention and escape) and every
comparison of `compare_evaluations`, which reads a summary wherever it reads a directory.

  python scripts/summarize_evaluations.py --study_dir=<study> --out_dir=<folder>

One summary file (JSON)::

  {"format": "harnax-eval-summary/1", "setting": "with_harness", "key": {...key.json...},
   "splits": {split: [{"task": ident, "type": task type, "won": bool,
                       "accepted": "0110", "consistent": "1111", "stalled": "0000"}, ...]}}

The episodes of a split are the key's tasks in the key's order (checked on reading).
"""

from __future__ import annotations

import json
import os

import numpy as np

from harnax.studies import text_metrics

FORMAT = "harnax-eval-summary/1"
_VERDICTS = ("accepted", "consistent", "stalled")


def summarize(key: dict, traces: dict, types: dict, *, setting: str = "with_harness") -> dict:
  """The summary (module docstring) of one evaluation as `compare_evaluations.read` gives it:
  its key, `{split: [EpisodeTrace]}` and `{split: [task type]}` (the key's tasks in order)."""
  splits = {}
  for split, episodes in traces.items():
    splits[split] = [
        {"task": task, "type": kind, "won": bool(t.won),
         **{v: "".join("1" if x else "0" for x in getattr(t, v)) for v in _VERDICTS}}
        for task, kind, t in zip(key["tasks"][split], types[split], episodes, strict=True)]
  summary = {"format": FORMAT, "setting": setting, "key": key, "splits": splits}
  _check(summary, "summary")
  return summary


def write(summary: dict, path: str) -> None:
  """Writes `summary` to `path` (a temporary name renamed when complete), after checking it."""
  _check(summary, path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(summary, f, indent=None, separators=(",", ":"))
    f.write("\n")
  os.replace(tmp, path)


def load(path: str, setting: str = "with_harness") -> tuple[dict, dict, dict]:
  """`(key, {split: [EpisodeTrace]}, {split: [task type]})` of a summary file, as
  `compare_evaluations.read` gives them for a kept directory.

  Raises ValueError, naming the field, when the file is not a summary, is of another setting,
  or its episodes are not its key's tasks in order or carry malformed verdicts.
  """
  try:
    with open(path) as f:
      summary = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: expected a JSON evaluation summary ({FORMAT}): {e}") from None
  _check(summary, path)
  if summary["setting"] != setting:
    raise ValueError(f"setting: {path!r} summarizes the {summary['setting']!r} evaluation, "
                     f"not {setting!r}")
  traces, types = {}, {}
  for split, episodes in summary["splits"].items():
    traces[split] = [text_metrics.EpisodeTrace(
        won=bool(e["won"]),
        **{v: np.array([c == "1" for c in e[v]], bool) for v in _VERDICTS})
        for e in episodes]
    types[split] = [str(e["type"]) for e in episodes]
  return summary["key"], traces, types


def _check(summary, where: str) -> None:
  """Raises ValueError naming the first field of `summary` that is not as written above."""
  if not isinstance(summary, dict) or summary.get("format") != FORMAT:
    got = summary.get("format") if isinstance(summary, dict) else type(summary).__name__
    raise ValueError(f"{where}: format: expected {FORMAT!r}, got {got!r}")
  if not isinstance(summary.get("setting"), str):
    raise ValueError(f"{where}: setting: expected a harness setting name")
  key = summary.get("key")
  if not isinstance(key, dict) or not isinstance(key.get("tasks"), dict) or not key["tasks"]:
    raise ValueError(f"{where}: key: expected an evaluation key with a 'tasks' mapping")
  splits = summary.get("splits")
  if not isinstance(splits, dict) or set(splits) != set(key["tasks"]):
    raise ValueError(f"{where}: splits: expected the key's splits {sorted(key['tasks'])}, got "
                     f"{sorted(splits) if isinstance(splits, dict) else splits!r}")
  for split, episodes in splits.items():
    tasks = [e.get("task") if isinstance(e, dict) else None for e in episodes]
    if tasks != list(key["tasks"][split]):
      raise ValueError(f"{where}: splits.{split}: expected the key's {len(key['tasks'][split])} "
                       f"tasks in its order, got {len(tasks)} episodes of other tasks or order")
    for i, e in enumerate(episodes):
      if not isinstance(e.get("won"), bool):
        raise ValueError(f"{where}: splits.{split}[{i}].won: expected true or false, got "
                         f"{e.get('won')!r}")
      lengths = set()
      for v in _VERDICTS:
        s = e.get(v)
        if not isinstance(s, str) or set(s) - {"0", "1"}:
          raise ValueError(f"{where}: splits.{split}[{i}].{v}: expected a string of 0 and 1 "
                           f"(one per turn), got {s!r}")
        lengths.add(len(s))
      if len(lengths) != 1:
        raise ValueError(f"{where}: splits.{split}[{i}]: expected accepted, consistent and "
                         f"stalled of one length (the turns), got lengths {sorted(lengths)}")
