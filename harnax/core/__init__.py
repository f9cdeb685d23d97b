"""Exact tabular core: MDPs, soft-Bellman solvers, evaluation, ceiling/mismatch, gradients.

Also the pieces the upper layers share: sampling of an MDP (`reset`, `step`,
`rollout`) and input checks (`validation`). The validated pytree containers
(`harnax.pytree`) sit below every layer, models included.
"""

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
