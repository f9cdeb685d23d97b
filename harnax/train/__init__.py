"""Training loops (optax): exact policy-gradient ascent on returns computed without sampling.

Depends on everything below it: `harnax.core` (exact evaluation), `harnax.harness`,
`harnax.policies`.
"""

from harnax.train.exact_pg import FitResult
from harnax.train.exact_pg import adam
from harnax.train.exact_pg import fit
from harnax.train.exact_pg import fit_log_linear

__all__ = [
    "FitResult",
    "adam",
    "fit",
    "fit_log_linear",
]
