"""What HAD's preference term trained on, read from a run's kept pairs (docs/had.md, "HAD with
the turns after a rejection dropped").

`distill_loop.train` keeps every visited state's pair beside the step's rollout log
(`rollouts/pairs_step_*.jsonl`: `a⁺` from the teacher with the harness, `a⁻` without it,
whether they differ and whether `a⁺` passed the validity filter). The term scores `a⁺` and
`a⁻` appended after the student's own reasoning, so what it teaches depends on how they
relate to that reasoning: `summarize` joins each pair to its turn and counts, over the active
pairs (the two actions differ and the pair is valid), how often `a⁺` is the student's own
action, how often the reasoning names `a⁺`, and how often `a⁺` is another action than the one
the reasoning names and the student took (`had.against_reasoning`): such a pair favours an
action the reasoning did not lead to. `had.names_action` matches the action's words literally,
so a reasoning that paraphrases it ("put the apple in" for "move apple 1 to") names nothing:
the counts of named actions are lower bounds.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
from typing import Sequence

from harnax.train import had
from harnax.train import rollouts


@dataclasses.dataclass(frozen=True)
class PairCounts:
  """Counts over a run's visited states (all ints).

  Attributes:
    states: visited states (one pair record each).
    differ: states whose two teacher actions both parse and differ.
    active: of those, the pairs the validity filter keeps (the term's only nonzero ones).
    positive_is_action: active pairs whose `a⁺` is the student's own action there.
    positive_named: active pairs whose `a⁺` the student's reasoning names.
    against_reasoning: active pairs whose `a⁺` is not the student's action while the
      reasoning names that action (the student did what it reasoned, the term favours
      another action after the same reasoning).
    after_rejection: active pairs at a turn right after a rejected action.
    after_rejection_is_action: of those, the pairs whose `a⁺` is the student's own action.
  """

  states: int = 0
  differ: int = 0
  active: int = 0
  positive_is_action: int = 0
  positive_named: int = 0
  against_reasoning: int = 0
  after_rejection: int = 0
  after_rejection_is_action: int = 0

  def __add__(self, other: PairCounts) -> PairCounts:
    return PairCounts(*(a + b for a, b in zip(dataclasses.astuple(self),
                                              dataclasses.astuple(other))))


def summarize(turn_records: Sequence[dict], pair_records: Sequence[dict]) -> PairCounts:
  """Counts of one step's pairs against its rollout log (`PairCounts`).

  Args:
    turn_records: the step's rollout log (`rollouts.read_log`); only `kind == "turn"` records
      are read.
    pair_records: the step's `pairs_step_*.jsonl` records, one per turn.
  Raises:
    ValueError: a pair without a turn of the same episode, index and action in the log.
  """
  turns = {(r["episode"], r["turn"]): r for r in turn_records if r.get("kind") == "turn"}
  counts = {f.name: 0 for f in dataclasses.fields(PairCounts)}
  for p in pair_records:
    turn = turns.get((p["episode"], p["turn"]))
    if turn is None or turn.get("action") != p["action"]:
      raise ValueError(f"pair_records: episode {p['episode']} turn {p['turn']} has no turn with "
                       f"action {p['action']!r} in the rollout log")
    counts["states"] += 1
    counts["differ"] += bool(p["differ"])
    if not (p["differ"] and p["valid"]):
      continue
    counts["active"] += 1
    reasoning, action = turn.get("reasoning") or "", turn.get("action") or ""
    counts["positive_is_action"] += p["positive"] == action
    counts["positive_named"] += had.names_action(reasoning, p["positive"])
    counts["against_reasoning"] += had.against_reasoning(reasoning, action, p["positive"])
    counts["after_rejection"] += bool(p["after_rejection"])
    counts["after_rejection_is_action"] += bool(p["after_rejection"]) and p["positive"] == action
  return PairCounts(**counts)


def verb_pairs(pair_records: Sequence[dict]) -> collections.Counter:
  """`Counter({(verb of a⁺, verb of a⁻): active pairs})`: what the term trades for what.

  The verb is an action's first word ("go to cabinet 1" -> "go"); only active pairs (the
  teacher's two actions differ and the pair is valid) are counted.
  """
  return collections.Counter(
      (p["positive"].split()[0], p["negative"].split()[0]) for p in pair_records
      if p["differ"] and p["valid"])


def _pair_files(workdir: str) -> dict[int, str]:
  """`{step: path}` of a run's kept pairs; ValueError when it kept none."""
  files = {int(os.path.basename(path)[len("pairs_step_"):-len(".jsonl")]): path
           for path in sorted(glob.glob(os.path.join(workdir, "rollouts", "pairs_step_*.jsonl")))}
  if not files:
    raise ValueError(f"workdir: {workdir!r} kept no pairs (rollouts/pairs_step_*.jsonl): not a "
                     "HAD run, or one trained before the pairs were kept")
  return files


def _read_pairs(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def run_verb_pairs(workdir: str) -> collections.Counter:
  """`verb_pairs` over every step of a run that kept its pairs (`<workdir>/rollouts/`)."""
  return sum((verb_pairs(_read_pairs(path)) for path in _pair_files(workdir).values()),
             collections.Counter())


def run_counts(workdir: str) -> dict[int, PairCounts]:
  """`{step: PairCounts}` of every step of a run that kept its pairs (`<workdir>/rollouts/`)."""
  out = {}
  for step, path in _pair_files(workdir).items():
    log = rollouts.read_log(os.path.join(workdir, "rollouts", f"step_{step:06d}.jsonl"))
    out[step] = summarize(log, _read_pairs(path))
  return out
