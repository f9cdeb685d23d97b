"""The HAD study: a locally built teacher distilled into a student by HAD, OPD, SAGE-OPD,
Guided-OPD and SOPD, HAD's ablations and the teacher-budget-x2 controls, each evaluated under
the four harness settings (docs/had.md).

  python scripts/had_study.py --config=configs/distill.py:had
  python scripts/had_study.py --config=configs/distill.py:had,scienceworld
  python scripts/had_study.py --config=configs/distill.py:had,alfworld,micro   # minutes

Writes `report.md` (the paper's tables' shape, its numbers beside ours), `metrics.json` and
`config.json` to `<study.output_dir>/`. The pipeline is `harnax.studies.had_study`.
"""

from ml_collections import config_flags

from harnax.studies import had_study
from harnax.studies import results

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)


def main(argv, config=None):
  del argv
  cfg = config if config is not None else _CONFIG.value
  result = had_study.run(cfg, log=results.stderr_log)
  text = had_study.render(cfg, result)
  paths = results.write_results(cfg.study.output_dir, report={"report.md": text},
                                metrics=had_study.metrics(result), config=cfg)
  print(text)
  print("wrote " + ", ".join(paths))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/distill.py", "experiment config")
  results.run_script(main)
