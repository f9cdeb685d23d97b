"""Environments: task families as exact finite MDPs under harnesses.

`harnax.envs.checkbox` is a toy family (three harnesses of one checkbox task);
`harnax.envs.miniwob` compiles MiniWoB++ task instances under harnesses H0–H5 to
`TabularHarness`. Docs: docs/harnesses.md.

Importing this package registers one gymnasium environment per (family,
harness), `harnax/<family>-<harness>-v0` for the families
click-checkboxes, click-option, click-tab-2 and harnesses H0–H5 (18 ids,
`ENV_IDS`), truncated after `MAX_EPISODE_STEPS` steps:

  import gymnasium, harnax.envs
  env = gymnasium.make("harnax/click-checkboxes-H1-v0", split="test")

Spaces, info and options: `harnax.envs.miniwob.gym_env`. To step a compiled MDP
in JAX for many environments at once, use `hx.reset`, `hx.step` and `hx.rollout`
(`harnax.core.sampling`).
"""

from harnax.envs import checkbox
from harnax.envs import miniwob
from harnax.envs.miniwob import gym_env
from harnax.envs.miniwob.gym_env import ENV_IDS
from harnax.envs.miniwob.gym_env import MAX_EPISODE_STEPS
from harnax.envs.miniwob.gym_env import MiniWoBEnv
from harnax.envs.miniwob.gym_env import env_id
from harnax.envs.miniwob.gym_env import register_envs

register_envs()

__all__ = [
    "checkbox",
    "miniwob",
    "gym_env",
    "ENV_IDS",
    "MAX_EPISODE_STEPS",
    "MiniWoBEnv",
    "env_id",
    "register_envs",
]
