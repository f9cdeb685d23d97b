"""Policies seen through a harness: models that score every candidate output of a state.

`log_linear` is a log-linear model over features of the encoded observation text, the
cheap policy family of the studies. Depends on `harnax.harness` (aggregation of output
probabilities into a semantic policy).
"""

from harnax.policies import log_linear
from harnax.policies.log_linear import harness_semantic_policy
from harnax.policies.log_linear import output_log_probs
from harnax.policies.log_linear import semantic_log_policy
from harnax.policies.log_linear import semantic_policy

__all__ = [
    "log_linear",
    "harness_semantic_policy",
    "output_log_probs",
    "semantic_log_policy",
    "semantic_policy",
]
