"""Config of scripts/transfer_estimators.py: the harness-transfer study's estimator comparisons.

  python scripts/transfer_estimators.py --config=configs/transfer_estimators.py

The default runs in a few minutes on 2 CPU cores. To scale: more held-out instances
(`num_test`: the pooled estimates average over them), more seeds (`large.num_seeds`,
`small.num_seeds`: the error and call statistics tighten like 1/sqrt(seeds)), longer
adaptation (`adapt_steps`) evaluated more often (`eval_every`), and larger budgets
(`small.budget`, `large.num_states`). Cost grows linearly in each (seeds, models, arms and
instances run one after another in `jax.lax.map`s; target harnesses and steps are vmapped).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.harnesses = ("H0", "H1", "H2", "H3", "H4", "H5")   # every ordered pair (finding 1)
  config.num_train = 6         # training instances per family (seeds split_seed, ...)
  config.num_test = 3          # held-out instances: every estimate is on these
  config.split_seed = 0
  config.discount = 0.9
  config.tau = 0.1
  config.learning_rate = 0.1
  config.steps = 150           # exact policy-gradient (Adam) steps training each checkpoint
  config.adapt_steps = 24      # steps of the two adaptation runs from the H0 checkpoint
  # A smaller step size than training: the two arms' returns stay close for several steps
  # (the small differences the comparison is about), and the reversal falls along the run.
  config.adapt_learning_rate = 0.01
  config.eval_every = 1        # evaluate the estimators every this many adaptation steps
  config.seed = 0
  config.confidence = 0.9      # bootstrap intervals
  config.num_resamples = 500

  config.large = ml_collections.ConfigDict()   # finding 1: frozen deployment, C' - M_hat'
  config.large.num_seeds = 10
  config.large.num_states = 200      # states from d^pi (geometric stopping) per instance
  config.large.num_action_samples = 8
  # Per-state KL: "k1" (unbiased; needs the policy's log-probabilities of its samples), or
  # "miller_madow" (the frequency distribution's KL, bias-corrected; biased up at small N).
  config.large.estimator = "k1"
  config.large.max_steps = 200       # rollout cap: total-variation bias <= 0.9^200

  config.small = ml_collections.ConfigDict()   # finding 2: equal budgets along adaptation
  config.small.num_seeds = 40
  config.small.budget = 1200         # units per arm, instance, evaluated step and estimator
  config.small.horizon = 30          # steps per rollout, every side
  config.small.num_action_samples = 4
  config.small.estimator = "k1"

  config.plot = True
  config.output_dir = "results/transfer_estimators"
  return config
