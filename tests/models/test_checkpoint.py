"""Checkpoint errors list every mismatch at once; orbax round trip of NNX state."""

import os
import shutil

from conftest import padded_batch
import jax.numpy as jnp
import numpy as np
import pytest

from harnax import models
from harnax.models import checkpoint
from harnax.models import safetensors_io


def _rewrite(src: str, dst: str, edit) -> None:
  shutil.copytree(src, dst)
  file = os.path.join(dst, "model.safetensors")
  tensors = {k: np.array(v) for k, v in safetensors_io.iter_tensors(file)}
  edit(tensors)
  safetensors_io.write(file, tensors)


def test_all_mismatches_reported_in_one_error(pair_factory, tmp_path):
  pair = pair_factory("qwen3_moe")
  bad = str(tmp_path / "bad")

  def edit(t):
    del t["model.layers.0.self_attn.q_norm.weight"]
    del t["model.layers.2.mlp.experts.3.up_proj.weight"]
    t["model.layers.0.mlp.shared_expert.weight"] = np.zeros((2, 2), np.float32)
    t["model.layers.1.mlp.down_proj.weight"] = t["model.layers.1.mlp.down_proj.weight"][:, :-1]
    t["lm_head.weight"] = t["lm_head.weight"].T.copy()
    t["model.rotary_emb.inv_freq"] = np.zeros((8,), np.float32)  # derived buffer: ignored

  _rewrite(pair.path, bad, edit)
  with pytest.raises(models.CheckpointError) as info:
    models.load_pretrained(bad)
  problems = info.value.problems
  text = str(info.value)
  assert len(problems) == 5, problems
  assert "missing tensor model.layers.0.self_attn.q_norm.weight" in text
  assert "missing tensor model.layers.2.mlp.experts.3.up_proj.weight" in text
  assert "unexpected tensor model.layers.0.mlp.shared_expert.weight" in text
  assert ("wrong shape for model.layers.1.mlp.down_proj.weight: expected [32, 40], got [32, 39]"
          in text)
  assert "wrong shape for lm_head.weight" in text
  assert "inv_freq" not in text


def test_missing_weights_file(tmp_path, pair_factory):
  pair = pair_factory("qwen3")
  shutil.copy(os.path.join(pair.path, "config.json"), tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    models.load_pretrained(str(tmp_path))


def test_mapping_table_covers_every_parameter_once(pair_factory):
  from flax import nnx

  from harnax.models import hf
  for name in ("qwen3", "qwen3_moe", "gemma3"):
    model = pair_factory(name).model
    m = hf.model_mapping(model.config, nnx.state(model, nnx.Param))
    expected = m.expected()
    saved = safetensors_io.tensor_shapes(os.path.join(pair_factory(name).path, "model.safetensors"))
    assert set(expected) == set(saved)  # exactly the tensors transformers wrote
    assert {t.path for t in expected.values()} == set(m.param_shapes)


def test_orbax_round_trip(pair_factory, tmp_path):
  pair = pair_factory("gemma3")
  directory = str(tmp_path / "ckpt")
  checkpoint.save_state(directory, pair.model)
  fresh = models.from_config(pair.model.config, seed=123)
  ids, mask = padded_batch()
  before = np.asarray(models.forward(fresh, jnp.asarray(ids), jnp.asarray(mask)))
  ref = np.asarray(models.forward(pair.model, jnp.asarray(ids), jnp.asarray(mask)))
  assert np.abs(before - ref).max() > 1e-2
  checkpoint.restore_state(directory, fresh)
  after = np.asarray(models.forward(fresh, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_array_equal(after, ref)


def test_safetensors_bfloat16_round_trip(tmp_path):
  import ml_dtypes
  file = str(tmp_path / "x.safetensors")
  a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
  b = np.array([1, 2, 3], np.int64)
  safetensors_io.write(file, {"a": a, "b": b})
  from safetensors.numpy import load_file
  got = dict(safetensors_io.iter_tensors(file))
  np.testing.assert_array_equal(got["a"].astype(np.float32), a.astype(np.float32))
  np.testing.assert_array_equal(load_file(file)["b"], b)  # readable by the reference library


def test_safetensors_reads_into_aligned_buffers_and_rejects_truncation(tmp_path):
  file = str(tmp_path / "x.safetensors")
  tensors = {"a": np.arange(5, dtype=np.float32), "b": np.ones((3, 7), np.float32)}
  safetensors_io.write(file, tensors)
  for name, got in safetensors_io.iter_tensors(file):
    assert got.ctypes.data % safetensors_io.ALIGNMENT == 0  # lets device_put adopt it
    assert got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, tensors[name])
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 4)
  with pytest.raises(ValueError, match="'b' is truncated"):
    dict(safetensors_io.iter_tensors(file))


def test_tied_checkpoint_with_redundant_lm_head_loads(pair_factory, tmp_path):
  pair = pair_factory("qwen3_tied")
  extra = str(tmp_path / "extra")
  _rewrite(pair.path, extra,
           lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
  model = models.load_pretrained(extra)
  assert model.lm_head is None
  ids, mask = padded_batch()
  np.testing.assert_array_equal(
      np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask))),
      np.asarray(models.forward(pair.model, jnp.asarray(ids), jnp.asarray(mask))))
