"""Config of scripts/miniwob_study.py: the tabular MiniWoB++ study across H0–H5.

  python scripts/miniwob_study.py --config=configs/miniwob_study.py \
      --config.num_train=24 --config.families='("click-option",)'
  # a reduced run (minutes on 2 cores):
  python scripts/miniwob_study.py --config=configs/miniwob_study.py --config.num_train=6 \
      --config.num_test=3 --config.steps=100 --config.adapt_steps=50
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
  # Swaps to adapt along: swap_rule "select" is the harness-transfer study's rule (every
  # ordered pair of the six harnesses the frozen comparison rejects while
  # T = ΔC + M_H(π) > 0); "given" adapts along `swaps`.
  config.swap_rule = "select"
  config.swaps = (("H0", "H1"), ("H0", "H2"), ("H0", "H3"), ("H0", "H4"), ("H0", "H5"),
                  ("H1", "H5"), ("H2", "H5"), ("H3", "H5"), ("H4", "H5"))
  config.max_swaps = None      # at most this many selected swaps (largest T first); None: all
  config.controls = None       # sources whose swaps get the continued control; None: all
  # The KL reference of every objective; the study runs once per entry and the report
  # compares the sign of the H1 ceiling change: "uniform" over available actions, or
  # "base", the initial model's own semantic policy under each harness.
  config.pi_refs = ("uniform", "base")
  config.plot = True           # results/<...>/study.png (matplotlib)
  config.output_dir = "results/miniwob_study"
  return config
