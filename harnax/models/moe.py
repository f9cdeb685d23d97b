"""Routed mixture of experts with Qwen3-MoE semantics: top-k routing and four exact kernels.

A token's output is ``sum_j w_j * expert_{e_j}(x)`` over its ``k`` routed experts ``e_j``, each
expert a gated MLP ``down(act(gate x) * up x)``. The four kernels below compute this same
quantity (same numbers, same gradients, tested against transformers and against each other);
they differ only in how the work is laid out, which decides their speed on a given device and
input size:

* :func:`experts_ragged`: grouped matmuls over the assignments sorted by expert; k expert MLPs
  per token. The accelerator kernel.
* :func:`experts_sorted`: the same sort, then fixed-capacity expert slots run as one batched
  matmul plus an exact overflow loop; no ``ragged_dot``. The CPU kernel for long inputs.
* :func:`experts_dense`: every expert on every token, batched over the expert axis.
* :func:`experts_gather`: gathers the routed experts' weights per assignment; reads only those.

:func:`choose_moe_impl` resolves ``"auto"`` to one of them; docs/models.md gives the measured
crossovers. All shapes are static, so every kernel works under ``jit``, ``vmap`` and ``grad``
(:func:`experts_ragged`: reverse mode only).
"""

from __future__ import annotations

import math
from typing import Callable

from flax import nnx
import jax
from jax import custom_batching
import jax.numpy as jnp

from harnax.models.layers import activation
from harnax.models.layers import normal_init

Array = jax.Array


def route_top_k(router_logits: Array, *, k: int, normalize: bool) -> tuple[Array, Array]:
  """Qwen3-MoE routing: softmax over all experts (float32), keep the top k.

  Args:
    router_logits: [N, E].
    k: experts per token, ``1 <= k <= E``.
    normalize: ``norm_topk_prob``: renormalize the k kept probabilities to sum to one.

  Returns:
    weights [N, k] float32 and expert indices [N, k] int32.
  """
  num_experts = router_logits.shape[-1]
  if not 1 <= k <= num_experts:
    raise ValueError(f"k: expected an integer in [1, {num_experts}] (the number of experts), "
                     f"got {k}")
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if normalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


def _check_shapes(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                  down: Array) -> None:
  """Shape checks shared by the kernels (trace time, free under jit)."""
  if x.ndim != 2:
    raise ValueError(f"x: expected shape [tokens, hidden], got {x.shape}")
  n, hidden = x.shape
  if experts.ndim != 2 or experts.shape[0] != n:
    raise ValueError(f"experts: expected shape [{n}, k], got {experts.shape}")
  if weights.shape != experts.shape:
    raise ValueError(f"weights: expected shape {experts.shape} (as experts), got {weights.shape}")
  if gate.ndim != 3 or gate.shape[2] != hidden:
    raise ValueError(f"gate: expected shape [experts, intermediate, {hidden}], got {gate.shape}")
  if up.shape != gate.shape:
    raise ValueError(f"up: expected shape {gate.shape} (as gate), got {up.shape}")
  want_down = (gate.shape[0], hidden, gate.shape[1])
  if down.shape != want_down:
    raise ValueError(f"down: expected shape {want_down}, got {down.shape}")


# Grouped matmul against [E, out, in] weights: row block g of lhs [M, in] times rhs[g].T.
_GROUPED_DIMS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])


def _ragged_dot(lhs: Array, rhs: Array, group_sizes: Array) -> Array:
  return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, _GROUPED_DIMS)


def _ragged_dot_vjp(lhs: Array, rhs: Array, group_sizes: Array,
                    cotangent: Array) -> tuple[Array, Array]:
  _, vjp = jax.vjp(lambda l, r: _ragged_dot(l, r, group_sizes), lhs, rhs)
  return vjp(cotangent)


def _one_call_per_item(fn):
  """``fn`` with a batching rule that runs it once per batch item (``lax.map``).

  ``lax.ragged_dot_general``'s own batching rule requires every operand to be batched, and
  the expert weights usually are not (a vmap over token sets shares them).
  """
  wrapped = custom_batching.custom_vmap(fn)

  @wrapped.def_vmap
  def rule(axis_size, in_batched, *args):
    del axis_size
    batched = tuple(a for a, b in zip(args, in_batched) if b)

    def one(items):
      items = iter(items)
      return wrapped(*(next(items) if b else a for a, b in zip(args, in_batched)))

    out = jax.lax.map(one, batched)
    return out, jax.tree.map(lambda _: True, out)

  return wrapped


_ragged_dot_batchable = _one_call_per_item(_ragged_dot)
_ragged_dot_vjp_batchable = _one_call_per_item(_ragged_dot_vjp)


@jax.custom_vjp
def _grouped_matmul(lhs: Array, rhs: Array, group_sizes: Array) -> Array:
  """``lax.ragged_dot_general`` that also works under ``vmap`` with shared weights, and under
  reverse-mode autodiff (``custom_vmap`` alone is not differentiable, hence the explicit VJP);
  forward-mode autodiff is not supported."""
  return _ragged_dot_batchable(lhs, rhs, group_sizes)


def _grouped_matmul_fwd(lhs, rhs, group_sizes):
  return _ragged_dot_batchable(lhs, rhs, group_sizes), (lhs, rhs, group_sizes)


def _grouped_matmul_bwd(residuals, cotangent):
  lhs, rhs, group_sizes = residuals
  d_lhs, d_rhs = _ragged_dot_vjp_batchable(lhs, rhs, group_sizes, cotangent)
  return d_lhs, d_rhs, None  # integer group sizes have no cotangent


_grouped_matmul.defvjp(_grouped_matmul_fwd, _grouped_matmul_bwd)


def _sort_by_expert(experts: Array, num_experts: int) -> tuple[Array, Array, Array, Array]:
  """Sorts the N*k assignments by expert (stable: tokens keep their order within a segment).

  Returns:
    order [N*k]: the assignment at each sorted row; token [N*k]: its token;
    flat [N*k]: the expert of each assignment, unsorted; sizes [E] int32: rows per expert.
  """
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return order, order // experts.shape[1], flat, sizes


def experts_ragged(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, *, act: Callable[[Array], Array]) -> Array:
  """Routed expert MLPs computed only for the chosen (token, expert) pairs.

  Sorts the N*k assignments by expert and runs one grouped matmul per projection
  (``lax.ragged_dot_general``), so the cost is k expert MLPs per token, not E. Under ``vmap``
  the grouped matmuls run once per batch item; reverse-mode autodiff works, forward-mode
  (``jax.jvp``) does not.

  Args:
    x: [N, hidden]; weights: [N, k]; experts: [N, k] int.
    gate, up: [E, I, hidden]; down: [E, hidden, I] (per expert, the HF ``[out, in]`` layout).
    act: the elementwise activation of the gate.
  Returns:
    [N, hidden]: sum over the k chosen experts of weight * expert_mlp(x).
  """
  _check_shapes(x, weights, experts, gate, up, down)
  order, token, _, sizes = _sort_by_expert(experts, gate.shape[0])
  xs = jnp.take(x, token, axis=0)
  h = act(_grouped_matmul(xs, gate, sizes)) * _grouped_matmul(xs, up, sizes)
  y = _grouped_matmul(h, down, sizes)
  y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
  return jnp.zeros_like(x).at[token].add(y)


def _expert_mlp(x: Array, gate: Array, up: Array, down: Array, act) -> Array:
  """One expert's gated MLP on rows ``x [M, hidden]``; weights ``[out, in]``."""
  h = act(jnp.einsum("mh,ih->mi", x, gate)) * jnp.einsum("mh,ih->mi", x, up)
  return jnp.einsum("mi,hi->mh", h, down)


def default_capacity(*, num_tokens: int, k: int, num_experts: int) -> int:
  """Slots per expert of :func:`experts_sorted`: 1.25 times the mean segment length N*k/E,
  rounded up to a multiple of 8, at most N (an expert receives each token at most once)."""
  capacity = -(-int(math.ceil(1.25 * num_tokens * k / num_experts)) // 8) * 8
  return max(1, min(capacity, num_tokens))


def experts_sorted(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, *, act: Callable[[Array], Array], capacity: int | None = None,
                   block: int = 64) -> Array:
  """Same result as :func:`experts_ragged`, as a sort-by-expert grouped matmul without
  ``ragged_dot`` (which XLA:CPU lowers to a slow loop).

  The N*k assignments are sorted by expert. The first ``capacity`` rows of every expert's
  segment go to a slot ``[E, capacity]`` and all experts run as one batched matmul (no
  per-expert weight copies); the rows beyond (an expert routed more than ``capacity``
  tokens) run in a loop over experts in chunks of ``block`` rows, skipped by ``lax.cond``
  for experts that fit. An overflowing expert's weights are indexed once, outside its chunk
  loop, because on CPU indexing a stacked weight copies it. Nothing is dropped, so the result
  is exact; the cost is about ``E * capacity`` rows plus the overflow. Static trip counts keep
  it reverse-differentiable.

  Args:
    x: [N, hidden]; weights: [N, k]; experts: [N, k] int.
    gate, up: [E, I, hidden]; down: [E, hidden, I].
    act: the elementwise activation of the gate.
    capacity: slots per expert (default :func:`default_capacity`); clipped to ``[1, N]``.
    block: rows per overflow chunk; clipped to ``[1, N]``.
  Returns:
    [N, hidden].
  """
  _check_shapes(x, weights, experts, gate, up, down)
  n, k = experts.shape
  num_experts, hidden = gate.shape[0], gate.shape[2]
  m = n * k
  if capacity is None:
    capacity = default_capacity(num_tokens=n, k=k, num_experts=num_experts)
  capacity = max(1, min(capacity, n))
  block = max(1, min(block, n))
  slots = num_experts * capacity

  order, token, flat, sizes = _sort_by_expert(experts, num_experts)
  sorted_experts = flat[order]
  starts = jnp.cumsum(sizes) - sizes
  rank = jnp.arange(m, dtype=jnp.int32) - starts[sorted_experts]  # position in its segment
  # Overflow rows are parked in one extra slot that is dropped.
  slot = jnp.where(rank < capacity, sorted_experts * capacity + rank, slots)
  xs = jnp.take(x, token, axis=0)  # [m, hidden], sorted by expert
  x_slots = jnp.zeros((slots + 1, hidden), x.dtype).at[slot].set(xs)[:slots]
  x_slots = x_slots.reshape(num_experts, capacity, hidden)
  h = act(jnp.einsum("ech,eih->eci", x_slots, gate)) * jnp.einsum("ech,eih->eci", x_slots, up)
  y_slots = jnp.einsum("eci,ehi->ech", h, down).reshape(slots, hidden)
  ys = jnp.take(y_slots, jnp.minimum(slot, slots - 1), axis=0)  # overflow rows: filled below

  max_chunks = -(-(n - capacity) // block)
  if max_chunks > 0:
    pad = jnp.zeros((block, hidden), x.dtype)  # the last chunk may run past the end
    xs, ys = jnp.concatenate([xs, pad]), jnp.concatenate([ys, pad])

    def per_expert(e, ys):
      overflow = sizes[e] - capacity

      def expert_overflow(ys):
        ge, ue, de = gate[e], up[e], down[e]  # one copy per overflowing expert, not per chunk

        def chunk(j, ys):
          def compute(ys):
            row = starts[e] + capacity + j * block
            xc = jax.lax.dynamic_slice_in_dim(xs, row, block)
            yc = _expert_mlp(xc, ge, ue, de, act)
            # Rows past this segment belong to other experts: keep them.
            mine = (j * block + jnp.arange(block)) < overflow
            old = jax.lax.dynamic_slice_in_dim(ys, row, block)
            return jax.lax.dynamic_update_slice_in_dim(
                ys, jnp.where(mine[:, None], yc.astype(ys.dtype), old), row, 0)
          return jax.lax.cond(j * block < overflow, compute, lambda ys: ys, ys)

        return jax.lax.fori_loop(0, max_chunks, chunk, ys)

      return jax.lax.cond(overflow > 0, expert_overflow, lambda ys: ys, ys)

    ys = jax.lax.fori_loop(0, num_experts, per_expert, ys)[:m]

  # Unsort by a scatter of the permutation (cheaper than a second argsort).
  inverse = jnp.zeros((m,), jnp.int32).at[order].set(jnp.arange(m, dtype=jnp.int32))
  y = jnp.take(ys, inverse, axis=0).reshape(n, k, hidden)
  return jnp.einsum("nkh,nk->nh", y, weights.astype(y.dtype))


def experts_dense(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                  down: Array, *, act: Callable[[Array], Array]) -> Array:
  """Same result as :func:`experts_ragged`, computing every expert on every token.

  E/k times the FLOPs, but only einsums batched over the expert axis: the layout that shards
  trivially over experts, and a good one when the input touches most experts anyway (a batch
  of decode steps). The weights are the left operand (``W @ x.T``, tokens as the short minor
  dimension), the faster order on CPU for a few tokens.

  Args and returns as :func:`experts_ragged`.
  """
  _check_shapes(x, weights, experts, gate, up, down)
  num_experts = gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32) * weights[..., None],
                    axis=1)  # [N, E]
  xt = jnp.broadcast_to(x.T[None], (num_experts,) + x.T.shape)  # [E, hidden, N]
  h = act(jnp.einsum("eih,ehn->ein", gate, xt)) * jnp.einsum("eih,ehn->ein", up, xt)
  y = jnp.einsum("ehi,ein->ehn", down, h)
  return jnp.einsum("ehn,ne->nh", y, combine.astype(y.dtype))


def experts_gather(x: Array, weights: Array, experts: Array, gate: Array, up: Array,
                   down: Array, *, act: Callable[[Array], Array]) -> Array:
  """Same result as :func:`experts_ragged`, gathering the routed experts' weights.

  The N*k routed experts' weights are gathered once per projection (``[N*k, out, in]``) and
  every assignment runs as one batched matrix-vector product. It reads only the routed
  experts, so it suits decoding a few tokens. On CPU a gather of weights is a copy, so its
  cost grows with N*k: past about E assignments, :func:`experts_dense` reads less.

  Args and returns as :func:`experts_ragged`.
  """
  _check_shapes(x, weights, experts, gate, up, down)
  n, k = experts.shape
  flat = experts.reshape(-1)
  xs = jnp.repeat(x, k, axis=0)  # [N*k, hidden]: assignment j belongs to token j // k
  h = (act(jnp.einsum("aih,ah->ai", jnp.take(gate, flat, axis=0), xs))
       * jnp.einsum("aih,ah->ai", jnp.take(up, flat, axis=0), xs))
  y = jnp.einsum("ahi,ai->ah", jnp.take(down, flat, axis=0), h)
  y = y * weights.reshape(-1, 1).astype(y.dtype)
  return jnp.sum(y.reshape(n, k, -1), axis=1)


MOE_IMPLS = {"ragged": experts_ragged, "sorted": experts_sorted, "dense": experts_dense,
             "gather": experts_gather}


def check_moe_impl(impl: str) -> str:
  """Returns ``impl`` if it is ``"auto"`` or a key of :data:`MOE_IMPLS`; raises otherwise."""
  if impl != "auto" and impl not in MOE_IMPLS:
    raise ValueError(f"moe_impl: expected 'auto' or one of {sorted(MOE_IMPLS)}, got {impl!r}")
  return impl


def choose_moe_impl(impl: str, *, num_tokens: int, k: int, num_experts: int) -> str:
  """The kernel (a key of :data:`MOE_IMPLS`) that runs ``num_tokens`` tokens.

  An explicit ``impl`` is returned as is. ``"auto"`` picks grouped matmuls (``ragged``) on
  accelerators. On CPU, where ``ragged_dot`` lowers poorly, it goes by the number of
  (token, expert) assignments N*k: ``gather`` below E (a few decoded tokens read only their
  experts' weights), ``dense`` up to 8E (a batch of decoded tokens touches most experts
  anyway), ``sorted`` beyond (prefill). The crossovers are measured (docs/models.md); every
  choice gives the same numbers.
  """
  if check_moe_impl(impl) != "auto":
    return impl
  if jax.default_backend() != "cpu":
    return "ragged"
  assignments = num_tokens * k
  if assignments < num_experts:
    return "gather"
  return "dense" if assignments <= 8 * num_experts else "sorted"


class MoE(nnx.Module):
  """Top-k routed experts with Qwen3-MoE semantics (no shared expert).

  Parameters: ``router [E, hidden]`` (HF ``mlp.gate.weight``) and per-expert projections
  stacked on a leading expert axis, each in the HF ``[out, in]`` layout
  (HF ``mlp.experts.{e}.*_proj.weight``): gate and up ``[E, I, hidden]``, down ``[E, hidden, I]``.
  """

  def __init__(self, cfg, *, dtype, rngs: nnx.Rngs, impl: str = "auto"):
    e, hdim, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    self.impl = check_moe_impl(impl)
    self.router = nnx.Param(normal_init(rngs, (e, hdim), dtype), axes=(None, "embed"))
    self.gate_proj = nnx.Param(normal_init(rngs, (e, i, hdim), dtype),
                               axes=("experts", "mlp", "embed"))
    self.up_proj = nnx.Param(normal_init(rngs, (e, i, hdim), dtype),
                             axes=("experts", "mlp", "embed"))
    self.down_proj = nnx.Param(normal_init(rngs, (e, hdim, i), dtype),
                               axes=("experts", "embed", "mlp"))
    self.k = cfg.num_experts_per_tok
    self.normalize = cfg.norm_topk_prob
    self.act = cfg.activation

  def __call__(self, x: Array) -> Array:
    """[..., hidden] -> [..., hidden]."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    router_logits = jnp.einsum("nh,eh->ne", flat, self.router[...])
    weights, experts = route_top_k(router_logits, k=self.k, normalize=self.normalize)
    name = choose_moe_impl(self.impl, num_tokens=flat.shape[0], k=self.k,
                           num_experts=self.gate_proj.shape[0])
    out = MOE_IMPLS[name](flat, weights, experts, self.gate_proj[...], self.up_proj[...],
                          self.down_proj[...], act=activation(self.act))
    return out.reshape(shape)
