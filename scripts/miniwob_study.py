"""The tabular MiniWoB++ study: C, pi*, M and J for every family and harness H0–H5.

  python scripts/miniwob_study.py --config=configs/miniwob_study.py

For every family of the config: task instances split into train / held-out, each compiled
under H0–H5 (harnax.envs.miniwob); a log-linear text policy trained by exact policy
gradient on each harness, read through every harness ("frozen") and adapted along the
swaps the frozen comparison rejects while T > 0 (the harness-transfer study's rule, or the
config's list), once per reference policy of `pi_refs`; the report adds the checkpoint ×
harness score error, the three-way decomposition and the harness rankings
(harnax.studies.transfer_metrics). Writes `report.md`, `metrics.json`, `config.json` and
`study.png` to `<output_dir>/`; progress goes to standard error. The pipeline is
`harnax.studies.miniwob` and `harnax.studies.miniwob_report`.
"""

from ml_collections import config_flags

from harnax.studies import miniwob_report
from harnax.studies import results

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)


def main(argv):
  del argv
  results.run_study(miniwob_report, _CONFIG.value, plot_file="study.png")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/miniwob_study.py",
                                            "experiment config")
  results.run_script(main)
