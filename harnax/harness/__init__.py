"""Harnesses as interfaces: encode / decode / execute, semantic aggregation, readout.

Depends on `harnax.core` only. The tabular form (`TabularHarness`) is what the
numerical code uses; `Interface` is the same three functions in general.
Derivations: docs/harness.md.
"""

from harnax.harness.aggregation import INVALID_MODES
from harnax.harness.aggregation import aggregate_log_probs
from harnax.harness.aggregation import aggregate_probs
from harnax.harness.aggregation import segment_logsumexp
from harnax.harness.aggregation import semantic_log_policy
from harnax.harness.aggregation import semantic_policy
from harnax.harness.interface import INVALID
from harnax.harness.interface import FieldEncoder
from harnax.harness.interface import Interface
from harnax.harness.interface import TabularHarness
from harnax.harness.interface import as_interface
from harnax.harness.interface import check_decode_table
from harnax.harness.interface import decode_table_from
from harnax.harness.interface import encode_fields
from harnax.harness.readout import DecompositionNorms
from harnax.harness.readout import TransferDecomposition
from harnax.harness.readout import check_action_map
from harnax.harness.readout import common_actions
from harnax.harness.readout import decision_flips
from harnax.harness.readout import decomposition_norms
from harnax.harness.readout import harness_transfer_decomposition
from harnax.harness.readout import identity_action_map
from harnax.harness.readout import match_actions
from harnax.harness.readout import readout_scores
from harnax.harness.readout import score_error
from harnax.harness.readout import transfer_decomposition
from harnax.harness.swap import SwapAnalysis
from harnax.harness.swap import SwapPair
from harnax.harness.swap import swap_analysis
from harnax.harness.swap import swap_pair
from harnax.harness.swap import swap_table
from harnax.harness.swap import swap_threshold

__all__ = [
    "INVALID_MODES",
    "aggregate_log_probs",
    "aggregate_probs",
    "segment_logsumexp",
    "semantic_log_policy",
    "semantic_policy",
    "INVALID",
    "FieldEncoder",
    "Interface",
    "TabularHarness",
    "as_interface",
    "check_decode_table",
    "decode_table_from",
    "encode_fields",
    "DecompositionNorms",
    "TransferDecomposition",
    "check_action_map",
    "common_actions",
    "decision_flips",
    "decomposition_norms",
    "harness_transfer_decomposition",
    "identity_action_map",
    "match_actions",
    "readout_scores",
    "score_error",
    "transfer_decomposition",
    "SwapAnalysis",
    "SwapPair",
    "swap_analysis",
    "swap_pair",
    "swap_table",
    "swap_threshold",
]
