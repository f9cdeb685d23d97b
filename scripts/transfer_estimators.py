"""The estimator comparisons of the harness-transfer study (large changes, small differences).

  python scripts/transfer_estimators.py --config=configs/transfer_estimators.py

For every family of the config: log-linear checkpoints trained by exact policy gradient on each
harness, deployed frozen on every other harness (the new return predicted by `C' - M_hat'` and by
`C'` alone), and two adaptation runs from the H0 checkpoint (adapted to H1, continued on H0)
along which the return difference is estimated by the sampled mismatch and by frequency
rollouts at equal budgets. Writes `report.md`, `metrics.json`, `config.json` and
`adaptation.png` to `<output_dir>/`; progress goes to standard error. The pipeline is
`harnax.studies.transfer_estimators`; the method: docs/transfer_estimators.md.
"""

from ml_collections import config_flags

from harnax.studies import results
from harnax.studies import transfer_estimators

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)


def main(argv, cfg=None):
  del argv
  results.run_study(transfer_estimators, cfg if cfg is not None else _CONFIG.value,
                    plot_file="adaptation.png")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/transfer_estimators.py",
                                            "experiment config")
  results.run_script(main)
