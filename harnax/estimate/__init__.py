"""Deployment estimators: sample-based mismatch, the log-odds route, Monte-Carlo
returns, rank statistics and proxy-optimum estimates from logs.

Depends only on `harnax.core` (fixed-horizon rollouts are
`harnax.core.sampling.rollout`). Arguments follow the package rule: key first,
then the problem (`mdp, policy, pi_star, tau`) positional, options keyword-only.
Derivations, bias/variance facts and the proof of the log-odds bound:
docs/estimation.md.
"""

from harnax.estimate.agent_logs import ArgumentRule
from harnax.estimate.agent_logs import CategoryTable
from harnax.estimate.agent_logs import category_table
from harnax.estimate.agent_logs import estimate_transcripts
from harnax.estimate.agent_logs import read_transcripts
from harnax.estimate.bootstrap import SampleEstimate
from harnax.estimate.bootstrap import bootstrap_ci
from harnax.estimate.bootstrap import standard_error
from harnax.estimate.log_odds import centered_score_errors
from harnax.estimate.log_odds import empirical_log_odds
from harnax.estimate.log_odds import exact_bounds
from harnax.estimate.log_odds import mismatch_lower_bound
from harnax.estimate.log_odds import mismatch_upper_bound
from harnax.estimate.log_odds import pair_score_errors
from harnax.estimate.log_odds import pair_weights
from harnax.estimate.log_odds import score_error_range
from harnax.estimate.log_odds import weighted_pair_errors
from harnax.estimate.mismatch import ESTIMATORS
from harnax.estimate.mismatch import estimate_mismatch
from harnax.estimate.mismatch import every_step_mismatch
from harnax.estimate.mismatch import k1_kl
from harnax.estimate.mismatch import k3_kl
from harnax.estimate.mismatch import mismatch_estimator_variance
from harnax.estimate.mismatch import mismatch_from_state_kls
from harnax.estimate.mismatch import plugin_kl
from harnax.estimate.proxy import CODING_AGENT_CATEGORIES
from harnax.estimate.proxy import Episode
from harnax.estimate.proxy import HarnessEstimate
from harnax.estimate.proxy import LogError
from harnax.estimate.proxy import ParsedLogs
from harnax.estimate.proxy import Step
from harnax.estimate.proxy import coding_agent_category
from harnax.estimate.proxy import decision_kl
from harnax.estimate.proxy import proxy_estimates
from harnax.estimate.proxy import rank_harnesses
from harnax.estimate.proxy import read_episodes
from harnax.estimate.proxy import source_lines
from harnax.estimate.rank import average_ranks
from harnax.estimate.rank import kendall_tau_b
from harnax.estimate.rank import spearman
from harnax.estimate.returns import rollout_return
from harnax.estimate.sampling import GymOccupancySamples
from harnax.estimate.sampling import OccupancySamples
from harnax.estimate.sampling import sample_occupancy
from harnax.estimate.sampling import sample_occupancy_gym
from harnax.estimate.sampling import state_histogram
from harnax.estimate.sampling import total_variation

__all__ = [
    "ArgumentRule",
    "CategoryTable",
    "category_table",
    "estimate_transcripts",
    "read_transcripts",
    "SampleEstimate",
    "bootstrap_ci",
    "standard_error",
    "centered_score_errors",
    "empirical_log_odds",
    "exact_bounds",
    "mismatch_lower_bound",
    "mismatch_upper_bound",
    "pair_score_errors",
    "pair_weights",
    "score_error_range",
    "weighted_pair_errors",
    "ESTIMATORS",
    "estimate_mismatch",
    "every_step_mismatch",
    "k1_kl",
    "k3_kl",
    "mismatch_estimator_variance",
    "mismatch_from_state_kls",
    "plugin_kl",
    "CODING_AGENT_CATEGORIES",
    "Episode",
    "HarnessEstimate",
    "LogError",
    "ParsedLogs",
    "Step",
    "coding_agent_category",
    "decision_kl",
    "proxy_estimates",
    "rank_harnesses",
    "read_episodes",
    "source_lines",
    "average_ranks",
    "kendall_tau_b",
    "spearman",
    "rollout_return",
    "GymOccupancySamples",
    "OccupancySamples",
    "sample_occupancy",
    "sample_occupancy_gym",
    "state_histogram",
    "total_variation",
]
