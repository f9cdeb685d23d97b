"""Config of scripts/proxy_validation.py: the proxy-optimum method validated on MiniWoB++.

  python scripts/proxy_validation.py --config=configs/proxy_validation.py \
      --config.num_seeds=50 --config.families='("click-option",)'

The default runs in a few minutes on 2 CPU cores. Cost scales linearly in the number of
families, seeds, proxies x access modes (each draws its own episodes) and episodes per
instance; category maps reuse the same episodes. Training (the frozen H0 model and the
`trained:k` proxies, k steps on each of the six harnesses) is exact and grows with
`num_train` and k. For tighter recovery rates raise `num_seeds` (the rates are means over
family x seed, so their standard error is about sqrt(r (1 - r) / (families x seeds))).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.num_train = 6             # training instances (the frozen H0 model, trained proxies)
  config.num_test = 4              # held-out instances the harnesses are ranked on
  config.split_seed = 0
  config.discount = 0.9
  config.tau = 0.1
  config.steps = 100               # exact-gradient steps of the frozen policy on H0
  config.learning_rate = 0.1
  # Proxy quality, best first: the exact soft optimum, pi* mixed with the uniform reference,
  # and log-linear models trained k steps on each harness's own training instances.
  config.proxies = ("optimal", "mix:0.25", "mix:0.5", "mix:0.75", "mix:1.0", "trained:100")
  config.category_maps = ("coarse", "action")   # common categories, or the actions themselves
  config.proxy_access = ("samples", "probs")    # proxy samples, or its exact distribution
  config.num_seeds = 10
  config.episodes_per_instance = 10             # the frozen policy's episodes (for M~)
  config.proxy_episodes_per_instance = 10       # the proxy's episodes (for C~)
  config.policy_samples = 8                     # samples per decision (first one executed)
  config.proxy_samples = 8
  config.horizon = 40                           # decisions at most (gamma^40 = 1.5 %)
  config.smoothing = 0.25                       # alpha of the proxy's smoothed frequencies
  config.plot = True
  config.output_dir = "results/proxy_validation"
  return config
