"""A one-layer Qwen3 of a given width over a given tokenizer, for the distillation tests."""

import jax

from harnax import models


def tiny_qwen3(tok, hidden: int, seed: int, dtype=jax.numpy.float32):
  """A 1-layer, 2-head Qwen3 of width ``hidden`` over ``tok``'s vocabulary and special ids."""
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": tok.vocab_size, "hidden_size": hidden,
      "intermediate_size": 2 * hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 2048,
      "tie_word_embeddings": True, "eos_token_id": tok.eos_token_id,
      "pad_token_id": tok.pad_token_id})
  return models.from_config(cfg, seed=seed, param_dtype=dtype)
