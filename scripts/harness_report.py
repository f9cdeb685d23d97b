"""C, M, J, T per harness: exact values beside deployment estimates with intervals.

  python scripts/harness_report.py --config=configs/harness_report.py

Writes `<output_dir>/report.md`, `metrics.json` and `config.json`; the pipeline is
`harnax.studies.harness_report` (its docstring says what the tables hold).
"""

from ml_collections import config_flags

from harnax.studies import harness_report
from harnax.studies import results

_CONFIG = config_flags.DEFINE_config_file("config", "configs/harness_report.py",
                                          "experiment config")


def main(_):
  results.run_study(harness_report, _CONFIG.value)


if __name__ == "__main__":
  results.run_script(main)
