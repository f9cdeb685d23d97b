"""Full-size configs (published config.json values) cost nothing under jax.eval_shape; config
validation names the offending field."""

import jax.numpy as jnp
import pytest

from harnax import models

QWEN3_COMMON = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936,
                    head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000, hidden_act="silu",
                    max_position_embeddings=40960, attention_bias=False, use_sliding_window=False,
                    sliding_window=None, max_window_layers=28, bos_token_id=151643,
                    eos_token_id=151645)
QWEN3_0_6B = dict(QWEN3_COMMON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)
QWEN3_1_7B = dict(QWEN3_COMMON, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)
QWEN3_8B = dict(QWEN3_COMMON, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
QWEN3_30B_A3B = dict(QWEN3_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                     hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                     max_window_layers=48)
GEMMA3_COMMON = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                     head_dim=256, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, rope_local_base_freq=10000.0,
                     sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
                     final_logit_softcapping=None, attn_logit_softcapping=None,
                     max_position_embeddings=131072, bos_token_id=2, eos_token_id=1,
                     pad_token_id=0)
GEMMA3_1B = dict(GEMMA3_COMMON, vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                 num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                 sliding_window=512, rope_scaling=None, max_position_embeddings=32768)
GEMMA3_4B = dict(GEMMA3_COMMON, vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                 num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                 sliding_window=1024, rope_scaling={"rope_type": "linear", "factor": 8.0})
GEMMA3_12B = dict(GEMMA3_COMMON, vocab_size=262208, hidden_size=3840, intermediate_size=15360,
                  num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                  sliding_window=1024, rope_scaling={"rope_type": "linear", "factor": 8.0})

# Published totals (model cards): Qwen3 0.6B/1.7B/8.2B/30.5B; Gemma 3 1B (999,885,952), and the
# language-model part of 4B/12B (the 4.3B/12.2B totals include a ~0.42B SigLIP vision tower).
PUBLISHED = [
    ("qwen3-0.6b", QWEN3_0_6B, 0.6e9, 0.02),
    ("qwen3-1.7b", QWEN3_1_7B, 1.7e9, 0.02),
    ("qwen3-8b", QWEN3_8B, 8.2e9, 0.02),
    ("qwen3-30b-a3b", QWEN3_30B_A3B, 30.5e9, 0.02),
    ("gemma3-1b", GEMMA3_1B, 999_885_952, 0.001),
    ("gemma3-4b", GEMMA3_4B, 4.3e9 - 0.42e9, 0.03),
    ("gemma3-12b", GEMMA3_12B, 12.2e9 - 0.42e9, 0.03),
]


@pytest.mark.parametrize("name,config,published,rel", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_full_size_shapes_and_param_counts(name, config, published, rel):
  cfg = models.config_from_hf_dict(config)
  abstract = models.abstract_model(cfg, param_dtype=jnp.bfloat16)
  count = models.param_count(abstract)
  assert abs(count - published) / published < rel, (name, count)
  ids = jnp.zeros((2, 7), jnp.int32)
  from flax import nnx
  import jax
  graphdef, state = nnx.split(abstract)
  logits = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state, ids)
  assert logits.shape == (2, 7, cfg.vocab_size) and logits.dtype == jnp.float32


def test_qwen3_30b_a3b_active_parameters():
  cfg = models.config_from_hf_dict(QWEN3_30B_A3B)
  total = models.param_count(models.abstract_model(cfg))
  per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
  inactive = cfg.num_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
  assert abs((total - inactive) - 3.3e9) / 3.3e9 < 0.03  # "30.5B total, 3.3B activated"


def test_gemma3_layer_pattern_and_rope_bases():
  cfg = models.config_from_hf_dict(GEMMA3_4B)
  assert cfg.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
  assert cfg.rope_for("sliding_attention").theta == 10000.0
  full = cfg.rope_for("full_attention")
  assert (full.theta, full.rope_type, full.factor) == (1000000.0, "linear", 8.0)
  # Round trip through the transformers-5 layout keeps the per-type RoPE.
  again = models.config_from_hf_dict(cfg.to_hf_dict())
  assert again.rope == cfg.rope and again.layer_types == cfg.layer_types


def test_moe_layer_selection():
  cfg = models.config_from_hf_dict(dict(QWEN3_30B_A3B, num_hidden_layers=6,
                                        decoder_sparse_step=2, mlp_only_layers=[3]))
  assert cfg.mlp_kinds == ("dense", "moe", "dense", "dense", "dense", "moe")


@pytest.mark.parametrize("change,match", [
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(hidden_act="relu"), "hidden_act"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (dict(rope_theta=-1.0), "rope_theta"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
    (dict(rope_scaling={"rope_type": "linear"}), "factor"),
    (dict(head_dim=15), "head_dim"),
    (dict(layer_types=["full_attention"]), "layer_types"),
    (dict(use_sliding_window=True, sliding_window=0, max_window_layers=0), "sliding_window"),
])
def test_qwen3_config_field_out_of_range(change, match):
  with pytest.raises(ValueError, match=match):
    models.config_from_hf_dict(dict(QWEN3_0_6B, **change))


@pytest.mark.parametrize("change,match", [
    (dict(num_experts_per_tok=200), "num_experts_per_tok"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size"),
    (dict(mlp_only_layers=[48]), "mlp_only_layers"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step"),
])
def test_moe_config_field_out_of_range(change, match):
  with pytest.raises(ValueError, match=match):
    models.config_from_hf_dict(dict(QWEN3_30B_A3B, **change))


def test_gemma3_config_field_out_of_range():
  with pytest.raises(ValueError, match="sliding_window"):
    models.config_from_hf_dict(dict(GEMMA3_1B, sliding_window=None))
  with pytest.raises(ValueError, match="use_bidirectional_attention"):
    models.config_from_hf_dict(dict(GEMMA3_1B, use_bidirectional_attention=True))


def test_unsupported_architecture():
  with pytest.raises(ValueError, match="LlamaForCausalLM.*supported"):
    models.config_from_hf_dict(dict(QWEN3_0_6B, architectures=["LlamaForCausalLM"],
                                    model_type="llama"))
  with pytest.raises(ValueError, match="unsupported architecture"):
    models.config_from_hf_dict({"model_type": "gemma3"})  # no architectures: ambiguous


def test_load_pretrained_rejects_unsupported_architecture(tmp_path):
  import json
  (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
  with pytest.raises(ValueError, match="MambaForCausalLM"):
    models.load_pretrained(str(tmp_path))
