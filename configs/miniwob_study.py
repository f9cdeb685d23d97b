"""Config of scripts/miniwob_study.py: the tabular MiniWoB++ study across H0–H5.

  python scripts/miniwob_study.py --config=configs/miniwob_study.py \
      --config.num_train=24 --config.families='("click-option",)'
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.num_train = 12        # training task instances per family (seeds split_seed, ...)
  config.num_test = 6          # held-out instances (never seen in training)
  config.split_seed = 0
  config.discount = 0.9        # stands in for MiniWoB++'s time decay (docs/harnesses.md §2)
  config.tau = 0.1
  config.steps = 200           # exact policy-gradient (Adam) steps per harness
  config.adapt_steps = 100     # steps adapting a model to the harness it is swapped to
  config.learning_rate = 0.1
  config.plot = True           # results/<...>/study.png (matplotlib)
  config.output_dir = "results/miniwob_study"
  return config
