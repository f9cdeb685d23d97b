"""Every kept evaluation of a study as a summary file, to commit beside its report
(`harnax.studies.eval_summary`; docs/had.md, "Comparing evaluations").

  python scripts/summarize_evaluations.py \
      --study_dir=results/had_study/<study> --out_dir=docs/had_study/evaluations/<study>

Writes `<out_dir>/{teacher,student}.json` and `<out_dir>/<run>.json` (e.g. `had-seed0.json`)
for each evaluation the study kept under `--setting`, and prints each one's digest and
success. A run whose evaluation is not complete (still training, or stopped mid-write) is
named and left out. `scripts/compare_evaluations.py` reads the files as it reads directories.
"""

import os

from absl import flags

from harnax.studies import compare_evaluations
from harnax.studies import eval_summary
from harnax.studies import results
from harnax.studies import text_metrics

_STUDY = flags.DEFINE_string("study_dir", None, "a had_study output_dir", required=True)
_OUT = flags.DEFINE_string("out_dir", None, "where the summaries go", required=True)
_SETTING = flags.DEFINE_string("setting", "with_harness", "harness setting to summarize")


def _evaluations(study_dir: str) -> dict[str, str]:
  """`{name: directory}`: the teacher's, the student's and each run's final evaluation."""
  out = {name: os.path.join(study_dir, "eval", name) for name in ("teacher", "student")}
  runs = os.path.join(study_dir, "runs")
  for run in sorted(os.listdir(runs)) if os.path.isdir(runs) else ():
    out[run] = os.path.join(runs, run, "eval")
  return {name: d for name, d in out.items() if os.path.isdir(d)}


def main(argv):
  del argv
  found = _evaluations(_STUDY.value)
  if not found:
    raise ValueError(f"study_dir: expected a had_study output_dir with eval/ or runs/*/eval, "
                     f"found neither in {_STUDY.value!r}")
  print("| evaluation | weights' digest | success by split |")
  print("|---|---|---|")
  for name, directory in found.items():
    try:
      key, traces, types = compare_evaluations.read(directory, _SETTING.value)
    except ValueError as e:
      print(f"| {name} | left out: {e} | |")
      continue
    summary = eval_summary.summarize(key, traces, types, setting=_SETTING.value)
    eval_summary.write(summary, os.path.join(_OUT.value, f"{name}.json"))
    rates = ", ".join(f"{split} {text_metrics.success(t).successes}/{len(t)}"
                      for split, t in traces.items())
    print(f"| {name} | {str(key.get('params', ''))[:12]} | {rates} |")


if __name__ == "__main__":
  results.run_script(main)
