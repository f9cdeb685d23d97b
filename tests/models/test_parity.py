"""Logit parity with transformers on tiny random checkpoints, and the save round trip."""

import json
import os

from conftest import hf_logits
from conftest import padded_batch
from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from harnax import models

FAMILIES = ["qwen3", "qwen3_tied", "qwen3_swa", "qwen3_moe", "qwen3_moe_norm", "gemma3"]
# float32 end to end; observed errors are ~2e-6, the bound leaves room for op-order changes.
TOL = 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers_with_left_padding(pair_factory, name):
  pair = pair_factory(name)
  ids, mask = padded_batch()
  ref = hf_logits(pair.hf, ids, mask)
  out = np.asarray(models.forward(pair.model, jnp.asarray(ids), jnp.asarray(mask)))
  assert out.dtype == np.float32 and out.shape == ref.shape
  real = mask.astype(bool)
  np.testing.assert_array_less(np.abs(out - ref)[real].max(), TOL)


def test_prompt_exceeds_sliding_window_and_window_matters(pair_factory):
  pair = pair_factory("gemma3")
  cfg = pair.model.config
  ids, mask = padded_batch(length=11, pads=(0,))
  assert ids.shape[1] > 2 * cfg.sliding_window
  # Without the window the last logits would differ: the test would catch a missing window.
  no_window = models.CausalLM(cfg.replace(layer_types=("full_attention",) * cfg.num_layers,
                                          rope=tuple((t, cfg.rope_for("full_attention"))
                                                     for t in ("full_attention",))))
  nnx.update(no_window, nnx.state(pair.model))
  a = np.asarray(models.forward(pair.model, jnp.asarray(ids[:1])))
  b = np.asarray(models.forward(no_window, jnp.asarray(ids[:1])))
  assert np.abs(a[0, -1] - b[0, -1]).max() > 1e-3


def test_qwen3_sliding_window_layers(pair_factory):
  cfg = pair_factory("qwen3_swa").model.config
  assert cfg.layer_types == ("full_attention", "sliding_attention") and cfg.sliding_window == 4


def test_gemma_config_semantics(pair_factory):
  cfg = pair_factory("gemma3").model.config
  assert cfg.scale_embeddings and cfg.sandwich_norms and cfg.norm_style == "one_plus_scale"
  assert cfg.attention_scale == pytest.approx(24 ** -0.5)  # query_pre_attn_scalar, not head_dim
  assert cfg.rope_for("sliding_attention").theta == 50.0
  assert cfg.rope_for("full_attention").rope_type == "linear"
  assert cfg.final_logit_softcapping == 3.0


def test_tied_embeddings_are_one_array(pair_factory):
  pair = pair_factory("qwen3_tied")
  model = pair.model
  assert model.lm_head is None
  paths = [p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]
  assert not any("lm_head" in map(str, p) for p in paths)
  n_hf = sum(p.numel() for p in pair.hf.parameters())  # torch counts a tied tensor once
  assert models.param_count(model) == n_hf


@pytest.mark.parametrize("name", ["qwen3", "qwen3_tied", "qwen3_moe", "gemma3"])
def test_save_round_trip_through_transformers(pair_factory, tmp_path, name):
  pair = pair_factory(name)
  out_dir = str(tmp_path / "saved")
  models.save_pretrained(pair.model, out_dir)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
  ids, mask = padded_batch(seed=1)
  ref = hf_logits(pair.hf, ids, mask)
  again = hf_logits(reloaded, ids, mask)
  np.testing.assert_allclose(again, ref, atol=1e-6, rtol=0)
  # The exported tensors are exactly the originals.
  orig = dict(pair.hf.state_dict())
  for k, v in reloaded.state_dict().items():
    torch.testing.assert_close(v, orig[k], atol=0, rtol=0)


def test_sharded_save_and_load(pair_factory, tmp_path):
  pair = pair_factory("qwen3_moe")
  out_dir = str(tmp_path / "sharded")
  models.save_pretrained(pair.model, out_dir, max_shard_bytes=20_000)
  files = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
  assert len(files) > 2 and files[0].startswith("model-00001-of-")
  with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
    index = json.load(f)
  assert set(index["weight_map"].values()) == set(files)
  ids, mask = padded_batch(seed=2)
  ref = hf_logits(pair.hf, ids, mask)
  hf_again = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
  np.testing.assert_allclose(hf_logits(hf_again, ids, mask), ref, atol=1e-6, rtol=0)
  ours = models.load_pretrained(out_dir)
  out = np.asarray(models.forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_array_less(np.abs(out - ref)[mask.astype(bool)].max(), TOL)


def test_load_bfloat16_and_save_bfloat16(pair_factory, tmp_path):
  pair = pair_factory("qwen3")
  model = models.load_pretrained(pair.path, dtype=jnp.bfloat16)
  assert model.layers[0].attn.q_proj.kernel[...].dtype == jnp.bfloat16
  ids, mask = padded_batch(seed=3)
  logits = models.forward(model, jnp.asarray(ids), jnp.asarray(mask))
  assert logits.dtype == jnp.float32
  ref = hf_logits(pair.hf, ids, mask)
  # bf16 weights and activations: only a loose agreement is expected.
  assert np.abs(np.asarray(logits) - ref)[mask.astype(bool)].max() < 0.25
  out_dir = str(tmp_path / "bf16")
  models.save_pretrained(model, out_dir)
  hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
  assert next(hf_bf16.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("impl", ["ragged", "sorted", "dense", "gather"])
def test_every_moe_implementation_matches_transformers(pair_factory, impl):
  pair = pair_factory("qwen3_moe")
  model = models.load_pretrained(pair.path, moe_impl=impl)
  ids, mask = padded_batch(seed=11)
  ref = hf_logits(pair.hf, ids, mask)
  out = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_array_less(np.abs(out - ref)[mask.astype(bool)].max(), TOL)


def test_gemma3_multimodal_checkpoint_loads_its_language_model(tmp_path):
  """Gemma 3 4B+ ship as Gemma3ForConditionalGeneration: the text model loads, vision is skipped."""
  text = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
              layer_types=["sliding_attention", "full_attention"])
  vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, image_size=28, patch_size=14)
  config = transformers.Gemma3Config(text_config=text, vision_config=vision,
                                     mm_tokens_per_image=4, image_token_index=299,
                                     boi_token_index=297, eoi_token_index=298)
  torch.manual_seed(0)
  hf = transformers.Gemma3ForConditionalGeneration(config).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if "norm" in name:
        p.add_(0.3 * torch.randn_like(p))
  hf.save_pretrained(str(tmp_path / "mm"))
  model = models.load_pretrained(str(tmp_path / "mm"))
  assert model.config.architecture == "Gemma3ForCausalLM"
  ids, mask = padded_batch(seed=12)
  ref = hf_logits(hf, ids, mask)
  out = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_array_less(np.abs(out - ref)[mask.astype(bool)].max(), TOL)
  # It saves back as the text-only model.
  models.save_pretrained(model, str(tmp_path / "text"))
  text_only = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "text")).eval()
  np.testing.assert_allclose(hf_logits(text_only, ids, mask), ref, atol=1e-5, rtol=0)
