"""C, M, J and the swap threshold T for a family of harnesses, exact and estimated.

  python scripts/harness_report.py --config=configs/harness_report.py \
      --config.estimate.num_states=512
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.family = "checkbox"        # the harness family (harnax.envs.checkbox)
  config.targets = ("alpha", "charlie")  # the task instance: boxes to check
  config.discount = 0.9
  config.tau = 0.5
  config.policy = "H0"              # deploy the model trained on this harness everywhere
  config.adapt = True               # also adapt every model to every other harness (swap table)

  config.train = ml_collections.ConfigDict()
  config.train.steps = 200          # Adam steps on the exact gradient (train.fit_log_linear)
  config.train.learning_rate = 0.5

  config.estimate = ml_collections.ConfigDict()
  config.estimate.num_states = 256            # states drawn from d^pi by geometric stopping
  config.estimate.num_action_samples = 16     # actions sampled per state through the harness
  config.estimate.estimators = ("miller_madow", "k3")
  config.estimate.num_rollouts = 256          # frequency-rollout baseline
  config.estimate.horizon = 60
  config.estimate.confidence = 0.9
  config.estimate.num_resamples = 1000

  config.output_dir = "results/harness_report"
  return config
