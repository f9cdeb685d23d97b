"""The KV cache's stored layout: decoding with it equals the full forward pass for every
(batch, KV heads) combination, including the size-1 cases, and XLA:CPU compiles a decode
step that updates it in place (no copy of a cache-sized buffer)."""

import functools
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax import models
from harnax.models.model import AttentionCache

LENGTH = 24


def _model(kv_heads: int):
  cfg = models.config_from_hf_dict(dict(
      architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=64, hidden_size=32,
      intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=kv_heads, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000.0,
      max_position_embeddings=64, tie_word_embeddings=True))
  return models.from_config(cfg, seed=kv_heads)


CASES = [(1, 1), (1, 2), (2, 1), (2, 3)]  # (KV heads, batch)


@pytest.mark.parametrize("kv_heads,batch", CASES)
def test_storage_shape_has_no_size_one_dimension(kv_heads, batch):
  cache = _model(kv_heads).init_cache(batch, LENGTH)
  want = (LENGTH, 16) if kv_heads * batch == 1 else (batch * kv_heads, LENGTH, 16)
  for layer in cache.layers:
    assert layer.k.shape == layer.v.shape == want
    assert [x.shape for x in layer.heads(batch)] == [(batch, kv_heads, LENGTH, 16)] * 2


@pytest.mark.parametrize("kv_heads,batch", CASES)
def test_prefill_then_decode_equals_full_forward(kv_heads, batch):
  model = _model(kv_heads)
  rng = np.random.RandomState(batch)
  ids = jnp.asarray(rng.randint(1, 64, (batch, 9)), jnp.int32)
  mask = np.ones((batch, 9), np.int32)
  mask[-1, :3] = 0  # left padding on the last row
  mask = jnp.asarray(mask)
  full = np.asarray(models.forward(model, ids, mask))
  extend = nnx.jit(lambda m, x, k, c: m.forward_with_cache(x, k, cache=c))
  logits, cache = extend(model, ids[:, :6], mask[:, :6], model.init_cache(batch, LENGTH))
  np.testing.assert_allclose(np.asarray(logits), full[:, :6], atol=2e-5)
  step = nnx.jit(lambda m, x, c: m.decode_step(x, cache=c))
  for t in range(6, 9):
    logits, cache = step(model, ids[:, t], cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=2e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's compiled program")
@pytest.mark.parametrize("kv_heads,batch", CASES)
def test_decode_step_updates_the_cache_in_place(kv_heads, batch):
  model = _model(kv_heads)
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, donate_argnums=(1,))
  def decode_step(state, cache, tok):
    return nnx.merge(graphdef, state).decode_step(tok, cache=cache)

  cache = model.init_cache(batch, 256)  # large enough that a copy would show in timings
  hlo = decode_step.lower(state, cache, jnp.ones((batch,), jnp.int32)).compile().as_text()
  dims = ",".join(str(d) for d in AttentionCache.storage_shape(
      batch=batch, kv_heads=kv_heads, length=256, head_dim=16))
  copies = re.findall(r"= f32\[%s\]\{[^}]*\} copy\(" % dims, hlo)
  assert not copies, f"{len(copies)} copies of a [{dims}] cache buffer per decode step"
