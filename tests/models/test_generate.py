"""Generation (greedy parity with transformers.generate, sampling, stop tokens, cache bounds)
and teacher-forced scoring (values and gradients against torch autograd)."""

import dataclasses

from conftest import hf_logits
from conftest import padded_batch
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from harnax import models
from harnax.models import decoding as gen
from harnax.models import logprobs


def hf_greedy(hf, ids, mask, n, eos=None):
  with torch.no_grad():
    out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                      max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=eos)
  return out.numpy()[:, ids.shape[1]:]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "gemma3"])
def test_greedy_matches_transformers_generate(pair_factory, name):
  pair = pair_factory(name)
  ids, mask = padded_batch(seed=4, length=9)
  ref = hf_greedy(pair.hf, ids, mask, 10)
  out = gen.generate(pair.model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=10,
                     stop_tokens=())
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  assert np.asarray(out.mask).all() and (np.asarray(out.lengths) == 10).all()


def test_stop_tokens_end_each_sequence(pair_factory):
  pair = pair_factory("qwen3")
  ids, mask = padded_batch(seed=4, length=9)
  free = np.asarray(gen.generate(pair.model, jnp.asarray(ids), jnp.asarray(mask),
                                 max_new_tokens=10, stop_tokens=()).tokens)
  stop = int(free[0, 3])  # a token row 0 emits at step 3
  ref = hf_greedy(pair.hf, ids, mask, 10, eos=stop)
  out = gen.generate(pair.model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=10,
                     stop_tokens=(stop,), pad_token_id=0)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  for row in range(ids.shape[0]):
    hits = np.nonzero(free[row] == stop)[0]
    expected_len = hits[0] + 1 if len(hits) else 10
    assert lengths[row] == expected_len
    np.testing.assert_array_equal(tokens[row, :expected_len], ref[row, :expected_len])
    assert (tokens[row, expected_len:] == 0).all()
    assert (np.asarray(out.logprobs)[row, expected_len:] == 0).all()
  assert lengths[0] == 4


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(temperature=1.3, top_k=5),
                                      dict(temperature=1.0, top_p=0.8)])
def test_sampler_logprobs_equal_teacher_forced(pair_factory, settings):
  pair = pair_factory("gemma3")
  ids, mask = padded_batch(seed=5, length=8)
  out = gen.generate(pair.model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=7,
                     key=jax.random.key(1), stop_tokens=(), **settings)
  full, fmask, span = logprobs.concat_completion(jnp.asarray(ids), jnp.asarray(mask), out.tokens,
                                                 out.mask)
  score = nnx.jit(logprobs.score_spans, static_argnames="temperature")
  scored = score(pair.model, full, fmask, span, temperature=settings["temperature"])
  np.testing.assert_allclose(np.asarray(scored.per_token[:, ids.shape[1]:]),
                             np.asarray(out.logprobs), atol=2e-5)


def test_sampling_is_keyed_and_truncation_respected(pair_factory):
  pair = pair_factory("qwen3")
  ids, mask = padded_batch(seed=6, length=6)
  args = (pair.model, jnp.asarray(ids), jnp.asarray(mask))
  kw = dict(max_new_tokens=6, stop_tokens=())
  a = gen.generate(*args, key=jax.random.key(0), temperature=1.0, **kw).tokens
  b = gen.generate(*args, key=jax.random.key(0), temperature=1.0, **kw).tokens
  c = gen.generate(*args, key=jax.random.key(1), temperature=1.0, **kw).tokens
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).any()
  greedy = gen.generate(*args, **kw).tokens
  np.testing.assert_array_equal(
      gen.generate(*args, key=jax.random.key(2), temperature=2.0, top_k=1, **kw).tokens, greedy)
  np.testing.assert_array_equal(
      gen.generate(*args, key=jax.random.key(3), temperature=2.0, top_p=1e-6, **kw).tokens, greedy)


def test_sample_token_top_k_top_p_support():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 2000))
  keys = jax.random.key(0)
  k2 = np.asarray(gen.sample_token(keys, logits, temperature=1.0, top_k=2))
  assert set(np.unique(k2)) == {0, 1}
  p = np.asarray(gen.sample_token(keys, logits, temperature=1.0, top_p=0.7))
  assert set(np.unique(p)) == {0, 1}  # 0.5 < 0.7 needs the second token, not the third
  freq = np.mean(p == 0)
  assert abs(freq - 0.5 / 0.8) < 0.05


def test_prompt_longer_than_cache(pair_factory):
  model = pair_factory("qwen3").model
  ids, mask = padded_batch(length=10)
  with pytest.raises(ValueError, match="max_length"):
    gen.generate(model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=4, max_length=12)
  cache = model.init_cache(ids.shape[0], 8)
  with pytest.raises(ValueError, match="do not fit a cache"):
    model.prefill(jnp.asarray(ids), jnp.asarray(mask), cache=cache)
  cache = model.init_cache(ids.shape[0], 12)
  with pytest.raises(ValueError, match="batch size 2 differs from the cache's 3"):
    model.prefill(jnp.asarray(ids[:2]), jnp.asarray(mask[:2]), cache=cache)
  # A cache of another model's depth would otherwise be zipped short and silently ignored.
  short = dataclasses.replace(cache, layers=cache.layers[:-1])
  with pytest.raises(ValueError, match=f"cache: expected {model.config.num_layers} layers"):
    model.prefill(jnp.asarray(ids), jnp.asarray(mask), cache=short)
  _, cache = model.prefill(jnp.asarray(ids), jnp.asarray(mask), cache=cache)
  with pytest.raises(ValueError, match="more tokens after 10"):
    model.forward_with_cache(jnp.asarray(ids[:, :3]), cache=cache)
  with pytest.raises(ValueError, match=r"tokens: expected shape \[batch\]"):
    model.decode_step(jnp.asarray(ids[:, :1]), cache=cache)
  with pytest.raises(ValueError, match="key"):
    gen.generate(model, jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=2, temperature=1.0)


def test_prefill_then_decode_equals_full_forward(pair_factory):
  pair = pair_factory("gemma3")
  model = pair.model
  ids, mask = padded_batch(seed=7, length=10)
  full = np.asarray(models.forward(model, jnp.asarray(ids), jnp.asarray(mask)))
  cache = model.init_cache(ids.shape[0], 12)
  prefill = nnx.jit(lambda m, x, k, c: m.prefill(x, k, cache=c))
  step = nnx.jit(lambda m, x, c: m.decode_step(x, cache=c))
  # The prompt in two chunks: the second continues the positions of the first.
  _, cache = prefill(model, jnp.asarray(ids[:, :4]), jnp.asarray(mask[:, :4]), cache)
  logits, cache = prefill(model, jnp.asarray(ids[:, 4:7]), jnp.asarray(mask[:, 4:7]), cache)
  assert logits.shape == (ids.shape[0], model.config.vocab_size) and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), full[:, 6], atol=2e-5)
  for t in range(7, 10):
    logits, cache = step(model, jnp.asarray(ids[:, t]), cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=2e-5)


def test_call_returns_logits_with_or_without_a_mask(pair_factory):
  model = pair_factory("qwen3").model
  ids, _ = padded_batch(seed=3, pads=(0, 0, 0))
  logits = model(jnp.asarray(ids))
  assert isinstance(logits, jax.Array)
  assert logits.shape == ids.shape + (model.config.vocab_size,) and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids), attention_mask=np.ones_like(ids))),
                             np.asarray(logits), atol=1e-6)


def test_span_scores_match_transformers(pair_factory):
  pair = pair_factory("qwen3_moe")
  ctx, ctx_mask = padded_batch(seed=8, length=7)
  comp, comp_mask = padded_batch(seed=9, length=5, pads=(0, 0, 0))
  comp_mask[1, 3:] = 0  # right-padded completion
  comp = comp * comp_mask
  ids, mask, span = logprobs.concat_completion(jnp.asarray(ctx), jnp.asarray(ctx_mask),
                                               jnp.asarray(comp), jnp.asarray(comp_mask))
  action = np.asarray(span).copy()
  action[:, 7:9] = 0  # score only the "action" tokens after the first two "reasoning" tokens
  got = nnx.jit(logprobs.score_spans)(pair.model, ids, mask, jnp.asarray(action))
  ref_logits = torch.tensor(hf_logits(pair.hf, np.asarray(ids), np.asarray(mask)))
  ref_lp = torch.log_softmax(ref_logits[:, :-1], -1).gather(
      -1, torch.tensor(np.asarray(ids))[:, 1:, None])[..., 0].numpy()
  ref_per_token = np.concatenate([np.zeros((3, 1)), ref_lp], axis=1) * action
  np.testing.assert_allclose(np.asarray(got.per_token), ref_per_token, atol=1e-4)
  np.testing.assert_allclose(np.asarray(got.total), ref_per_token.sum(1), atol=1e-4)
  np.testing.assert_allclose(np.asarray(got.mean), ref_per_token.sum(1) / action.sum(1),
                             atol=1e-4)


def test_score_gradient_matches_torch_autograd(pair_factory):
  pair = pair_factory("gemma3")
  ids, mask = padded_batch(seed=10, length=8)
  span = mask.copy()
  span[:, :5] = 0
  graphdef, params, rest = nnx.split(pair.model, nnx.Param, ...)

  def objective(p):
    model = nnx.merge(graphdef, p, rest)
    return logprobs.score_spans(model, jnp.asarray(ids), jnp.asarray(mask),
                                jnp.asarray(span)).mean.sum()

  grads = jax.jit(jax.grad(objective))(params)
  hf = pair.hf
  hf.zero_grad()
  pos = np.clip(mask.cumsum(-1) - 1, 0, None)
  logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
              position_ids=torch.tensor(pos)).logits
  lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(
      -1, torch.tensor(ids)[:, 1:, None])[..., 0]
  valid = torch.tensor(span[:, 1:] * mask[:, :-1], dtype=torch.float32)
  ((lp * valid).sum(1) / valid.sum(1)).sum().backward()
  ref_q = hf.model.layers[1].self_attn.q_proj.weight.grad.numpy()
  ref_norm = hf.model.layers[0].post_feedforward_layernorm.weight.grad.numpy()
  got_q = np.asarray(grads["layers"][1]["attn"]["q_proj"]["kernel"][...])
  got_norm = np.asarray(grads["layers"][0]["post_mlp_norm"]["weight"][...])
  np.testing.assert_allclose(got_q, ref_q, atol=1e-5, rtol=1e-3)
  np.testing.assert_allclose(got_norm, ref_norm, atol=1e-5, rtol=1e-3)
  hf.zero_grad()
