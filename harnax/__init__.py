"""harnax: agent harnesses as interfaces, in JAX.

The public API is `harnax.core`'s list (`harnax/core/__init__.py`), re-exported here
as `hx.<name>`. Numerical functions take one problem; batch them
with `jax.vmap` and shard them with a `jax.sharding.Mesh`. Subpackages:
`harnax.core` (exact tabular core), `harnax.harness` (interfaces, readout,
transfer decomposition, swap analysis), `harnax.estimate` (deployment estimators),
`harnax.envs` (task families under harnesses), `harnax.models` (Flax NNX LLM
ports), `harnax.policies` (models read through a harness), `harnax.train`
(optax loops), `harnax.studies` (experiment pipelines), `harnax.parallel`
(meshes, sharding). Each layer imports only the ones before it (tests/test_layering.py).

One argument rule, everywhere in core, harness and estimate:

* a random key (`jax.random` key, or a `numpy.random.Generator` for the Python
  samplers) comes first;
* then the problem, positional: the MDP (or harness), the policy, `pi_ref`,
  `tau` (for estimators also `pi_star`). `tau` is positional wherever it
  defines the regularized problem; it may still be passed by keyword;
* every option (sizes, sample counts, tolerances, methods, precomputed
  solutions) is keyword-only.

  hx.evaluate_policy(mdp, policy, pi_ref, tau, rtol=1e-6)
  hx.rollout(key, mdp, policy, num_envs=64, num_steps=100)
  estimate.estimate_mismatch(key, mdp, policy, pi_star, tau, num_states=256,
                             num_action_samples=8)
"""

from harnax import _xla_flags

# Before anything imports jax's CPU backend (README, "Known issues"); hence E402 below.
_xla_flags.apply_cpu_workarounds()

from harnax import core
from harnax.core import *  # noqa: F403  (the names of core.__all__, as hx.<name>)

__version__ = "0.1.0"

__all__ = list(core.__all__)
