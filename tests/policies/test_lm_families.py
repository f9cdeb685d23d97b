"""The LM policy's candidate scoring on the hybrid and KV-shared families.

Qwen3.5 cannot run the prefix-tree forward (its recurrent layers read one sequence in order),
so its candidates are scored from per-candidate copies of a prompt cache; Gemma 4's KV-shared
layers have no cache entry of their own (`None` in `Cache.layers`). The reference for both is
independent: one plain, unpadded forward of each (prompt + candidate) sequence, its log-softmax
taken in float64 NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from harnax import models
from harnax.policies import lm

V = 48
TOL = 2e-4  # float32 model; observed ~1e-6


def qwen3_5_model():
  cfg = transformers.Qwen3_5TextConfig(
      vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
      linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
      max_position_embeddings=64, num_hidden_layers=3,
      layer_types=["linear_attention", "full_attention", "linear_attention"],
      rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                       "partial_rotary_factor": 0.5})
  return models.from_config(models.config_from_hf_dict(cfg.to_dict()), seed=3)


def gemma4_model():
  rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                             "rope_theta": 1000.0}}
  s, f = "sliding_attention", "full_attention"
  cfg = transformers.Gemma4TextConfig(
      vocab_size=V, hidden_size=32, intermediate_size=24, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, global_head_dim=16, sliding_window=4,
      max_position_embeddings=64, num_hidden_layers=5, layer_types=[s, s, f, s, f],
      num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=6,
      vocab_size_per_layer_input=V, final_logit_softcapping=3.0, rope_parameters=rope,
      tie_word_embeddings=True)
  return models.from_config(models.config_from_hf_dict(cfg.to_dict()), seed=4)


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def model(request):
  return {"qwen3_5": qwen3_5_model, "gemma4": gemma4_model}[request.param]()


def tokens_with_shared_prefixes(seed=0, r=3, o=4, tp=7, tc=3):
  """Left-padded prompts; candidates that share prefixes, of different lengths, one absent."""
  rng = np.random.default_rng(seed)
  pm = np.ones((r, tp), bool)
  pm[0, :3] = False
  pm[2, :tp - 1] = False                    # a one-token prompt
  ids = rng.integers(1, V, (r, o, tc))
  ids[:, 1, 0] = ids[:, 0, 0]               # candidates 0 and 1 share their first token
  ids[:, 2, :2] = ids[:, 0, :2]             # candidates 0 and 2 share two tokens
  om = np.ones((r, o, tc), bool)
  om[:, 1, 2:] = False
  om[:, 3, 1:] = False                      # a one-token candidate
  om[1, 3] = False                          # a padding candidate
  return lm.CandidateTokens(prompt_ids=rng.integers(1, V, (r, tp)), prompt_mask=pm,
                            output_ids=ids, output_mask=om)


def reference_scores(model, tokens):
  """log p(candidate | prompt) from a plain forward of each (prompt + candidate) sequence.

  Every sequence is followed by filler tokens up to one common length and run without a mask
  (one batch, one compilation): causal attention makes the filler invisible to the scored
  positions.
  """
  r, o, tc = tokens.output_ids.shape
  length = tokens.prompt_ids.shape[1] + tc
  seqs, spans = [], []
  for i in range(r):
    prompt = np.asarray(tokens.prompt_ids[i])[np.asarray(tokens.prompt_mask[i])]
    for j in range(o):
      cand = np.asarray(tokens.output_ids[i, j])[np.asarray(tokens.output_mask[i, j])]
      seq = np.concatenate([prompt, cand])
      seqs.append(np.pad(seq, (0, length - len(seq)), constant_values=1))
      spans.append((i, j, len(prompt), cand))
  logits = np.asarray(jax.jit(lambda ids: model(ids))(jnp.asarray(np.stack(seqs))), np.float64)
  out = np.full((r, o), lm.ABSENT)
  for row, (i, j, start, cand) in zip(logits, spans):
    if not len(cand):
      continue
    top = row.max(-1, keepdims=True)
    logp = row - top - np.log(np.sum(np.exp(row - top), -1, keepdims=True))
    pred = logp[start - 1:start - 1 + len(cand)]
    out[i, j] = np.sum(pred[np.arange(len(cand)), cand])
  return out


@pytest.fixture(scope="module")
def reference(model):
  return reference_scores(model, tokens_with_shared_prefixes())


def test_capability_flag_decides_the_scoring_path(model):
  tree_ok = lm.supports_tree(model)
  assert tree_ok == (not isinstance(model.config, models.Qwen35Config))
  if not tree_ok:  # the flag is right: the tree forward would fail (the tree scorer runs below)
    tree = lm.pack_candidates(tokens_with_shared_prefixes())
    with pytest.raises(NotImplementedError, match="tree"):
      model.tree_hidden_states(tree.prompt_ids, tree.prompt_mask, tree.node_ids,
                               tree.node_mask, tree.node_path)


@pytest.mark.parametrize("method", ["tree", "cache"])
def test_policy_log_probs_equal_per_candidate_sequence_log_probs(model, reference, method):
  tokens = tokens_with_shared_prefixes()
  ref = reference
  score_fn, params = lm.split_model(model, method=method)
  given = lm.as_tree(tokens) if method == "tree" else tokens
  # micro_batch 2 of 3 rows: a padding row (one-token prompt, no candidate) rides along.
  out = np.asarray(lm.score_in_chunks(score_fn, params, given, micro_batch=2))
  real = np.asarray(tokens.candidate_mask)
  assert np.all(out[~real] == lm.ABSENT)
  np.testing.assert_allclose(out[real], ref[real], atol=TOL, rtol=0)
  # Not the uniform distribution: the comparison would be vacuous.
  assert np.ptp(ref[real]) > 0.1


def test_semantic_policy_runs_on_both_families(model, reference):
  tokens = tokens_with_shared_prefixes()
  table = np.tile(np.array([0, 1, 0, 2]), (3, 1))
  pi = np.asarray(lm.semantic_policy(model, tokens, table, num_actions=3, invalid="noop",
                                     noop_action=2, micro_batch=2))
  assert pi.shape == (3, 3)
  np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-5)
  ref = np.exp(reference)
  np.testing.assert_allclose(pi[:, 1], ref[:, 1], atol=TOL)
