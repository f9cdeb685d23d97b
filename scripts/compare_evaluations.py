"""Two sets of kept evaluations compared task by task (docs/had.md, "Comparing evaluations").

  python scripts/compare_evaluations.py \
      --before=results/had_study/alfworld-cpu-120tasks/eval/student \
      --after=results/had_study/alfworld-cpu-16episodes/runs/had-seed0/eval

Directories are comma-separated, one per seed; seed k of --before is paired with seed k of
--after. The pipeline is `harnax.studies.compare_evaluations`.
"""

from absl import flags

from harnax.studies import compare_evaluations
from harnax.studies import results

_BEFORE = flags.DEFINE_list("before", None, "evaluation directories, one per seed",
                            required=True)
_AFTER = flags.DEFINE_list("after", None, "evaluation directories, one per seed of --before",
                           required=True)
_SETTING = flags.DEFINE_string("setting", "with_harness", "harness setting to compare")
_BY_TYPE = flags.DEFINE_bool("by_type", False, "also a row per split and task type")
_LABELS = flags.DEFINE_list("labels", ["before", "after"], "the two columns' names")


def main(argv):
  del argv
  if len(_LABELS.value) != 2:
    raise ValueError(f"labels: expected two names, got {_LABELS.value!r}")
  result = compare_evaluations.compare(_BEFORE.value, _AFTER.value, setting=_SETTING.value)
  print(compare_evaluations.render(result, before=_LABELS.value[0], after=_LABELS.value[1],
                                   by_type=_BY_TYPE.value),
        end="")


if __name__ == "__main__":
  results.run_script(main)
