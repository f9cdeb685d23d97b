"""Two sets of kept evaluations compared task by task (docs/had.md, "Comparing evaluations").

`had_study.evaluations` keeps every greedy evaluation as rollout logs beside a key (the weights'
digest, the tasks, the decoding). Two models evaluated on the same tasks, in one study or in
two (a run of another batch size, learning rate or step count against one of the study's), can
therefore be compared afterwards without playing a game: `compare(before_dirs, after_dirs)`
pairs seed k of one with seed k of the other and gives each split's success and the pooled
task-level test (`text_metrics.pooled_paired_wins`). An evaluation's summary
(`eval_summary`: its key and each episode's outcome and harness verdicts, a few kilobytes that
can be committed beside a report) is read wherever its directory is.

  python scripts/compare_evaluations.py --before=DIR[,DIR...] --after=DIR[,DIR...]
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from harnax.studies import eval_summary
from harnax.studies import text_agents
from harnax.studies import text_metrics
from harnax.train import rollouts

# Key fields that decide which episodes are played: two evaluations that differ in one of them
# are not of the same tasks under the same rules (the weights and the vocabulary may differ:
# comparing models is the point).
MATCHED_FIELDS = ("format", "tasks", "window", "max_steps", "max_new_tokens")


def read_logs(directory: str, setting: str = "with_harness") -> tuple[dict, dict]:
  """`(key, {split: records})` of one evaluation kept by `had_study.evaluations`: its key and
  each split's rollout-log records for `setting`.

  Raises ValueError when the directory holds no key, when a split's log for `setting` is
  missing, or when a log's episodes are not the key's tasks in the key's order.
  """
  key_path = os.path.join(directory, "key.json")
  if not os.path.isfile(key_path):
    raise ValueError(f"directory: expected an evaluation kept by had_study.evaluations "
                     f"(a key.json), found none in {directory!r}")
  with open(key_path) as f:
    key = json.load(f)
  if not isinstance(key.get("tasks"), dict) or not key["tasks"]:
    raise ValueError(f"{key_path}: expected a 'tasks' mapping of split to task names")
  out = {}
  for split, names in key["tasks"].items():
    path = os.path.join(directory, f"{setting}-{split}.jsonl")
    if not os.path.isfile(path):
      raise ValueError(f"setting: {directory!r} has no {setting!r} evaluation of split "
                       f"{split!r} ({os.path.basename(path)} is missing)")
    records = rollouts.read_log(path)
    played = [r["task"]["ident"] for r in _resets(records)]
    if played != list(names):
      raise ValueError(f"{path}: expected the {len(names)} tasks of key.json in its order, the "
                       f"log has {len(played)} episodes of other tasks or in another order "
                       "(an evaluation stopped mid-write or a log from another key)")
    out[split] = records
  return key, out


def _resets(records) -> list[dict]:
  return [r for _, recs in rollouts.episodes(records).items() for r in recs
          if r.get("kind") == "reset"]


def read(directory: str, setting: str = "with_harness") -> tuple[dict, dict, dict]:
  """`(key, {split: [EpisodeTrace]}, {split: [task type]})` of one evaluation kept by
  `had_study.evaluations` (the task types as logged; "" where a log has none). Checks and
  errors: `read_logs`. A file instead of a directory is read as the evaluation's summary
  (`eval_summary.load`), which gives the same.
  """
  if os.path.isfile(directory):
    return eval_summary.load(directory, setting)
  key, logs = read_logs(directory, setting)
  out = {split: text_agents.traces_from_log(records) for split, records in logs.items()}
  types = {split: [str(r["task"].get("task_type", "")) for r in _resets(records)]
           for split, records in logs.items()}
  return key, out, types


def compare(before: Sequence[str], after: Sequence[str], *,
            setting: str = "with_harness") -> dict:
  """Seed k of `before` against seed k of `after`, task by task, per split.

  Args:
    before, after: evaluation directories (`had_study.evaluations`) or their summaries
      (`eval_summary`), one per seed; the same one may be repeated (the student before
      distillation against each seed of a run).
    setting: the harness setting whose logs are compared.

  Returns:
    `{"splits": {split: {"before": Rate, "after": Rate, "paired": PooledPairedWins}},
    "types": {split: {task type: the same}}, "same_weights": [k, ...]}`: each side's success
    pooled over its distinct directories (a repeated one counts once), the same by task type
    (as the first directory's log names them), and the seed pairs whose weights' digests are
    equal (two names for one model, whose comparison is empty by construction).
  """
  before, after = list(before), list(after)
  if not before:
    raise ValueError("before: expected at least one evaluation directory, got none")
  if len(after) != len(before):
    raise ValueError(f"after: expected {len(before)} evaluation directories (one per "
                     f"directory of `before`), got {len(after)}")
  read_ = {d: read(d, setting) for d in dict.fromkeys(before + after)}
  first_key = read_[before[0]][0]
  for d, (key, _, _) in read_.items():
    for field in MATCHED_FIELDS:
      if key.get(field) != first_key.get(field):
        raise ValueError(f"{field}: {d!r} was evaluated with another {field} than "
                         f"{before[0]!r}; only evaluations of the same tasks under the same "
                         "decoding can be compared task by task")
  splits, by_type = {}, {}
  for split in first_key["tasks"]:
    splits[split] = _side_by_side(read_, before, after, split, None)
    types = read_[before[0]][2][split]
    by_type[split] = {t: _side_by_side(read_, before, after, split,
                                       [i for i, u in enumerate(types) if u == t])
                      for t in dict.fromkeys(types)}
  same = [k for k, (x, y) in enumerate(zip(before, after))
          if read_[x][0].get("params") == read_[y][0].get("params")]
  return {"splits": splits, "types": by_type, "same_weights": same}


def _side_by_side(read_: dict, before: list, after: list, split: str, rows) -> dict:
  """Both sides' pooled success and the pooled paired test on one split's episodes (`rows`:
  their indices, None for all)."""
  def pick(d):
    traces = read_[d][1][split]
    return traces if rows is None else [traces[i] for i in rows]
  return {"before": text_metrics.success([t for d in dict.fromkeys(before) for t in pick(d)]),
          "after": text_metrics.success([t for d in dict.fromkeys(after) for t in pick(d)]),
          "paired": text_metrics.pooled_paired_wins([pick(d) for d in before],
                                                    [pick(d) for d in after])}


def render(result: dict, *, before: str = "before", after: str = "after",
           by_type: bool = False) -> str:
  """A markdown table of `compare`'s result: success of each side (95 % Wilson interval,
  pooled over seeds) and the tasks where `after` is ahead and behind, with the p-value; with
  `by_type`, a row per split and task type as well."""
  lines = [f"| split | {before} | {after} | tasks {after} is ahead / behind | p (sign-flip) |",
           "|---|---|---|---|---|"]
  rows = [(split, r) for split, r in result["splits"].items()]
  if by_type:
    rows += [(f"{split}: {t}", r) for split, types in result["types"].items()
             for t, r in types.items()]
  for label, r in rows:
    p = r["paired"]
    lines.append(f"| {label} | {_rate(r['before'])} | {_rate(r['after'])} | "
                 f"{p.ahead} / {p.behind} | {p.p_value:.2g} |")
  if result.get("same_weights"):
    lines += ["", f"Seed pairs {result['same_weights']} have the same weights on both sides."]
  return "\n".join(lines) + "\n"


def _rate(rate: text_metrics.Rate) -> str:
  lo, hi = rate.interval()
  return (f"{rate.successes}/{rate.trials}, {100 * rate.value:.1f} % "
          f"[{100 * lo:.0f}, {100 * hi:.0f}]")
