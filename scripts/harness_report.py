"""C, M, J, T per harness: exact values beside deployment estimates with intervals.

  python scripts/harness_report.py --config=configs/harness_report.py

Writes `<output_dir>/report.md`, `metrics.json` and `config.json`; the pipeline is
`harnax.studies.harness_report` (its docstring says what the tables hold).
"""

import jax
from ml_collections import config_flags

from harnax.studies import harness_report
from harnax.studies import results

_CONFIG = config_flags.DEFINE_config_file("config", "configs/harness_report.py",
                                          "experiment config")


def main(_):
  cfg = _CONFIG.value
  with jax.enable_x64(True):
    result = harness_report.run(cfg, log=results.stderr_log)
    text = harness_report.render(cfg, result)
  paths = results.write_results(cfg.output_dir, report={"report.md": text},
                                metrics=harness_report.metrics(result), config=cfg)
  print(text)
  print("wrote " + ", ".join(paths))


if __name__ == "__main__":
  results.run_script(main)
