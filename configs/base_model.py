"""Config of harnax.studies.base_model: the pre-trained checkpoint the harness-transfer study
post-trains (a tiny Qwen3 with a locally trained tokenizer, SFT on H0 transcripts).

  from harnax.studies import base_model
  base_model.build_base_model(get_config(), "results/base_model")

`get_config("micro")` (or `--config=configs/base_model.py:micro`) is a much smaller build for
tests (~10-20 s on 2 cores); the default builds in well under 2 minutes.
"""

import ml_collections


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Task instances: the training split of configs/miniwob_study.py (same families, counts and
  # split seed), so the study's held-out instances never reach the base model.
  config.families = ("click-checkboxes", "click-option", "click-tab-2")
  config.num_train = 12        # training instances per family: task_split(...)[0]
  config.num_test = 6          # held-out instances (only to draw the same split; never read)
  config.split_seed = 0
  config.discount = 0.9
  config.seed = 0              # episodes, batch order and initial weights

  # Tokenizer: byte-level BPE trained on every observation (all harnesses, both field
  # orders) and every candidate output of the training instances.
  config.tokenizer = ml_collections.ConfigDict()
  config.tokenizer.vocab_size = 512
  config.tokenizer.min_frequency = 2

  # Model: Qwen3 architecture (harnax.models.Qwen3Config); vocab = the tokenizer's size.
  config.model = ml_collections.ConfigDict()
  config.model.hidden_size = 64
  config.model.num_layers = 2
  config.model.num_heads = 4
  config.model.num_kv_heads = 2
  config.model.head_dim = 16
  config.model.intermediate_size = 128
  config.model.rope_theta = 10000.0
  config.model.max_position_embeddings = 1024
  config.model.tie_word_embeddings = True
  config.model.init_std = 0.16   # initial weights (Qwen's 0.02 is for wide models)

  # Transcripts: episodes of the soft-optimal H0 policy at temperature reference_tau, with
  # epsilon-uniform exploration in the executed actions so that off-path states appear; each
  # visited state is one example whose output is a draw of the reference policy there.
  config.reference_tau = 0.02
  config.explore_epsilon = 0.3
  config.episodes_per_instance = 16
  config.horizon = 8           # steps per episode (episodes end earlier at the done state)

  # Supervised next-token learning (harnax.train.train_sft, AdamW, cosine decay).
  config.sft = ml_collections.ConfigDict()
  config.sft.num_steps = 1000
  config.sft.batch_size = 8
  config.sft.learning_rate = 5e-3
  config.sft.warmup_steps = 20
  config.sft.weight_decay = 0.0
  config.sft.clip_norm = 1.0

  if variant == "micro":
    config.num_train = 4
    config.model.hidden_size = 32
    config.model.intermediate_size = 64
    config.model.head_dim = 8
    config.episodes_per_instance = 8
    config.sft.num_steps = 250
  elif variant != "default":
    raise ValueError(f"variant: expected 'default' or 'micro', got {variant!r}")
  return config
