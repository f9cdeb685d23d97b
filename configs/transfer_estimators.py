"""Config of scripts/transfer_estimators.py: the estimator comparisons of the harness-transfer study.

  python scripts/transfer_estimators.py --config=configs/transfer_estimators.py

The default runs in a few minutes on 2 CPU cores. To scale: more held-out instances
(`num_test`: the pooled estimates average over them), more seeds (`large.num_seeds`,
`small.num_seeds`: the error and call statistics tighten like 1/sqrt(seeds)), longer
adaptation (`adapt_steps`) evaluated more often (`eval_every`), and larger budgets
(`small.budget`, `large.num_states`). Cost grows linearly in each; the seeds run one after
another (`jax.lax.map`), everything inside one seed is vmapped.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.harnesses = ("H0", "H1", "H2", "H3", "H4", "H5")   # every ordered pair (finding 1)
  config.num_train = 6         # training instances per family (seeds split_seed, ...)
  config.num_test = 4          # held-out instances: every estimate is on these
  config.split_seed = 0
  config.discount = 0.9
  config.tau = 0.1
  config.learning_rate = 0.1
  config.steps = 150           # exact policy-gradient (Adam) steps training each checkpoint
  config.adapt_steps = 60      # steps of the two adaptation runs from the H0 checkpoint
  config.eval_every = 5        # evaluate both estimators every this many adaptation steps
  config.seed = 0
  config.confidence = 0.9      # bootstrap intervals
  config.num_resamples = 500

  config.large = ml_collections.ConfigDict()   # finding 1: frozen deployment, C' - M_hat'
  config.large.num_seeds = 20
  config.large.num_states = 200      # states from d^pi (geometric stopping) per instance
  config.large.num_action_samples = 8
  config.large.estimator = "miller_madow"   # the frequency (plug-in) KL, bias-corrected
  config.large.max_steps = 200       # rollout cap: total-variation bias <= 0.9^200

  config.small = ml_collections.ConfigDict()   # finding 2: equal budgets along adaptation
  config.small.num_seeds = 100
  config.small.budget = 1200         # units per arm, instance and evaluated step
  config.small.horizon = 30          # steps per rollout, both sides
  config.small.num_action_samples = 2
  config.small.estimator = "k3"

  config.plot = True
  config.output_dir = "results/transfer_estimators"
  return config
