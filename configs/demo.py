"""`make demo`: the harness-transfer study with a language model, small enough for a laptop.

A tiny Qwen3-architecture base model (tokenizer trained here, pre-trained on H0 transcripts;
`configs/base_model.py`) is post-trained by exact policy gradient on each MiniWoB++ harness
H0–H5, every checkpoint read through every harness, the swaps adapted; the log-linear text
model runs the same protocol. About 10 minutes on 2 CPU cores.

  python scripts/demo.py --config=configs/demo.py
  # a bigger run: more instances, a checkpoint directory instead of the built model
  python scripts/demo.py --config=configs/demo.py --config.num_train=12 \\
      --config.model_dir=/path/to/Qwen3-0.6B --config.lm.micro_batch=8
"""

import importlib.util
import os

import ml_collections


def _base_model_config():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base_model.py")
  spec = importlib.util.spec_from_file_location("base_model_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.harnesses = ("H0", "H1", "H2", "H3", "H4", "H5")
  # Swaps to adapt along: "select" is the harness-transfer study's rule (of all 30 ordered
  # pairs, those the frozen comparison rejects while T = ΔC + M_H(π) > 0), at most max_swaps
  # of them (largest T first) to keep the demo's LM work as it was; "given": `swaps`, each
  # addition alone and into the full H5.
  config.swap_rule = "select"
  config.max_swaps = 9
  config.swaps = (("H0", "H1"), ("H0", "H2"), ("H0", "H3"), ("H0", "H4"), ("H0", "H5"),
                  ("H1", "H5"), ("H2", "H5"), ("H3", "H5"), ("H4", "H5"))
  config.num_train = 2         # training instances per family (post-training)
  config.num_test = 2          # held-out instances (evaluation only)
  config.split_seed = 0
  config.discount = 0.9
  config.tau = 0.1
  config.pi_ref = "uniform"    # or "base": the base model's own semantic policy per harness
  config.policies = ("lm", "log_linear")
  # Source harnesses whose swaps get the continued-training control (the paper's: H0,
  # against adapting to H1); None: every source.
  config.controls = ("H0",)

  config.lm = ml_collections.ConfigDict()
  # Exact policy-gradient steps per harness, and along a swap (also the budget of the
  # continued-training control). Each step scores every candidate of every state twice and
  # backpropagates once: a few seconds on 2 CPU cores for click-checkboxes.
  config.lm.steps = 4
  config.lm.adapt_steps = 2
  config.lm.learning_rate = 3e-4  # Adam; 1e-3 overshoots on the first step (docs/lm_policy.md)
  # States per model micro-batch: bounds memory; 8 is also the fastest on 2 CPU cores
  # (benchmarks/results/lm_policy_gradient.md).
  config.lm.micro_batch = 8
  # Every post-training run goes through harnax.train (docs/training.md): fields here override
  # its defaults (optimizer, schedule, grad_clip_norm, finetune="lora", compute_dtype, ...).
  config.lm.train = ml_collections.ConfigDict({"grad_clip_norm": 1.0})
  # Keep each run's metrics.jsonl (J, success within 20 steps, grad norm per step) and its
  # checkpoints under <output_dir>/runs/<family>/<run>; a rerun resumes them.
  config.lm.keep_runs = True

  config.log_linear = ml_collections.ConfigDict()
  config.log_linear.steps = 200
  config.log_linear.adapt_steps = 100
  config.log_linear.learning_rate = 0.1

  # The base model: built into base_model_dir (reused when the config is unchanged), or
  # model_dir: any Hugging Face checkpoint directory (Qwen3, Qwen3-MoE, Gemma 3) instead.
  config.base_model = _base_model_config()
  # Pre-training pool: 48 instances per family from seeds 1000, ... (the study checks that
  # none is one of its held-out instances); the readout has to generalize to new pages.
  config.base_model.num_train = 48
  config.base_model.num_test = 0
  config.base_model.split_seed = 1000
  config.base_model.sft.num_steps = 1500
  config.base_model_dir = "results/base_model"
  config.model_dir = ""
  config.output_dir = "results/demo"
  return config
