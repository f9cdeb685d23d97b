"""Routed mixture of experts: every kernel against transformers' block and a float64 numpy
reference, the same gradients from every kernel, and ``auto`` agreeing with all of them at
input sizes on both sides of every crossover."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from harnax.models import moe

KERNELS = {
    "ragged": moe.experts_ragged,
    "sorted": moe.experts_sorted,
    # capacity=1 sends most rows down the overflow loop; block=2 makes chunks overrun into
    # the next expert's segment.
    "sorted_overflow": functools.partial(moe.experts_sorted, capacity=1, block=2),
    "dense": moe.experts_dense,
    "gather": moe.experts_gather,
}


def silu64(x):
  return x / (1.0 + np.exp(-x))


def reference_moe(x, router, gate, up, down, *, k, normalize):
  """float64 numpy Qwen3-MoE block: softmax routing, top k, per-token sum of expert MLPs.

  x [N, H]; router [E, H]; gate, up [E, I, H]; down [E, H, I] -> [N, H].
  """
  x, router, gate, up, down = (np.asarray(a, np.float64) for a in (x, router, gate, up, down))
  logits = x @ router.T
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    top = np.argsort(-probs[n])[:k]
    w = probs[n, top]
    if normalize:
      w = w / w.sum()
    for weight, e in zip(w, top):
      out[n] += weight * (down[e] @ (silu64(gate[e] @ x[n]) * (up[e] @ x[n])))
  return out


def random_experts(seed, *, hidden, inter, num_experts, scale=0.5):
  rng = np.random.RandomState(seed)
  router = rng.randn(num_experts, hidden).astype(np.float32)
  gate, up = (rng.randn(num_experts, inter, hidden).astype(np.float32) * scale for _ in range(2))
  down = rng.randn(num_experts, hidden, inter).astype(np.float32) * scale
  return router, gate, up, down


@pytest.mark.parametrize("normalize", [False, True])
def test_every_kernel_matches_the_transformers_block(normalize):
  from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
  cfg = transformers.Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=8, num_experts=5,
                                    num_experts_per_tok=2, norm_topk_prob=normalize)
  torch.manual_seed(0)
  block = Qwen3MoeSparseMoeBlock(cfg)
  with torch.no_grad():
    for p in block.parameters():
      p.normal_(0, 0.3)
  x = np.random.RandomState(2).randn(3, 5, 16).astype(np.float32)
  with torch.no_grad():
    ref = block(torch.tensor(x)).numpy()
  gate_up = block.experts.gate_up_proj.detach().numpy()  # [E, 2I, H]: [out, in] per expert
  gate, up = jnp.asarray(gate_up[:, :8]), jnp.asarray(gate_up[:, 8:])
  down = jnp.asarray(block.experts.down_proj.detach().numpy())  # [E, H, I]
  router = jnp.asarray(block.gate.weight.detach().numpy())  # [E, H]
  flat = jnp.asarray(x.reshape(-1, 16))
  w, e = moe.route_top_k(flat @ router.T, k=2, normalize=normalize)
  for name, fn in KERNELS.items():
    out = jax.jit(functools.partial(fn, act=jax.nn.silu))(flat, w, e, gate, up, down)
    out = out.reshape(x.shape)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, err_msg=name)


def test_route_top_k_against_numpy():
  logits = np.random.RandomState(3).randn(6, 7).astype(np.float32)
  probs = np.exp(logits.astype(np.float64))
  probs /= probs.sum(-1, keepdims=True)
  top = np.argsort(-probs, axis=-1)[:, :3]
  kept = np.take_along_axis(probs, top, axis=-1)
  for normalize, want in ((False, kept), (True, kept / kept.sum(-1, keepdims=True))):
    w, e = moe.route_top_k(jnp.asarray(logits), k=3, normalize=normalize)
    np.testing.assert_array_equal(np.asarray(e), top)
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-6)
    assert w.dtype == jnp.float32 and e.dtype == jnp.int32


def test_kernels_have_the_same_gradients():
  """Training may run any kernel (``auto`` picks by input size), so all must differentiate."""
  n, hidden, inter, num_experts, k = 7, 6, 5, 4, 2
  x = jnp.asarray(np.random.RandomState(0).randn(n, hidden), jnp.float32)
  router, gate, up, down = map(jnp.asarray, random_experts(0, hidden=hidden, inter=inter,
                                                           num_experts=num_experts))

  def loss(fn, x, gate, up, down):
    w, e = moe.route_top_k(x @ router.T, k=k, normalize=True)
    return jnp.sum(jnp.sin(fn(x, w, e, gate, up, down, act=jax.nn.silu)))

  grads = {name: jax.jit(jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3)))(
      x, gate, up, down) for name, fn in KERNELS.items()}
  for name, g in grads.items():
    for got, want in zip(g, grads["dense"]):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, err_msg=name)


class _Cfg:
  """The fields :class:`moe.MoE` reads, for a 16-expert top-4 block like the benchmark's."""

  num_experts, hidden_size, moe_intermediate_size = 16, 8, 6
  num_experts_per_tok, norm_topk_prob, activation = 4, True, "silu"


# A decoded token, a few, a decode batch, and prefills: on CPU they cover every kernel
# ``auto`` chooses from, on both sides of each crossover.
TOKEN_COUNTS = [1, 3, 4, 32, 33, 80]


@pytest.mark.parametrize("num_tokens", TOKEN_COUNTS)
def test_auto_and_every_kernel_match_a_float64_reference_at_every_size(num_tokens):
  cfg = _Cfg()
  x = np.random.RandomState(num_tokens).randn(2, num_tokens, cfg.hidden_size).astype(np.float32)
  block = moe.MoE(cfg, dtype=jnp.float32, rngs=nnx.Rngs(7))
  outputs = {}
  for impl in ["auto", *moe.MOE_IMPLS]:
    same = moe.MoE(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0), impl=impl)
    nnx.update(same, nnx.state(block, nnx.Param))
    outputs[impl] = np.asarray(nnx.jit(lambda b, x: b(x))(same, jnp.asarray(x)))
  ref = reference_moe(x.reshape(-1, cfg.hidden_size), block.router[...], block.gate_proj[...],
                      block.up_proj[...], block.down_proj[...], k=cfg.num_experts_per_tok,
                      normalize=True).reshape(x.shape)
  for impl, out in outputs.items():
    assert out.shape == x.shape
    # The random init has weights of std 0.02: outputs are ~1e-4, so the bound is relative.
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-9, err_msg=impl)


@pytest.mark.parametrize("num_tokens", TOKEN_COUNTS)
def test_auto_resolves_to_a_kernel_and_explicit_choices_are_kept(num_tokens):
  kw = dict(num_tokens=num_tokens, k=4, num_experts=16)
  assert moe.choose_moe_impl("auto", **kw) in moe.MOE_IMPLS
  for impl in moe.MOE_IMPLS:
    assert moe.choose_moe_impl(impl, **kw) == impl


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU choice of kernel")
@pytest.mark.parametrize("num_tokens", TOKEN_COUNTS)
def test_auto_avoids_ragged_dot_on_cpu(num_tokens):
  # XLA:CPU lowers ragged_dot to a loop that is slower than every other kernel.
  assert moe.choose_moe_impl("auto", num_tokens=num_tokens, k=4, num_experts=16) != "ragged"


def test_kernels_under_vmap_equal_one_call_per_item():
  router, gate, up, down = map(jnp.asarray, random_experts(5, hidden=6, inter=5, num_experts=4))
  xs = jnp.asarray(np.random.RandomState(6).randn(3, 9, 6), jnp.float32)
  for name, fn in KERNELS.items():
    def one(x, fn=fn):
      w, e = moe.route_top_k(x @ router.T, k=2, normalize=False)
      return fn(x, w, e, gate, up, down, act=jax.nn.silu)
    batched = np.asarray(jax.jit(jax.vmap(one))(xs))
    single = jax.jit(one)
    for i in range(xs.shape[0]):
      np.testing.assert_allclose(batched[i], np.asarray(single(xs[i])), atol=1e-5, err_msg=name)


def test_bad_inputs_raise_naming_the_field():
  _, gate, up, down = map(jnp.asarray, random_experts(0, hidden=6, inter=5, num_experts=4))
  x = jnp.ones((3, 6))
  w, e = moe.route_top_k(jnp.ones((3, 4)), k=2, normalize=False)
  with pytest.raises(ValueError, match="moe_impl: expected 'auto' or one of"):
    moe.choose_moe_impl("fast", num_tokens=3, k=2, num_experts=4)
  with pytest.raises(ValueError, match="moe_impl"):
    moe.MoE(_Cfg(), dtype=jnp.float32, rngs=nnx.Rngs(0), impl="fast")
  with pytest.raises(ValueError, match=r"k: expected an integer in \[1, 4\]"):
    moe.route_top_k(jnp.ones((3, 4)), k=5, normalize=False)
  with pytest.raises(ValueError, match="down: expected shape"):
    moe.experts_dense(x, w, e, gate, up, down[:, :, :4], act=jax.nn.silu)
  with pytest.raises(ValueError, match="weights: expected shape"):
    moe.experts_sorted(x, w[:, :1], e, gate, up, down, act=jax.nn.silu)
  with pytest.raises(ValueError, match="x: expected shape"):
    moe.experts_gather(x[None], w, e, gate, up, down, act=jax.nn.silu)


def test_per_example_gradients_under_vmap_agree_across_kernels():
  """vmap of grad with shared expert weights: the case ragged_dot cannot batch by itself."""
  router, gate, up, down = map(jnp.asarray, random_experts(8, hidden=6, inter=5, num_experts=4))
  xs = jnp.asarray(np.random.RandomState(9).randn(2, 5, 6), jnp.float32)

  def loss(fn, gate, x):
    w, e = moe.route_top_k(x @ router.T, k=2, normalize=True)
    return jnp.sum(jnp.sin(fn(x, w, e, gate, up, down, act=jax.nn.silu)))

  per_example = {name: np.asarray(jax.jit(jax.vmap(jax.grad(functools.partial(loss, fn)),
                                                   (None, 0)))(gate, xs))
                 for name, fn in (("ragged", moe.experts_ragged), ("dense", moe.experts_dense))}
  single = jax.jit(jax.grad(functools.partial(loss, moe.experts_dense)))
  for i in range(xs.shape[0]):
    one = np.asarray(single(gate, xs[i]))
    np.testing.assert_allclose(per_example["ragged"][i], one, atol=1e-5)
    np.testing.assert_allclose(per_example["dense"][i], one, atol=1e-5)
