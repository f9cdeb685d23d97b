"""`make demo`: the harness-transfer study with a language model (configs/demo.py).

  python scripts/demo.py --config=configs/demo.py --config.num_train=8

Builds (or reuses) the base model, post-trains one checkpoint per harness H0–H5 by exact
policy gradient, reads every checkpoint through every harness on held-out instances, adapts
along the swaps, and runs the log-linear family through the same protocol. Prints the
headline table (the paper's findings beside ours) and writes `report.md`, `metrics.json`
and `config.json` to `<output_dir>/`; progress goes to standard error. The pipeline is
`harnax.studies.lm_study`.
"""

import jax
from ml_collections import config_flags

from harnax.studies import lm_study
from harnax.studies import results

_CONFIG = None  # the --config flag, defined only when run as a script


def main(argv):
  del argv
  cfg = _CONFIG.value
  lm_study.check_config(cfg)
  # Exact evaluation in float64 (the tabular side); the model computes in its own dtype.
  with jax.enable_x64(True):
    result = lm_study.run(cfg, log=results.stderr_log)
  text = lm_study.render(cfg, result)
  paths = results.write_results(cfg.output_dir, report={"report.md": text},
                                metrics=lm_study.metrics(result), config=cfg)
  print("\n## Headline: the paper's findings beside ours\n")
  print(lm_study.headline_table(result))
  print("\nwrote " + ", ".join(paths))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "experiment config")
  results.run_script(main)
