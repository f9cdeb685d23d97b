"""The proxy-optimum method validated on MiniWoB++, where the exact values are known.

  python scripts/proxy_validation.py --config=configs/proxy_validation.py

A frozen policy (the log-linear model trained on H0) is deployed under H0–H5; proxies of
varied quality stand in for pi*; C~ and M~ are estimated from sampled episodes with
`harnax.estimate.proxy` and the rankings they induce are scored against the exact J.
Writes `report.md`, `metrics.json`, `config.json` and `recovery.png` to `<output_dir>/`;
progress goes to standard error. The pipeline is `harnax.studies.proxy_validation`.
"""

from ml_collections import config_flags

from harnax.studies import proxy_validation
from harnax.studies import results

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)


def main(argv, config=None):
  del argv
  results.run_study(proxy_validation, config if config is not None else _CONFIG.value,
                    plot_file="recovery.png")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/proxy_validation.py",
                                            "experiment config")
  results.run_script(main)
