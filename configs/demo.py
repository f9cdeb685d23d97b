"""The built-in default experiment of `make demo`: ceiling, mismatch and return
on a batch of random MDPs, and the three solvers side by side."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.num_mdps = 64          # batch size (vmapped)
  config.num_states = 64
  config.num_actions = 8
  config.discount = 0.99
  config.tau = 0.1
  config.unavailable_fraction = 0.25  # share of actions pi_ref marks unavailable
  # float32 with |V| ~ 70 at gamma = 0.99 certifies down to ~1e-5 (docs/theory.md).
  config.tol = 1e-4
  config.policy_temperatures = (0.3, 1.0, 3.0)  # random softmax policies of growing entropy
  config.output_dir = "results/demo"
  return config
