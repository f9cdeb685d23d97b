"""The LM policy behind a harness: prompt-shared scoring, the catch-all, the exact gradient.

References are independent: full-sequence forwards scored in float64 NumPy, `jax.grad` of
the whole composition, central finite differences, and the core's closed-form softmax
policy gradient.
"""

import zlib

from flax import nnx
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import models
from harnax.core import mdp as mdp_lib
from harnax.harness import INVALID
from harnax.policies import lm

pytestmark = pytest.mark.x64

V = 40


def tiny_model(dtype=jnp.float64, seed=0):
  cfg = models.Qwen3Config.from_hf_dict(dict(
      architectures=["Qwen3ForCausalLM"], vocab_size=V, hidden_size=16, intermediate_size=32,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
      max_position_embeddings=64, rope_theta=1000.0, tie_word_embeddings=False))
  model = models.from_config(cfg, seed=seed, param_dtype=dtype)
  # Larger weights than the 0.02 init, so the output distribution is far from uniform.
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, state)
  return nnx.merge(graphdef, state)


def random_tokens(seed, r=5, o=4, tp=6, tc=3):
  rng = np.random.default_rng(seed)
  pm = np.ones((r, tp), bool)
  pm[0, :3] = False                    # left padding of different lengths
  pm[2, :tp - 1] = False               # a one-token prompt
  om = np.ones((r, o, tc), bool)
  om[:, 1, 1:] = False                 # a one-token candidate
  om[:, 2, 2:] = False
  om[3, 3] = False                     # a padding candidate
  return lm.CandidateTokens(prompt_ids=rng.integers(1, V, (r, tp)), prompt_mask=pm,
                            output_ids=rng.integers(1, V, (r, o, tc)), output_mask=om)


def numpy_scores(model, tokens):
  """log p(candidate | prompt) by one full forward of each real (prompt + candidate)."""
  r, o = tokens.output_ids.shape[:2]
  out = np.full((r, o), -np.inf)
  for i in range(r):
    prompt = np.asarray(tokens.prompt_ids[i])[np.asarray(tokens.prompt_mask[i])]
    for j in range(o):
      cand = np.asarray(tokens.output_ids[i, j])[np.asarray(tokens.output_mask[i, j])]
      if not cand.size:
        continue
      seq = np.concatenate([prompt, cand])[None]
      logits = np.asarray(models.forward(model, jnp.asarray(seq)), np.float64)[0]
      logp = logits - logits.max(-1, keepdims=True)
      logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
      n = len(prompt)
      out[i, j] = sum(logp[n - 1 + t, cand[t]] for t in range(len(cand)))
  return out


@pytest.fixture(scope="module")
def model():
  return tiny_model()


def test_shared_scoring_equals_full_forwards(model):
  tokens = random_tokens(0)
  ref = numpy_scores(model, tokens)
  real = np.isfinite(ref)
  tree = lm.pack_candidates(tokens)
  # Under jit: one compile per method instead of one per eager op (5 s instead of 26 s).
  for shared in (nnx.jit(lm.candidate_log_probs)(model, tree),
                 nnx.jit(lm.candidate_log_probs_cached)(model, tokens),
                 nnx.jit(lm.candidate_log_probs_unshared)(model, tokens)):
    shared = np.asarray(shared)
    np.testing.assert_allclose(shared[real], ref[real], rtol=1e-10, atol=1e-10)
    assert np.all(np.exp(shared[~real]) == 0.0)
  # Far from uniform: the test would notice a wrong position or a missing token.
  assert np.ptp(shared[real]) > 1.0


@pytest.mark.parametrize("micro_batch", [1, 2, 5, 64])
def test_micro_batched_rows_equal_one_batch(model, micro_batch):
  tokens = lm.pack_candidates(random_tokens(1))
  score_fn, params = lm.split_model(model)
  full = np.asarray(nnx.jit(lm.candidate_log_probs)(model, tokens))
  got = np.asarray(lm.score_rows(score_fn, params, tokens, micro_batch=micro_batch))
  np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-12)


def test_catch_all_holds_the_rest_of_the_mass():
  lp = np.log(np.array([[0.5, 0.2, 0.1], [0.25, 0.25, 0.5], [1e-3, 2e-3, 3e-3]]))
  full = np.asarray(lm.with_catch_all(jnp.asarray(lp)))
  np.testing.assert_allclose(np.exp(full[:, -1]), 1 - np.exp(lp).sum(-1), rtol=1e-12,
                             atol=1e-300)
  np.testing.assert_allclose(np.exp(full).sum(-1), 1.0, rtol=1e-12)
  assert full[1, -1] == -np.inf                         # all mass on the candidates
  g = jax.grad(lambda x: jnp.sum(jnp.exp(lm.with_catch_all(x))[:, -1]))(jnp.asarray(lp))
  assert np.all(np.isfinite(np.asarray(g)))


def decode_for(r, o, a, seed):
  """A decoder where several outputs share an action and some are invalid; every action
  is reachable in every state."""
  rng = np.random.default_rng(seed)
  table = rng.integers(-1, a, (r, o))
  table[:, :a] = rng.permuted(np.tile(np.arange(a), (r, 1)), axis=1)
  return table


@pytest.mark.parametrize("invalid", ["noop", "renormalize"])
def test_semantic_policy_rows_sum_to_one_and_match_numpy(model, invalid):
  tokens = random_tokens(2, r=4, o=6)
  a = 3
  table = decode_for(4, 6, a, 0)
  table[:, 3:] = np.array([INVALID, 1, INVALID])
  pol = np.asarray(lm.semantic_policy(model, tokens, table, num_actions=a, invalid=invalid,
                                      noop_action=0))
  np.testing.assert_allclose(pol.sum(-1), 1.0, rtol=1e-12)
  p = np.exp(numpy_scores(model, tokens))
  ref = np.zeros((4, a))
  bad = 1.0 - p.sum(-1)                                 # the catch-all
  for s in range(4):
    for o in range(6):
      if table[s, o] >= 0:
        ref[s, table[s, o]] += p[s, o]
      else:
        bad[s] += p[s, o]
  if invalid == "noop":
    ref[:, 0] += bad
  else:
    ref /= ref.sum(-1, keepdims=True)
  np.testing.assert_allclose(pol, ref, rtol=1e-10)


def batched_problem(seed, n=2, s=4, a=3, o=6, tau=0.3):
  keys = jax.random.split(jax.random.key(seed), n)
  mdps = [hx.random_dense_mdp(k, s, a, discount=0.8) for k in keys]
  mdp = mdp_lib.stack(mdps)
  pi_ref = jnp.full((n, s, a), 1.0 / a)
  table = jnp.asarray(np.stack([decode_for(s, o, a, seed + i) for i in range(n)]), jnp.int32)
  return mdp, table, pi_ref, jnp.asarray(tau)


def test_exact_gradient_equals_autodiff_and_finite_differences(model):
  n, s, a, o = 2, 4, 3, 6
  mdp, table, pi_ref, tau = batched_problem(0, n, s, a, o)
  tokens = random_tokens(3, r=n * s, o=o)
  tokens = lm.pack_candidates(jax.tree.map(lambda x: x.reshape((n, s) + x.shape[1:]), tokens))
  score_fn, params = lm.split_model(model)
  objective = lm.lm_objective(a, "noop", 0)
  problem = (mdp, table, pi_ref, tau)

  j, grads, _ = lm.exact_value_and_grad(score_fn, params, tokens,
                                        lambda lp: objective(lp, problem), micro_batch=3)

  @jax.jit
  def whole(p):
    lp = score_fn(p, tokens.rows()).reshape(n, s, o)
    return objective(lp, problem)

  j_ref, g_ref = jax.value_and_grad(whole)(params)
  np.testing.assert_allclose(j, j_ref, rtol=1e-12)
  flat, _ = flatten_util.ravel_pytree(grads)
  flat_ref, unravel = flatten_util.ravel_pytree(g_ref)
  np.testing.assert_allclose(flat, flat_ref, rtol=1e-8, atol=1e-12)
  assert np.abs(flat_ref).max() > 1e-4                  # a gradient that can be wrong

  # Central differences along random directions of the whole parameter vector.
  p0, unravel_p = flatten_util.ravel_pytree(params)
  rng = np.random.default_rng(0)
  for _ in range(3):
    d = rng.normal(size=p0.shape)
    eps = 1e-6
    fd = (whole(unravel_p(p0 + eps * d)) - whole(unravel_p(p0 - eps * d))) / (2 * eps)
    np.testing.assert_allclose(float(np.dot(flat, d)), float(fd), rtol=1e-6, atol=1e-10)


def test_public_value_and_grad_matches_the_pipeline(model):
  n, s, a, o = 2, 4, 3, 6
  mdp, table, pi_ref, tau = batched_problem(1, n, s, a, o)
  tokens = random_tokens(4, r=n * s, o=o)
  tokens = jax.tree.map(lambda x: x.reshape((n, s) + x.shape[1:]), tokens)
  j, grads = lm.value_and_grad(model, tokens, mdp, table, pi_ref, tau, num_actions=a,
                               invalid="noop", noop_action=0, micro_batch=8)
  score_fn, params = lm.split_model(model, method="unshared")
  objective = lm.lm_objective(a, "noop", 0)
  j2, g2 = jax.jit(jax.value_and_grad(lambda p: objective(
      score_fn(p, tokens.rows()).reshape(n, s, o), (mdp, table, pi_ref, tau))))(params)
  np.testing.assert_allclose(j, j2, rtol=1e-12)
  for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(g2)):
    np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-12)


def test_tabular_softmax_scorer_gives_the_closed_form_gradient():
  s, a = 5, 4
  mdp = hx.random_dense_mdp(jax.random.key(3), s, a, discount=0.85)
  pi_ref = jnp.full((s, a), 1.0 / a)
  tau = 0.2
  theta = jax.random.normal(jax.random.key(4), (s, a), jnp.float64)
  # One row per state; the row's state id rides in its (one-token) prompt.
  tokens = lm.CandidateTokens(prompt_ids=np.arange(s)[:, None], prompt_mask=np.ones((s, 1)),
                              output_ids=np.zeros((s, a, 1)), output_mask=np.ones((s, a, 1)))

  def score_fn(th, rows):
    return jax.nn.log_softmax(th[rows.prompt_ids[:, -1]], axis=-1)

  objective = lm.lm_objective(a, "noop", 0)
  problem = jax.tree.map(lambda x: x[None], (mdp, jnp.tile(jnp.arange(a), (s, 1)), pi_ref))
  tokens1 = jax.tree.map(lambda x: x[None], tokens)
  j, g, _ = lm.exact_value_and_grad(score_fn, theta, tokens1,
                                    lambda lp: objective(lp, problem + (jnp.asarray(tau),)),
                                    micro_batch=2)
  closed = hx.softmax_policy_gradient(mdp, theta, pi_ref, tau)
  np.testing.assert_allclose(g, closed, rtol=1e-9, atol=1e-12)
  j_ref = hx.evaluate_policy(mdp, jax.nn.softmax(theta), pi_ref, tau).value
  np.testing.assert_allclose(j, j_ref, rtol=1e-12)


class CharTokenizer:
  """Characters as tokens, with optional merges (a BPE-like tokenizer for the checks)."""

  eos_token_id = 1
  pad_token_id = 0
  chat_template = None

  def __init__(self, merges=()):
    self.merges = tuple(merges)

  def encode(self, text, add_special_tokens=False):
    pieces = list(text)
    for m in self.merges:
      i, out = 0, []
      while i < len(pieces):
        if i + 1 < len(pieces) and pieces[i] + pieces[i + 1] == m:
          out.append(m)
          i += 2
        else:
          out.append(pieces[i])
          i += 1
      pieces = out
    return [2 + zlib.crc32(p.encode()) % 997 for p in pieces]


def test_encode_candidates_layout():
  tok = CharTokenizer()
  enc = lm.encode_candidates(tok, ["ab\n", "c\n"], [["x", "yz"], ["w"]])
  assert enc.prompt_ids.shape == (2, 3) and enc.output_ids.shape == (2, 2, 3)
  np.testing.assert_array_equal(enc.prompt_mask, [[1, 1, 1], [0, 1, 1]])
  np.testing.assert_array_equal(enc.output_mask[0], [[1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(enc.output_mask[1], [[1, 1, 0], [0, 0, 0]])
  assert int(enc.output_ids[0, 1, 2]) == tok.eos_token_id       # the end-of-output token
  np.testing.assert_array_equal(enc.candidate_mask, [[1, 1], [1, 0]])


def test_tokenizer_that_splits_outputs_differently_is_rejected():
  tok = CharTokenizer(merges=("\nc",))                  # merges across the prompt boundary
  with pytest.raises(ValueError, match="splits differently"):
    lm.encode_candidates(tok, ["task\n"], [["click"]])
  lm.encode_candidates(tok, ["task\n"], [["click"]], check_split=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=["a"], outputs=[["x"], ["y"]]), "one candidate list per prompt"),
    (dict(prompts=["a"], outputs=[["x", "x"]]), "duplicate"),
    (dict(prompts=["a"], outputs=[["xyz"]], output_length=2), "output_length"),
    (dict(prompts=[], outputs=[]), "at least one prompt"),
])
def test_encode_candidates_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lm.encode_candidates(CharTokenizer(), **kwargs)


def test_tokenizer_without_eos_is_rejected():
  tok = CharTokenizer()
  tok.eos_token_id = None
  with pytest.raises(ValueError, match="eos"):
    lm.encode_candidates(tok, ["a"], [["x"]])


def test_candidate_tokens_bad_shapes():
  with pytest.raises(ValueError, match="prompt_mask"):
    lm.CandidateTokens(prompt_ids=np.ones((2, 3)), prompt_mask=np.ones((2, 2)),
                       output_ids=np.ones((2, 1, 1)), output_mask=np.ones((2, 1, 1)))
  with pytest.raises(ValueError, match="output_ids"):
    lm.CandidateTokens(prompt_ids=np.ones((2, 3)), prompt_mask=np.ones((2, 3)),
                       output_ids=np.ones((3, 1, 1)), output_mask=np.ones((3, 1, 1)))
  with pytest.raises(ValueError, match="at least one real token"):
    lm.CandidateTokens(prompt_ids=np.ones((2, 3)), prompt_mask=np.zeros((2, 3)),
                       output_ids=np.ones((2, 1, 1)), output_mask=np.ones((2, 1, 1)))


def test_host_driven_chunks_equal_the_traced_pipeline(model):
  tree = lm.pack_candidates(random_tokens(5, r=7))
  score_fn, params = lm.split_model(model)
  rows = lm.score_rows(score_fn, params, tree, micro_batch=3)
  np.testing.assert_allclose(lm.score_in_chunks(score_fn, params, tree, micro_batch=3), rows,
                             rtol=1e-12, atol=1e-12)
  g = jnp.asarray(np.random.default_rng(0).normal(size=rows.shape))
  ref = lm.pullback(score_fn, params, tree, g, micro_batch=4)
  got = lm.pullback_in_chunks(score_fn, params, tree, g, micro_batch=4)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def test_an_unreachable_action_is_reported():
  table = np.array([[0, 1, -1], [0, 0, 1]])
  avail = np.array([[True, True, False], [True, True, True]])
  lm.check_reachable(table, avail[:, :3] & np.array([True, True, False]))
  with pytest.raises(ValueError, match=r"action 2 \('verify'\) is available in state \(1,\)"):
    lm.check_reachable(table, avail, action_names=("wait", "click", "verify"))
