"""What the turns of kept evaluations show (docs/had.md; the pipeline is
`harnax.studies.eval_turns`).

  python scripts/eval_turns.py \
      --evals=results/had_study/<study>/runs/had-seed0/eval,results/had_study/<study>/runs/had-seed1/eval

The directories are pooled (seeds of one run). Per split: the turns whose action the turn's
reasoning does not name, and over ALFWorld's heat/clean/cool episodes how many got as far as
the transformation and where their first `move` after it went; then the same episodes stage
by stage before the transformation (object seen, taken, carried to the appliance).
"""

from absl import flags

from harnax.studies import compare_evaluations
from harnax.studies import eval_turns
from harnax.studies import results

_EVALS = flags.DEFINE_list("evals", None, "evaluation directories (each with key.json), pooled",
                           required=True)
_SETTING = flags.DEFINE_string("setting", "with_harness", "harness setting to read")


def main(argv):
  del argv
  by_split = {}
  for directory in _EVALS.value:
    _, logs = compare_evaluations.read_logs(directory, _SETTING.value)
    for split, records in logs.items():
      k, n, p, st = by_split.get(split, (0, 0, eval_turns.Progress(), eval_turns.Stages()))
      dk, dn = eval_turns.reasoning_mismatch(records)
      by_split[split] = (k + dk, n + dn, p + eval_turns.transformation_progress(records),
                         st + eval_turns.transformation_stages(records))
  print("| split | action not named in its reasoning | heat/clean/cool episodes | transformed "
        "| then first move to the goal's receptacle | elsewhere | no move | won |")
  print("|---|---|---|---|---|---|---|---|")
  for split, (k, n, p, _) in by_split.items():
    share = f"{k}/{n} ({100 * k / n:.1f} %)" if n else "0/0"
    print(f"| {split} | {share} | {p.episodes} | {p.transformed} | {p.to_goal} | {p.elsewhere} "
          f"| {p.no_move} | {p.won} |")
  print()
  print("| split | heat/clean/cool episodes | object seen | taken | carried to the appliance "
        "| transformed | won | mean turns to take |")
  print("|---|---|---|---|---|---|---|---|")
  for split, (_, _, _, st) in by_split.items():
    mean = f"{st.take_turns / st.taken:.1f}" if st.taken else "n/a"
    print(f"| {split} | {st.episodes} | {st.seen} | {st.taken} | {st.carried} | "
          f"{st.transformed} | {st.won} | {mean} |")

if __name__ == "__main__":
  results.run_script(main)
