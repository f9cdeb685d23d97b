"""Training (optax): exact policy-gradient ascent on returns computed without sampling, SFT,
distillation losses (`distill`, HAD's pairs in `had`, the baselines' weights and turn mixing in
`opd`), the distillation step and loop (`distill_loop`), and batched agent rollouts in text games
(`rollouts`).

Depends on everything below it: `harnax.core` (exact evaluation), `harnax.harness`,
`harnax.envs`, `harnax.policies`.
"""

from harnax.train import distill
from harnax.train import distill_loop
from harnax.train import had
from harnax.train import opd
from harnax.train import rollouts
from harnax.train.exact_pg import FitResult
from harnax.train.exact_pg import adam
from harnax.train.exact_pg import fit
from harnax.train.exact_pg import fit_log_linear
from harnax.train.loop import TrainResult
from harnax.train.loop import check_config
from harnax.train.loop import checkpoint_steps
from harnax.train.loop import default_config
from harnax.train.loop import initialize_distributed
from harnax.train.loop import make_optimizer
from harnax.train.loop import make_schedule
from harnax.train.loop import restore_params
from harnax.train.loop import train
from harnax.train.lora import init_lora
from harnax.train.lora import merge_lora
from harnax.train.sft import SFTData
from harnax.train.sft import SFTResult
from harnax.train.sft import encode_examples
from harnax.train.sft import sft_loss
from harnax.train.sft import train_sft

__all__ = [
    "distill",
    "distill_loop",
    "had",
    "opd",
    "rollouts",
    "FitResult",
    "adam",
    "fit",
    "fit_log_linear",
    "TrainResult",
    "check_config",
    "checkpoint_steps",
    "default_config",
    "initialize_distributed",
    "init_lora",
    "make_optimizer",
    "make_schedule",
    "merge_lora",
    "restore_params",
    "train",
    "SFTData",
    "SFTResult",
    "encode_examples",
    "sft_loss",
    "train_sft",
]
