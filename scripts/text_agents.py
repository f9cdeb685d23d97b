"""Builds a text-game agent (teacher or student) and evaluates it as the HAD paper does.

  python scripts/text_agents.py --config=configs/text_agents.py            # the teacher
  python scripts/text_agents.py --config=configs/text_agents.py:student
  python scripts/text_agents.py --config=configs/text_agents.py --config.checkpoint=DIR

Success on seen and unseen ALFWorld tasks with the harness, with it removed, with state
tracking hidden and with action monitoring hidden; harness utilization, stall prevention and
stall escape (docs/text_eval.md), beside a random admissible-action agent. Writes
`report.md`, `metrics.json` and `config.json` to `<output_dir>/`. The pipeline is
`harnax.studies.text_agents`.
"""

from ml_collections import config_flags

from harnax.studies import results
from harnax.studies import text_agents

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)


def main(argv, config=None):
  del argv
  cfg = config if config is not None else _CONFIG.value
  result = text_agents.run(cfg, log=results.stderr_log)
  text = text_agents.render(cfg, result)
  paths = results.write_results(cfg.output_dir, report={"report.md": text},
                                metrics=text_agents.metrics(result), config=cfg)
  print(text)
  print("wrote " + ", ".join(paths))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/text_agents.py",
                                            "experiment config")
  results.run_script(main)
