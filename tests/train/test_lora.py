"""harnax.train.lora: adapters as a parameter transform, and LoRA training through the loop.

References: the low-rank formula written out in NumPy on harnax's `Linear` (`[out, in]`
kernels), `jax.grad` of the composed function, and the closed-form adapter gradients
`dA = s G^T B^T`, `dB = s A^T G^T` (`G` the gradient w.r.t. an `[out, in]` kernel).
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import models
from harnax import train
from harnax.core import mdp as mdp_lib
from harnax.models import layers
from harnax.train import lora

pytestmark = pytest.mark.x64

V = 40
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_lm():
  cfg = models.Qwen3Config.from_hf_dict(dict(
      architectures=["Qwen3ForCausalLM"], vocab_size=V, hidden_size=16, intermediate_size=24,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
      max_position_embeddings=64, rope_theta=1000.0, tie_word_embeddings=False))
  model = models.from_config(cfg, seed=0, param_dtype=jnp.float64)
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, state)
  return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def lm_params():
  return nnx.split(tiny_lm())                    # (graphdef, params)


def leaves_by_name(tree):
  return dict(zip(lora.param_names(tree), jax.tree.leaves(tree)))


def test_default_targets_are_the_projection_kernels_and_b_zero_is_the_identity(lm_params):
  _, params = lm_params
  cfg = train.default_config()
  adapters = lora.init_lora(params, rank=3, targets=cfg.lora_targets, key=jax.random.key(0))
  want = sorted(f"layers/{i}/{'mlp' if p in PROJ[4:] else 'attn'}/{p}/kernel"
                for i in range(2) for p in PROJ)
  assert sorted(adapters) == want
  base = leaves_by_name(params)
  for name, ad in adapters.items():
    out_dim, in_dim = base[name].shape                         # Linear kernels are [out, in]
    assert ad["a"].shape == (in_dim, 3) and ad["b"].shape == (3, out_dim)
    np.testing.assert_array_equal(ad["b"], 0.0)
    assert 0.3 < float(jnp.std(ad["a"]) * np.sqrt(in_dim)) < 2.0   # std 1/sqrt(in)
  merged = lora.merge_lora(params, adapters, alpha=16.0, rank=3)
  assert jax.tree.structure(merged) == jax.tree.structure(params)
  for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(params)):
    np.testing.assert_array_equal(x, y)
  # Another seed, other A; the same seed, the same A.
  again = lora.init_lora(params, rank=3, targets=cfg.lora_targets, key=jax.random.key(0))
  other = lora.init_lora(params, rank=3, targets=cfg.lora_targets, key=jax.random.key(1))
  name = want[0]
  np.testing.assert_array_equal(again[name]["a"], adapters[name]["a"])
  assert not np.array_equal(other[name]["a"], adapters[name]["a"])


def test_merged_linear_layer_computes_the_low_rank_update():
  layer = layers.Linear(5, 7, axes=("embed", "mlp"), rngs=nnx.Rngs(0), dtype=jnp.float64)
  graphdef, params = nnx.split(layer)
  adapters = lora.init_lora(params, rank=2, targets="kernel$", key=jax.random.key(1))
  rng = np.random.default_rng(0)
  adapters["kernel"]["b"] = jnp.asarray(rng.normal(size=(2, 7)))
  merged = lora.merge_lora(params, adapters, alpha=3.0, rank=2)
  x = rng.normal(size=(4, 5))
  w = np.asarray(params["kernel"][...])
  a, b = np.asarray(adapters["kernel"]["a"]), np.asarray(adapters["kernel"]["b"])
  want = x @ w.T + 1.5 * (x @ a) @ b                          # alpha / r = 1.5
  np.testing.assert_allclose(nnx.merge(graphdef, merged)(jnp.asarray(x)), want, rtol=1e-12)
  # An [in, out] kernel of a plain pytree: W + s A @ B without the transpose.
  plain = {"w": jnp.asarray(rng.normal(size=(5, 7)))}
  ad = {"w": {"a": jnp.asarray(a), "b": jnp.asarray(b)}}
  out = lora.merge_lora(plain, ad, alpha=3.0, rank=2, layout="in_out")
  np.testing.assert_allclose(out["w"], np.asarray(plain["w"]) + 1.5 * a @ b, rtol=1e-12)


def test_gradient_through_the_merge(lm_params):
  _, params = lm_params
  adapters = lora.init_lora(params, rank=2, targets=r"(q_proj|down_proj)/kernel$",
                            key=jax.random.key(2))
  rng = np.random.default_rng(3)
  adapters = {k: {"a": v["a"], "b": jnp.asarray(rng.normal(size=v["b"].shape))}
              for k, v in adapters.items()}
  weights = [jnp.asarray(rng.normal(size=x.shape)) for x in jax.tree.leaves(params)]

  def loss(p):                                          # a nonlinear function of every leaf
    return sum(jnp.sum(w * jnp.tanh(x)) for w, x in zip(weights, jax.tree.leaves(p)))

  merge = lambda ad: lora.merge_lora(params, ad, alpha=5.0, rank=2)  # noqa: E731
  composed = jax.grad(lambda ad: loss(merge(ad)))(adapters)
  merged, pullback = jax.vjp(merge, adapters)
  (through_vjp,) = pullback(jax.grad(loss)(merged))
  full = leaves_by_name(jax.grad(loss)(merged))
  for name, ad in adapters.items():
    for k in ("a", "b"):
      np.testing.assert_allclose(through_vjp[name][k], composed[name][k], rtol=1e-12)
    g = np.asarray(full[name])                          # [out, in]
    a, b = np.asarray(ad["a"]), np.asarray(ad["b"])
    np.testing.assert_allclose(composed[name]["a"], 2.5 * g.T @ b.T, rtol=1e-10)
    np.testing.assert_allclose(composed[name]["b"], 2.5 * a.T @ g.T, rtol=1e-10)


def test_lora_init_and_merge_reject_bad_inputs(lm_params):
  _, params = lm_params
  key = jax.random.key(0)
  for rank in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="rank: expected a positive integer"):
      lora.init_lora(params, rank=rank, targets="kernel", key=key)
  with pytest.raises(ValueError, match="targets: '\\(attn' is not a valid regular expression"):
    lora.init_lora(params, rank=2, targets="(attn", key=key)
  with pytest.raises(ValueError, match="targets: 'lm_heads' matches no parameter path .*"
                                       "layers/0/attn/"):
    lora.init_lora(params, rank=2, targets="lm_heads", key=key)
  with pytest.raises(ValueError,
                     match=r"matches no 2-D floating kernel .*attn/k_norm/weight \[4\]"):
    lora.init_lora(params, rank=2, targets="norm/weight$", key=key)
  with pytest.raises(ValueError, match="layout: expected one of"):
    lora.init_lora(params, rank=2, targets="q_proj", key=key, layout="transposed")
  ad = lora.init_lora(params, rank=2, targets="layers/0/attn/q_proj", key=key)
  with pytest.raises(ValueError, match="alpha: expected a positive finite number"):
    lora.merge_lora(params, ad, alpha=0.0, rank=2)
  with pytest.raises(ValueError, match=r"expected a \[16, 3\] and b \[3, 16\]"):
    lora.merge_lora(params, ad, alpha=1.0, rank=3)
  with pytest.raises(ValueError, match="adapters: no parameter of params is named"):
    lora.merge_lora(params, {"layers/9/attn/q_proj/kernel": ad["layers/0/attn/q_proj/kernel"]},
                    alpha=1.0, rank=2)
  with pytest.raises(ValueError, match="expected a dict with keys 'a' and 'b'"):
    lora.merge_lora(params, {"layers/0/attn/q_proj/kernel": {"a": 1}}, alpha=1.0, rank=2)
  with pytest.raises(ValueError, match="adapters: expected a dict"):
    lora.merge_lora(params, [ad], alpha=1.0, rank=2)


# -- LoRA training through the loop, on an exact LM policy gradient ------------------------------


def lm_problem(n=2, s=3, tp=4, tc=2):
  """n instances of an s-state, 2-action task: candidate a of a state means action a.

  Returns the full sequences of every (instance, state, candidate) `[n * s * 2, tp + tc]`
  (ids, mask, candidate span) and the MDPs `[n]`.
  """
  rng = np.random.default_rng(0)
  prompts = np.repeat(rng.integers(1, V, (n * s, 1, tp)), 2, axis=1).reshape(-1, tp)
  outputs = rng.integers(1, V, (n * s * 2, tc))
  ids, mask, span = models.concat_completion(
      jnp.asarray(prompts), jnp.ones_like(prompts), jnp.asarray(outputs), jnp.ones_like(outputs))
  mdps = mdp_lib.stack([hx.random_dense_mdp(jax.random.key(i), s, 2, discount=0.9)
                        for i in range(n)])
  return ids, mask, span, mdps


def lm_return(graphdef, params, batch, n=2, s=3, tau=0.5):
  """The mean exact return of the model's policy: action a has the probability of candidate
  a; the mass outside both candidates executes action 0 (the harness's no-op)."""
  ids, mask, span, mdps = batch
  model = nnx.merge(graphdef, params)
  p = jnp.exp(models.score_spans(model, ids, mask, span).total).reshape(n, s, 2)
  policy = p.at[..., 0].add(1.0 - p.sum(-1))
  pi_ref = jnp.full((s, 2), 0.5)
  one = lambda m, pi: hx.evaluate_policy(m, pi, pi_ref, tau).value  # noqa: E731
  return jnp.mean(jax.vmap(one)(mdps, policy))


def test_one_lora_sgd_step_moves_b_by_the_closed_form(lm_params, tmp_path):
  _, params = lm_params
  rng = np.random.default_rng(4)
  weights = [jnp.asarray(rng.normal(size=x.shape)) for x in jax.tree.leaves(params)]

  def fn(p, batch):
    loss = lambda q: sum(jnp.sum(w * jnp.tanh(x)) for w, x in zip(weights, jax.tree.leaves(q)))
    value, grads = jax.value_and_grad(loss)(p)
    return value, grads, {}

  cfg = dict(finetune="lora", lora_rank=2, lora_alpha=4.0, optimizer="sgd", learning_rate=0.5,
             num_steps=1, log_every=0)
  out = train.train(cfg, fn, params, jnp.zeros(1), workdir=str(tmp_path), progress=False)
  # From B = 0 the ascent step leaves A and moves B by lr * s * A^T G^T (s = alpha/r = 2).
  g = leaves_by_name(fn(params, None)[1])
  assert len(out.adapters) == 14
  for name, ad in out.adapters.items():
    want_b = 0.5 * 2.0 * np.asarray(ad["a"]).T @ np.asarray(g[name]).T
    np.testing.assert_allclose(ad["b"], want_b, rtol=1e-10, atol=1e-14)
    assert np.abs(want_b).max() > 1e-3
  merged = leaves_by_name(out.params)
  for name, x in leaves_by_name(lora.merge_lora(params, out.adapters, alpha=4.0,
                                                rank=2)).items():
    np.testing.assert_array_equal(merged[name], x)


def test_lora_training_on_the_exact_lm_policy_gradient(lm_params, tmp_path):
  graphdef, params = lm_params
  problem = lm_problem()

  def fn(p, batch):
    value, grads = jax.value_and_grad(lambda q: lm_return(graphdef, q, batch))(p)
    return value, grads, {}

  cfg = train.default_config()
  cfg.update(finetune="lora", lora_rank=2, lora_alpha=4.0, learning_rate=0.05, num_steps=3,
             log_every=0)
  cfg.keep_steps = (1,)
  out = train.train(cfg, fn, params, problem, workdir=str(tmp_path), progress=False)
  # A kept checkpoint holds the adapters; restore_params merges them into the base.
  restored = leaves_by_name(train.restore_params(cfg, params, str(tmp_path), 3))
  for name, x in leaves_by_name(out.params).items():
    np.testing.assert_array_equal(restored[name], x, err_msg=name)
  one = train.train(dict(cfg, num_steps=1, keep_steps=()), fn, params, problem,
                    workdir=str(tmp_path / "one"), progress=False)
  restored = leaves_by_name(train.restore_params(cfg, params, str(tmp_path), 1))
  for name, x in leaves_by_name(one.params).items():
    np.testing.assert_array_equal(restored[name], x, err_msg=name)
  values = [h["value"] for h in out.history]
  assert len(values) == 3 and values[-1] > values[0]
  base, merged = leaves_by_name(params), leaves_by_name(out.params)
  assert set(merged) == set(base)
  for name in base:
    delta = np.asarray(merged[name]) - np.asarray(base[name])
    if name in out.adapters:
      assert 0 < np.linalg.matrix_rank(delta, tol=1e-10) <= 2, name
    else:                                        # not adapted: bit-identical to the base
      np.testing.assert_array_equal(delta, 0.0, err_msg=name)

  cfg.lora_targets = "no_such_layer"
  with pytest.raises(ValueError, match="config.lora_targets: 'no_such_layer' matches no"):
    train.train(cfg, fn, params, problem, workdir=str(tmp_path / "x"), progress=False)
