"""Qwen3.5 text (dense and MoE) against transformers on tiny random checkpoints: logits with
left padding past the conv window and the chunk size, our padded rows against our unpadded
rows, the recurrent cache, greedy generation, load/save, multimodal checkpoints, bad input and
the published full-size shapes.

Every reference comes from transformers' own Qwen3.5 models, built here with random weights.
"""

import json
import os
import zlib

from conftest import hf_logits
from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from harnax import models
from harnax.models import decoding as gen
from harnax.models import qwen3_5
from harnax.models.gated_deltanet import DeltaNetCache

VOCAB = 96
TOL = 1e-4  # float32 end to end; observed ~2e-6
LENGTH = 70  # > the 64-token chunk of the delta rule and > the width-4 conv window
ROPE = {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
        "mrope_section": [1, 1, 2], "mrope_interleaved": True}
TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
            linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
            max_position_embeddings=256, rms_norm_eps=1e-6, num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention",
                         "linear_attention"], rope_parameters=ROPE, eos_token_id=5,
            pad_token_id=0)


@nnx.jit
def prefill(model, ids, mask, cache):
  return model.prefill(ids, mask, cache=cache)


@nnx.jit
def forward_with_cache(model, ids, mask, cache):
  return model.forward_with_cache(ids, mask, cache=cache)


@nnx.jit
def decode_step(model, tokens, cache):
  return model.decode_step(tokens, cache=cache)


def hf_config(name):
  if name == "dense":
    return transformers.Qwen3_5TextConfig(**TEXT, intermediate_size=48)
  if name == "dense_tied":
    return transformers.Qwen3_5TextConfig(**{**TEXT, "num_hidden_layers": 2,
                                             "layer_types": None}, intermediate_size=48,
                                          full_attention_interval=2, tie_word_embeddings=True)
  if name == "moe":
    return transformers.Qwen3_5MoeTextConfig(
        **TEXT, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=6,
        num_experts_per_tok=2)
  raise KeyError(name)


def perturb(model, name):
  torch.manual_seed(zlib.crc32(name.encode()))
  with torch.no_grad():
    for pname, p in model.named_parameters():
      # Identity-initialised norms (ones / zeros) must not hide a convention bug.
      p.add_((0.3 if "norm" in pname else 0.05) * torch.randn_like(p))
  return model


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
  cache = {}

  def get(name):
    if name not in cache:
      torch.manual_seed(1)
      hf = perturb(transformers.AutoModelForCausalLM.from_config(hf_config(name)).eval(), name)
      path = str(tmp_path_factory.mktemp(name))
      hf.save_pretrained(path)
      cache[name] = (hf, path, models.load_pretrained(path))
    return cache[name]

  return get


def batch(seed=0, length=LENGTH, pads=(0, 5, 67)):
  """Left-padded ids/mask; the last row has only a few real tokens (fewer than the window)."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(6, VOCAB, (len(pads), length))
  mask = np.ones(ids.shape, np.int64)
  for row, pad in enumerate(pads):
    mask[row, :pad] = 0
  return ids * mask, mask


@pytest.mark.parametrize("name", ["dense", "dense_tied", "moe"])
def test_logits_match_transformers_with_left_padding(pairs, name):
  hf, _, model = pairs(name)
  ids, mask = batch()
  ref = hf_logits(hf, ids, mask)
  out = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  real = mask.astype(bool)
  assert out.shape == ref.shape
  np.testing.assert_array_less(np.abs(out - ref)[real].max(), TOL)


def test_padded_rows_equal_unpadded_rows_and_chunk_size_is_free(pairs):
  """Rows 1-3 hold prefixes of row 0's sequence, left-padded (row 3 also has holes): the model
  is causal, so each must give row 0's logits at the same real positions."""
  _, _, model = pairs("dense")
  seq = np.random.RandomState(1).randint(6, VOCAB, LENGTH)
  ids = np.zeros((4, LENGTH), np.int64)
  mask = np.zeros((4, LENGTH), np.int64)
  ids[0], mask[0] = seq, 1
  for row, n in ((1, 61), (2, 3)):
    ids[row, LENGTH - n:], mask[row, LENGTH - n:] = seq[:n], 1
  # Padding inside a row (not produced by tokenizers, but allowed by the mask semantics) is
  # skipped as well: the conv convolves real inputs only and the recurrence steps over it.
  slots = np.r_[10:20, 23:50, 52:LENGTH]
  ids[3, slots], mask[3, slots] = seq[:len(slots)], 1
  out = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  for row in (1, 2, 3):
    real = mask[row].astype(bool)
    np.testing.assert_allclose(out[row, real], out[0, :real.sum()], atol=2e-5)
  # The chunk length is ours (not in config.json): any chunk gives the same logits.
  small = models.CausalLM(model.config.replace(linear_chunk_size=8))
  nnx.update(small, nnx.state(model))
  real = mask.astype(bool)
  np.testing.assert_allclose(
      np.asarray(models.forward(small, jnp.asarray(ids), jnp.asarray(mask)))[real], out[real],
      atol=2e-5)


def test_config_semantics(pairs):
  cfg = pairs("dense")[2].config
  assert isinstance(cfg, qwen3_5.Qwen35Config) and cfg.norm_style == "one_plus_scale"
  assert cfg.rotary_dim == 8 and cfg.mrope_section == (1, 1, 2)
  tied = pairs("dense_tied")[2].config
  assert tied.layer_types == ("linear_attention", "full_attention")  # full_attention_interval
  assert tied.tie_word_embeddings and pairs("dense_tied")[2].lm_head is None
  moe = pairs("moe")[2].config
  assert moe.mlp_kinds == ("moe",) * 4 and moe.norm_topk_prob


def test_cache_prefill_decode_equals_teacher_forcing(pairs):
  _, _, model = pairs("dense")
  ids, mask = batch(seed=2, length=12, pads=(0, 3))
  # All positions at once through a fresh cache: the teacher-forced logits and the chunked
  # prefill's final state.
  full, ref_cache = forward_with_cache(model, jnp.asarray(ids), jnp.asarray(mask),
                                       model.init_cache(batch_size=2, max_length=16))
  full = np.asarray(full)
  cache = model.init_cache(batch_size=2, max_length=16)
  assert isinstance(cache.layers[0], DeltaNetCache)
  logits, cache = prefill(model, jnp.asarray(ids[:, :7]), jnp.asarray(mask[:, :7]), cache)
  np.testing.assert_allclose(np.asarray(logits), full[:, 6], atol=2e-5)
  for t in range(7, 12):  # one token per step: the recurrent form
    logits, cache = decode_step(model, jnp.asarray(ids[:, t]), cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=2e-5)
  # The recurrent state after token-by-token decoding equals the chunked prefill's state.
  for ours, ref in zip(cache.layers, ref_cache.layers):
    if isinstance(ours, DeltaNetCache):
      np.testing.assert_allclose(np.asarray(ours.state), np.asarray(ref.state), atol=1e-5)
      np.testing.assert_allclose(np.asarray(ours.conv), np.asarray(ref.conv), atol=1e-6)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_greedy_matches_transformers_generate(pairs, name):
  hf, _, model = pairs(name)
  ids, mask = batch(seed=4, length=9, pads=(0, 3, 6))
  with torch.no_grad():
    ref = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                      max_new_tokens=10, do_sample=False, pad_token_id=0,
                      eos_token_id=None).numpy()[:, ids.shape[1]:]
  out = gen.generate(model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=10,
                     stop_tokens=())
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)


def test_save_round_trip_opens_in_transformers(pairs, tmp_path):
  hf, _, model = pairs("moe")
  path = str(tmp_path / "saved")
  models.save_pretrained(model, path)
  with open(os.path.join(path, "config.json")) as f:
    saved = json.load(f)
  assert saved["architectures"] == ["Qwen3_5MoeForCausalLM"]
  assert saved["rope_parameters"]["partial_rotary_factor"] == 0.5
  back = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  ids, mask = batch(seed=3, length=20, pads=(0, 4))
  np.testing.assert_allclose(hf_logits(back, ids, mask), hf_logits(hf, ids, mask), atol=1e-6)
  again = models.load_pretrained(path)
  assert again.config == model.config


def test_multimodal_checkpoint_loads_its_language_model(tmp_path):
  text = {**TEXT, "intermediate_size": 48, "layer_types": None}
  text.pop("eos_token_id")
  vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=4,
                out_hidden_size=32, num_position_embeddings=16)
  cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
  torch.manual_seed(2)
  hf = perturb(transformers.Qwen3_5ForConditionalGeneration(cfg).eval(), "mm")
  path = str(tmp_path / "mm")
  hf.save_pretrained(path)
  model = models.load_pretrained(path)
  assert model.config.architecture == "Qwen3_5ForCausalLM"
  ids = np.random.RandomState(5).randint(6, VOCAB, (2, 15))
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids)).logits.numpy()
  out = np.asarray(models.forward(model, jnp.asarray(ids)))
  np.testing.assert_array_less(np.abs(out - ref).max(), TOL)
  models.save_pretrained(model, str(tmp_path / "text"))  # saves back as the text model
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "text")).eval()
  with torch.no_grad():
    np.testing.assert_allclose(back(input_ids=torch.tensor(ids)).logits.numpy(), ref,
                               atol=1e-5)


# ---- bad input ----------------------------------------------------------------------------
def _text_dict(**changes):
  d = dict(TEXT, intermediate_size=48, architectures=["Qwen3_5ForCausalLM"],
           model_type="qwen3_5_text")
  d.update(changes)
  return d


@pytest.mark.parametrize("changes,message", [
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention",
                       "full_attention"]), "layer_types: expected entries in"),
    (dict(rope_parameters=dict(ROPE, rope_type="yarn", factor=2.0)),
     "rope_parameters.rope_type: expected 'default'"),
    (dict(attn_output_gate=False), "attn_output_gate"),
    (dict(linear_num_value_heads=3), "linear_num_value_heads: expected a multiple"),
    (dict(rope_parameters=dict(ROPE, mrope_section=[1, 1, 1])), "mrope_section"),
    (dict(linear_conv_kernel_dim=0), "linear_conv_kernel_dim"),
])
def test_unsupported_config_refused_by_name(changes, message):
  with pytest.raises(ValueError, match=message):
    models.config_from_hf_dict(_text_dict(**changes))


def test_missing_and_unexpected_tensors_are_named(pairs, tmp_path):
  from harnax.models import safetensors_io
  _, path, _ = pairs("dense")
  tensors = dict(safetensors_io.iter_tensors(os.path.join(path, "model.safetensors")))
  tensors.pop("model.layers.0.linear_attn.A_log")
  tensors["model.layers.1.linear_attn.dt_bias"] = np.zeros(4, np.float32)
  out = tmp_path / "broken"
  out.mkdir()
  safetensors_io.write(str(out / "model.safetensors"), tensors)
  with open(os.path.join(path, "config.json")) as f:
    (out / "config.json").write_text(f.read())
  with pytest.raises(models.CheckpointError) as err:
    models.load_pretrained(str(out))
  problems = "\n".join(err.value.problems)
  assert "missing tensor model.layers.0.linear_attn.A_log" in problems
  assert "unexpected tensor model.layers.1.linear_attn.dt_bias" in problems


def test_checkpoint_of_another_family_is_a_clear_error(pairs, pair_factory, tmp_path):
  # Qwen3 tensors under a Qwen3.5 config.json: every difference listed, no shape crash.
  qwen3 = pair_factory("qwen3")
  out = tmp_path / "other"
  out.mkdir()
  os.symlink(os.path.join(qwen3.path, "model.safetensors"), out / "model.safetensors")
  d = _text_dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                 hidden_size=32)
  (out / "config.json").write_text(json.dumps(d))
  with pytest.raises(models.CheckpointError) as err:
    models.load_pretrained(str(out))
  problems = "\n".join(err.value.problems)
  assert "missing tensor model.layers.0.linear_attn.in_proj_qkv.weight" in problems
  assert "wrong shape for model.layers.1.self_attn.q_proj.weight" in problems


# ---- the published shapes -----------------------------------------------------------------
# Qwen3.5-2B and Qwen3.5-9B text configs as published in the model repositories' config.json
# (text_config of Qwen3_5ForConditionalGeneration); the 9B numbers are also transformers'
# Qwen3_5TextConfig defaults ("Qwen3.5-9B style").
PUBLISHED = {
    "2b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=8,
               num_key_value_heads=2, intermediate_size=6144, linear_num_value_heads=16,
               tie_word_embeddings=True),
    "9b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
               num_key_value_heads=4, intermediate_size=12288, linear_num_value_heads=32,
               tie_word_embeddings=False),
}


def published_config(size):
  d = dict(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320,
           head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
           linear_value_head_dim=128, linear_num_key_heads=16, full_attention_interval=4,
           max_position_embeddings=262144, rms_norm_eps=1e-6,
           rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                            "mrope_interleaved": True}, **PUBLISHED[size])
  return models.config_from_hf_dict(d)


@pytest.mark.parametrize("size", ["2b", "9b"])
def test_full_size_shapes_match_transformers_param_count(size):
  """eval_shape of the real shapes; the count must equal transformers' own text model of the
  same config (built on the meta device): 1.88B and 8.95B. The model cards' "2B" and "9B"
  include the vision encoder (about 0.30B and 0.41B by its published vision_config: 24
  blocks of width 1024 / MLP 4096, and 27 of 1152 / 4304), i.e. 2.2B and 9.4B in all."""
  cfg = published_config(size)
  ours = models.param_count(nnx.state(models.abstract_model(cfg), nnx.Param))
  hf_cfg = transformers.Qwen3_5TextConfig(**{k: v for k, v in cfg.to_hf_dict().items()
                                             if k not in ("architectures", "model_type")})
  with torch.device("meta"):
    ref = transformers.Qwen3_5ForCausalLM(hf_cfg)
  expected = sum(p.numel() for p in ref.parameters())  # tied weights are counted once
  assert ours == expected
  low, high = {"2b": (1.5e9, 2.2e9), "9b": (8.0e9, 9.4e9)}[size]  # the cards' size class
  assert low < ours < high


# ---- sharding ------------------------------------------------------------------------------
@pytest.mark.slow
def test_sharded_forward_and_train_step_match_unsharded(tmp_path):
  """The shared 8-device check (tests/models/sharded_check.py) on a Qwen3.5-MoE checkpoint
  whose first layer is full attention (the check inspects its q_proj) and second linear."""
  import subprocess
  import sys
  here = os.path.dirname(os.path.abspath(__file__))
  root = os.path.dirname(os.path.dirname(here))
  cfg = transformers.Qwen3_5MoeTextConfig(**{
      **TEXT, "num_hidden_layers": 2, "layer_types": ["full_attention", "linear_attention"]},
      moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
      num_experts_per_tok=2)
  torch.manual_seed(3)
  path = str(tmp_path / "sharded")
  perturb(transformers.AutoModelForCausalLM.from_config(cfg), "sharded").save_pretrained(path)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
  # Appended: the suite's compile flags (tests/conftest.py) carry over to the child.
  env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  proc = subprocess.run([sys.executable, os.path.join(here, "sharded_check.py"), path],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  assert proc.stdout.count("OK ") == 1, proc.stdout


def test_fused_expert_checkpoint_loads_and_wrong_fused_shape_is_named(pairs, tmp_path):
  """The released MoE checkpoints store the experts fused, as transformers holds them in
  memory (`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj [E, H, I]`): a checkpoint
  written from transformers' own state dict loads and gives transformers' logits."""
  from harnax.models import safetensors_io
  hf, path, _ = pairs("moe")
  tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  fused = "model.layers.0.mlp.experts.gate_up_proj"
  assert tensors[fused].shape == (6, 2 * 16, 32)
  assert tensors["model.layers.0.mlp.experts.down_proj"].shape == (6, 32, 16)
  assert not any(".experts.0." in k for k in tensors)
  out = tmp_path / "fused"
  out.mkdir()
  safetensors_io.write(str(out / "model.safetensors"), tensors)
  with open(os.path.join(path, "config.json")) as f:
    (out / "config.json").write_text(f.read())
  model = models.load_pretrained(str(out))
  ids, mask = batch(seed=4, length=20, pads=(0, 6))
  ref = hf_logits(hf, ids, mask)
  got = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_array_less(np.abs(got - ref)[real].max(), TOL)

  tensors[fused] = tensors[fused][:, 1:]
  safetensors_io.write(str(out / "model.safetensors"), tensors)
  with pytest.raises(models.CheckpointError) as err:
    models.load_pretrained(str(out))
  problems = "\n".join(err.value.problems)
  assert f"wrong shape for {fused}: expected [6, 32, 32]" in problems
  assert len(err.value.problems) == 1, problems
