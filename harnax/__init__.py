"""harnax: agent harnesses as interfaces, in JAX.

The public API is this list. Numerical functions take one problem; batch them
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

from harnax.core.bellman import action_scores
from harnax.core.bellman import hard_bellman_operator
from harnax.core.bellman import kl_between
from harnax.core.bellman import q_values
from harnax.core.bellman import soft_bellman_operator
from harnax.core.bellman import soft_policy
from harnax.core.evaluation import PolicyEvaluation
from harnax.core.evaluation import evaluate_policy
from harnax.core.evaluation import occupancy
from harnax.core.generators import chain_mdp
from harnax.core.generators import gridworld_5x5
from harnax.core.generators import random_dense_mdp
from harnax.core.generators import random_deterministic_mdp
from harnax.core.generators import random_policy
from harnax.core.generators import random_reference
from harnax.core.generators import random_sparse_mdp
from harnax.core.generators import uniform_reference
from harnax.core.gradients import analytic_policy_gradient
from harnax.core.gradients import policy_gradient
from harnax.core.gradients import policy_gradient_theorem
from harnax.core.gradients import softmax_policy
from harnax.core.gradients import softmax_policy_gradient
from harnax.core.mdp import SparseTabularMDP
from harnax.core.mdp import TabularMDP
from harnax.core.mdp import stack
from harnax.core.mdp import to_dense
from harnax.core.mdp import to_sparse
from harnax.core.objectives import ceiling
from harnax.core.objectives import centered_scores
from harnax.core.objectives import mismatch
from harnax.core.objectives import mismatch_per_state
from harnax.core.objectives import regularized_return
from harnax.core.sampling import Rollout
from harnax.core.sampling import absorbing_states
from harnax.core.sampling import reset
from harnax.core.sampling import rollout
from harnax.core.sampling import step
from harnax.core.solvers import HardBellmanSolution
from harnax.core.solvers import SoftBellmanSolution
from harnax.core.solvers import solve_hard_bellman
from harnax.core.solvers import solve_soft_bellman

__version__ = "0.1.0"

__all__ = [
    "action_scores",
    "hard_bellman_operator",
    "kl_between",
    "q_values",
    "soft_bellman_operator",
    "soft_policy",
    "PolicyEvaluation",
    "evaluate_policy",
    "occupancy",
    "chain_mdp",
    "gridworld_5x5",
    "random_dense_mdp",
    "random_deterministic_mdp",
    "random_policy",
    "random_reference",
    "random_sparse_mdp",
    "uniform_reference",
    "analytic_policy_gradient",
    "policy_gradient",
    "policy_gradient_theorem",
    "softmax_policy",
    "softmax_policy_gradient",
    "SparseTabularMDP",
    "TabularMDP",
    "stack",
    "to_dense",
    "to_sparse",
    "ceiling",
    "centered_scores",
    "mismatch",
    "mismatch_per_state",
    "regularized_return",
    "Rollout",
    "absorbing_states",
    "reset",
    "rollout",
    "step",
    "HardBellmanSolution",
    "SoftBellmanSolution",
    "solve_hard_bellman",
    "solve_soft_bellman",
]
