"""What HAD's preference term trained on, per run and block of updates (docs/had.md; the
pipeline is `harnax.studies.had_pairs`).

  python scripts/had_pairs.py --runs=results/had_study/<study>/runs/had-seed0 --block=5

Each run must have kept its pairs (`rollouts/pairs_step_*.jsonl`, written by
`distill_loop.train` for HAD and its ablations). Over the active pairs (the teacher's two
actions differ and the pair is valid): how often `a⁺` is the student's own action, how often
the student's reasoning names `a⁺`, and how often `a⁺` is another action than the one the
reasoning names and the student took. With `--verbs=N`, the N most frequent pairs of verbs
(a⁺'s first word, a⁻'s) over each run's active pairs.
"""

from absl import flags

from harnax.studies import had_pairs
from harnax.studies import results

_RUNS = flags.DEFINE_list("runs", None, "run directories (each with rollouts/)", required=True)
_BLOCK = flags.DEFINE_integer("block", 5, "updates per row")
_VERBS = flags.DEFINE_integer("verbs", 0, "also the N most frequent (a⁺ verb, a⁻ verb) per run")


def _pct(k: int, n: int) -> str:
  return f"{k}/{n} ({100 * k / n:.0f} %)" if n else "0/0"


def main(argv):
  del argv
  if _BLOCK.value < 1:
    raise ValueError(f"block: expected an int >= 1, got {_BLOCK.value}")
  header = ["run", "updates", "states", "differ", "active", "a⁺ = student's action",
            "reasoning names a⁺", "a⁺ against the reasoning", "after a rejection",
            "of those, a⁺ = student's action"]
  rows = []
  for run in _RUNS.value:
    by_step = had_pairs.run_counts(run)
    blocks = {}
    for step, c in sorted(by_step.items()):
      lo = step - step % _BLOCK.value
      blocks[lo] = blocks.get(lo, had_pairs.PairCounts()) + c
    total = sum(by_step.values(), had_pairs.PairCounts())
    # One block is already the whole run: no "all" row to repeat it.
    for lo, c in list(blocks.items()) + ([("all", total)] if len(blocks) > 1 else []):
      span = "all" if lo == "all" else f"{lo}-{lo + _BLOCK.value - 1}"
      rows.append([run, span, str(c.states), str(c.differ), str(c.active),
                   _pct(c.positive_is_action, c.active), _pct(c.positive_named, c.active),
                   _pct(c.against_reasoning, c.active), _pct(c.after_rejection, c.active),
                   _pct(c.after_rejection_is_action, c.after_rejection)])
  print(results.markdown_table(header, rows))
  if _VERBS.value > 0:
    rows = []
    for run in _RUNS.value:
      counts = had_pairs.run_verb_pairs(run)
      total = sum(counts.values())
      rows += [[run, f"{pos} / {neg}", _pct(k, total)]
               for (pos, neg), k in counts.most_common(_VERBS.value)]
    print()
    print(results.markdown_table(["run", "a⁺ verb / a⁻ verb", "active pairs"], rows))


if __name__ == "__main__":
  results.run_script(main)
