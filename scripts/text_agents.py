"""Builds a text-game agent (teacher or student) and evaluates it as the HAD paper does.

  python scripts/text_agents.py --config=configs/text_agents.py            # the teacher
  python scripts/text_agents.py --config=configs/text_agents.py:student
  python scripts/text_agents.py --config=configs/text_agents.py --config.checkpoint=DIR
  python scripts/text_agents.py --config=configs/text_agents.py --prepare_data=DATA
  python scripts/text_agents.py --config=configs/text_agents.py --config.data_dir=DATA \
      --build_only                 # train on DATA, where the games need not run

Success on seen and unseen ALFWorld tasks with the harness, with it removed, with state
tracking hidden and with action monitoring hidden; harness utilization, stall prevention and
stall escape (docs/text_eval.md), beside a random admissible-action agent. Writes
`report.md`, `metrics.json` and `config.json` to `<output_dir>/`. The pipeline is
`harnax.studies.text_agents`.
"""

from absl import flags
from ml_collections import config_flags

from harnax.studies import results
from harnax.studies import text_agents

_CONFIG = None  # the --config flag, defined only when run as a script (importable in tests)
_PREPARE = flags.DEFINE_string(
    "prepare_data", None, "only play the walkthroughs and write the training data (examples "
    "and tokenizer) to this directory; a build elsewhere reads it with --config.data_dir")
_BUILD_ONLY = flags.DEFINE_bool(
    "build_only", False, "only build the agent in --config.agent_dir; no evaluation (a host "
    "without the game engines trains on --config.data_dir this way)")


def main(argv, config=None):
  del argv
  cfg = config if config is not None else _CONFIG.value
  if config is None and _PREPARE.value:
    print("wrote " + text_agents.prepare_data(cfg, _PREPARE.value, log=results.stderr_log))
    return
  if config is None and _BUILD_ONLY.value:
    print("wrote " + text_agents.build_agent(cfg, cfg.agent_dir, log=results.stderr_log))
    return
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
