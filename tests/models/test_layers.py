"""Shared layers against transformers' own building blocks."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from harnax.models import layers
from harnax.models.config import RopeConfig


@pytest.mark.parametrize("params", [
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
     "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "beta_fast": 16.0,
     "beta_slow": 2.0, "original_max_position_embeddings": 4096, "truncate": False},
])
def test_scaled_rope_frequencies_match_transformers(params):
  cfg = transformers.Qwen3Config(head_dim=128, max_position_embeddings=131072,
                                 rope_parameters=dict(params))
  ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg)
  ours, scale = layers.rope_frequencies(RopeConfig.from_hf(params, field="t"), head_dim=128)
  np.testing.assert_allclose(ours, ref_inv.numpy(), rtol=1e-6)
  assert scale == pytest.approx(ref_scale)


@pytest.mark.parametrize("style,module", [
    ("scale", transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm),
    ("one_plus_scale", transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm),
])
def test_rms_norm_conventions(style, module):
  rng = np.random.RandomState(0)
  x = rng.randn(2, 3, 8).astype(np.float32) * 3
  w = rng.randn(8).astype(np.float32)
  ref_mod = module(8, eps=1e-6)
  with torch.no_grad():
    ref_mod.weight.copy_(torch.tensor(w))
    ref = ref_mod(torch.tensor(x)).numpy()
  out = layers.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=1e-6, style=style)
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)
  # bf16 inputs are normalised in float32 and returned in bf16.
  out16 = layers.rms_norm(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w), eps=1e-6, style=style)
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out16, np.float32), ref, atol=0.1, rtol=0.02)


def test_attention_softcap_window_and_gqa_match_eager_kernel():
  from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward
  rng = np.random.RandomState(1)
  b, t, h, k, d = 2, 7, 4, 2, 8
  q, kk, v = (rng.randn(b, t, n, d).astype(np.float32) * 2 for n in (h, k, k))
  pos = np.tile(np.arange(t), (b, 1))
  valid = np.ones((b, t), bool)
  valid[1, :2] = False
  mask = np.asarray(layers.attention_mask(jnp.asarray(pos), jnp.asarray(pos), jnp.asarray(valid),
                                          window=3))
  module = torch.nn.Module()
  module.num_key_value_groups, module.head_dim, module.training = h // k, d, False
  additive = torch.tensor(np.where(mask, 0.0, -1e30)[:, None], dtype=torch.float32)
  ref, _ = eager_attention_forward(module, torch.tensor(q).transpose(1, 2),
                                   torch.tensor(kk).transpose(1, 2),
                                   torch.tensor(v).transpose(1, 2), additive, scaling=0.3,
                                   softcap=2.0)
  heads_major = lambda a: jnp.asarray(a).transpose(0, 2, 1, 3)  # [B, S, K, D] -> [B, K, S, D]
  out = layers.attend(jnp.asarray(q), heads_major(kk), heads_major(v), jnp.asarray(mask),
                      scale=0.3, softcap=2.0)
  rows = mask.any(-1)  # fully masked rows (padding queries) are unspecified in the reference
  np.testing.assert_allclose(np.asarray(out)[rows], ref.numpy()[rows], atol=1e-5)
  assert np.isfinite(np.asarray(out)).all()


def test_attention_over_key_blocks_matches_eager_kernel_on_the_concatenated_keys():
  """`attend_blocks` (one softmax over two key blocks, each with its own mask) against
  transformers' eager kernel over the concatenated keys, with GQA and a soft-cap."""
  from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward
  rng = np.random.RandomState(3)
  b, t, h, k, d, s1, s2 = 2, 5, 4, 2, 8, 6, 5
  q = rng.randn(b, t, h, d).astype(np.float32) * 2
  keys = [rng.randn(b, s, k, d).astype(np.float32) * 2 for s in (s1, s2)]
  vals = [rng.randn(b, s, k, d).astype(np.float32) for s in (s1, s2)]
  masks = [rng.rand(b, t, s) < 0.6 for s in (s1, s2)]
  masks[0][0, 1], masks[1][0, 1] = False, False  # a query with nothing visible
  masks[1][1, 2] = True  # and one that sees a whole block
  mask = np.concatenate(masks, -1)
  module = torch.nn.Module()
  module.num_key_value_groups, module.head_dim, module.training = h // k, d, False
  additive = torch.tensor(np.where(mask, 0.0, -1e30)[:, None], dtype=torch.float32)
  cat = lambda xs: torch.tensor(np.concatenate(xs, 1)).transpose(1, 2)
  ref, _ = eager_attention_forward(module, torch.tensor(q).transpose(1, 2), cat(keys),
                                   cat(vals), additive, scaling=0.3, softcap=2.0)
  heads_major = lambda a: jnp.asarray(a).transpose(0, 2, 1, 3)
  out = np.asarray(layers.attend_blocks(
      jnp.asarray(q), [(heads_major(kk), heads_major(vv), jnp.asarray(m))
                       for kk, vv, m in zip(keys, vals, masks)], scale=0.3, softcap=2.0))
  rows = mask.any(-1)
  np.testing.assert_allclose(out[rows], ref.numpy()[rows], atol=1e-5)
  assert np.isfinite(out).all()


def test_window_mask_semantics():
  pos = jnp.arange(6)[None]
  m = np.asarray(layers.attention_mask(pos, pos, jnp.ones((1, 6), bool), window=2))[0]
  assert m[5].tolist() == [False, False, False, False, True, True]  # q - k < window
  assert not m[2, 3]  # causal
