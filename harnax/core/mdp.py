"""Finite MDP containers, dense and sparse, and the transition products on them.

Conventions (docs/theory.md): `P[s, a, s']`, `r[s, a]`, `0 <= gamma < 1`,
`mu0[s]`. Terminal states are ordinary states with a self-loop and zero reward.

Both containers are pytrees (`pytree.container`). Construction validates
(shapes always; values when concrete) and raises `ValueError` naming the field.
Rebuilding from leaves — as `jit`, `vmap` and `tree_map` do — skips validation,
so the containers carry tracers and `in_axes` specs freely.

A *batch* of MDPs is the same container with leading batch axes on every leaf
(`transitions [B, S, A, S]`, `rewards [B, S, A]`, `discount [B]`,
`initial [B, S]`); map a function over it with `jax.vmap`. To share one
transition tensor across a batch of rewards, map with
`in_axes=TabularMDP.axes(transitions=None)`: `vmap` then turns each sweep's
matrix-vector product into one matrix product.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from harnax import pytree
from harnax.core import validation as val

Array = jax.Array


def _validate_common(kernel_name, kernel, rewards, discount, initial, batch, s, a):
  """Checks shared by both containers; `kernel` is P or the successor probabilities."""
  val.check_shape("rewards", rewards, batch + (s, a), f"[S, A] matching {kernel_name}")
  val.check_shape("initial", initial, batch + (s,), f"[S] matching {kernel_name}")
  val.check_shape("discount", discount, batch, "a scalar per MDP")
  for name, x in ((kernel_name, kernel), ("rewards", rewards), ("discount", discount),
                  ("initial", initial)):
    val.check_finite(name, x)
  val.check_distribution(kernel_name, kernel)
  val.check_distribution("initial", initial)
  val.check_discount(discount)


class _Sizes:
  """`num_states` and `num_actions` read from `rewards [..., S, A]` (both containers)."""

  @property
  def num_states(self) -> int:
    return self.rewards.shape[-2]

  @property
  def num_actions(self) -> int:
    return self.rewards.shape[-1]


@pytree.container
class TabularMDP(_Sizes):
  """A finite MDP with dense transitions.

  Attributes:
    transitions: `P[s, a, s']`, shape `[S, A, S]`; each `P[s, a, :]` sums to 1.
    rewards: `r[s, a]`, shape `[S, A]`.
    discount: `gamma`, scalar in `[0, 1)`.
    initial: `mu0[s]`, shape `[S]`, a distribution.
  """

  transitions: Array
  rewards: Array
  discount: Array
  initial: Array

  def __init__(self, *, transitions, rewards, discount, initial):
    rewards = val.as_float_array("rewards", rewards)
    dtype = rewards.dtype
    transitions = val.as_float_array("transitions", transitions, dtype)
    discount = val.as_float_array("discount", discount, dtype)
    initial = val.as_float_array("initial", initial, dtype)
    if transitions.ndim < 3:
      raise ValueError(
          f"transitions: expected shape [S, A, S] (with optional leading batch axes), got "
          f"{list(transitions.shape)}")
    *batch, s, a, s2 = transitions.shape
    batch = tuple(batch)
    if s != s2:
      raise ValueError(f"transitions: expected shape [S, A, S] with equal state axes, got "
                       f"{list(transitions.shape)}")
    _validate_common("transitions", transitions, rewards, discount, initial, batch, s, a)
    pytree.set_fields(self, transitions=transitions, rewards=rewards, discount=discount,
                initial=initial)

  @classmethod
  def axes(cls, *, transitions: Any = 0, rewards: Any = 0, discount: Any = 0,
           initial: Any = 0) -> "TabularMDP":
    """An `in_axes` spec for `jax.vmap` (e.g. `transitions=None` to share P)."""
    return pytree.unvalidated(cls, transitions=transitions, rewards=rewards, discount=discount,
                              initial=initial)

  def __repr__(self):
    return (f"TabularMDP(S={self.num_states}, A={self.num_actions}, "
            f"dtype={self.rewards.dtype}, batch={tuple(self.rewards.shape[:-2])})")


@pytree.container
class SparseTabularMDP(_Sizes):
  """A finite MDP with K successors per state-action (K = 1: deterministic).

  Attributes:
    successors: int32 `[S, A, K]`, successor state indices.
    probabilities: `[S, A, K]`, each `[s, a, :]` sums to 1 (duplicates allowed).
    rewards: `[S, A]`.
    discount: scalar in `[0, 1)`.
    initial: `[S]`, a distribution.

  A sweep reads `S*A*K` successor values with a gather; transposed products
  (occupancy, adjoints) are segment sums over the successor indices.
  """

  successors: Array
  probabilities: Array
  rewards: Array
  discount: Array
  initial: Array

  def __init__(self, *, successors, probabilities=None, rewards, discount, initial):
    rewards = val.as_float_array("rewards", rewards)
    dtype = rewards.dtype
    if successors is None:
      raise ValueError("successors: expected an integer array [S, A, K], got None")
    successors = jnp.asarray(successors)
    if not jnp.issubdtype(successors.dtype, jnp.integer):
      raise ValueError(f"successors: expected integer state indices, got dtype {successors.dtype}")
    if successors.ndim == rewards.ndim:  # [S, A] deterministic shorthand
      successors = successors[..., None]
    successors = successors.astype(jnp.int32)
    if probabilities is None:
      probabilities = jnp.ones(successors.shape, dtype)
    probabilities = val.as_float_array("probabilities", probabilities, dtype)
    discount = val.as_float_array("discount", discount, dtype)
    initial = val.as_float_array("initial", initial, dtype)
    if successors.ndim < 3:
      raise ValueError(f"successors: expected shape [S, A, K], got {list(successors.shape)}")
    *batch, s, a, k = successors.shape
    batch = tuple(batch)
    val.check_shape("probabilities", probabilities, batch + (s, a, k), "[S, A, K] like successors")
    succ = val.host(successors)
    if succ is not None and (np.any(succ < 0) or np.any(succ >= s)):
      bad = np.argwhere((succ < 0) | (succ >= s))[0]
      raise ValueError(
          f"successors: expected state indices in [0, {s}), found {int(succ[tuple(bad)])} at "
          f"index {tuple(int(i) for i in bad)}")
    _validate_common("probabilities", probabilities, rewards, discount, initial, batch, s, a)
    pytree.set_fields(self, successors=successors, probabilities=probabilities, rewards=rewards,
                discount=discount, initial=initial)

  @classmethod
  def axes(cls, *, successors: Any = 0, probabilities: Any = 0, rewards: Any = 0,
           discount: Any = 0, initial: Any = 0) -> "SparseTabularMDP":
    """An `in_axes` spec for `jax.vmap`."""
    return pytree.unvalidated(cls, successors=successors, probabilities=probabilities,
                              rewards=rewards, discount=discount, initial=initial)

  @property
  def num_successors(self) -> int:
    return self.successors.shape[-1]

  def __repr__(self):
    return (f"SparseTabularMDP(S={self.num_states}, A={self.num_actions}, "
            f"K={self.num_successors}, dtype={self.rewards.dtype}, "
            f"batch={tuple(self.rewards.shape[:-2])})")


AnyMDP = TabularMDP | SparseTabularMDP


def check_mdp(mdp: Any, name: str = "mdp") -> None:
  if not isinstance(mdp, (TabularMDP, SparseTabularMDP)):
    raise ValueError(f"{name}: expected a TabularMDP or SparseTabularMDP, got {type(mdp).__name__}")


def check_single_mdp(mdp: Any, name: str = "mdp") -> None:
  """`check_mdp`, and that `mdp` is one MDP rather than a stacked batch."""
  check_mdp(mdp, name)
  if mdp.rewards.ndim != 2:
    raise ValueError(f"{name}: expected one MDP (rewards [S, A]); got batch shape "
                     f"{tuple(mdp.rewards.shape[:-2])} — map over the batch with jax.vmap")


# ---------------------------------------------------------------------------
# Transition products. All take one (unbatched) MDP; batch with jax.vmap.
# ---------------------------------------------------------------------------

def expected_next(mdp: AnyMDP, values: Array) -> Array:
  """`(P v)[s, a] = sum_s' P[s, a, s'] v[s']`. values `[S]` -> `[S, A]`."""
  if isinstance(mdp, TabularMDP):
    return jnp.einsum("sat,t->sa", mdp.transitions, values)
  return jnp.sum(mdp.probabilities * values[mdp.successors], axis=-1)


def policy_matrix(mdp: AnyMDP, policy: Array) -> Array:
  """Dense `P_pi[s, s'] = sum_a pi(a|s) P[s, a, s']`, shape `[S, S]`."""
  if isinstance(mdp, TabularMDP):
    return jnp.einsum("sa,sat->st", policy, mdp.transitions)
  s = mdp.num_states
  weights = policy[..., None] * mdp.probabilities
  rows = jnp.broadcast_to(jnp.arange(s)[:, None, None], mdp.successors.shape)
  return jnp.zeros((s, s), weights.dtype).at[rows, mdp.successors].add(weights)


def policy_apply(mdp: AnyMDP, policy: Array, values: Array) -> Array:
  """`(P_pi v)[s]`, shape `[S]`."""
  return jnp.sum(policy * expected_next(mdp, values), axis=-1)


def policy_apply_transpose(mdp: AnyMDP, policy: Array, mass: Array) -> Array:
  """`(P_pi^T x)[s'] = sum_{s,a} x[s] pi(a|s) P[s, a, s']`, shape `[S]`.

  Propagates a state distribution one step forward (occupancy, adjoints).
  """
  if isinstance(mdp, TabularMDP):
    return jnp.einsum("s,sa,sat->t", mass, policy, mdp.transitions)
  weights = (mass[:, None] * policy)[..., None] * mdp.probabilities
  return jax.ops.segment_sum(weights.reshape(-1), mdp.successors.reshape(-1),
                             num_segments=mdp.num_states)


def to_dense(mdp: AnyMDP) -> TabularMDP:
  """The dense form of a (single) MDP."""
  if isinstance(mdp, TabularMDP):
    return mdp
  s, a, _ = mdp.successors.shape
  rows = jnp.arange(s)[:, None, None]
  cols = jnp.arange(a)[None, :, None]
  p = jnp.zeros((s, a, s), mdp.probabilities.dtype).at[rows, cols, mdp.successors].add(
      mdp.probabilities)
  # The dense form of a validated MDP is valid; rebuilding it skips the host checks.
  return pytree.unvalidated(TabularMDP, transitions=p, rewards=mdp.rewards,
                            discount=mdp.discount, initial=mdp.initial)


def to_sparse(mdp: TabularMDP, *, num_successors: int | None = None) -> SparseTabularMDP:
  """The sparse form keeping the `num_successors` largest entries of each row.

  With `num_successors=None`, K is the largest row support (exact). A smaller K
  must still cover each row's support; otherwise a ValueError names the row.
  """
  p = np.asarray(mdp.transitions)
  support = (p > 0).sum(-1)
  k_needed = max(int(support.max()), 1)
  k = k_needed if num_successors is None else int(num_successors)
  if k < k_needed:
    s, a = (int(i) for i in np.argwhere(support > k)[0])
    raise ValueError(f"num_successors: row ({s}, {a}) has {int(support[s, a])} successors, "
                     f"more than K={k}")
  order = np.argsort(-p, axis=-1, kind="stable")[..., :k]
  probs = np.take_along_axis(p, order, axis=-1)
  return SparseTabularMDP(successors=order.astype(np.int32), probabilities=probs,
                          rewards=mdp.rewards, discount=mdp.discount, initial=mdp.initial)


def stack(mdps) -> AnyMDP:
  """Stacks MDPs of one kind and shape into a batch (leading axis)."""
  mdps = list(mdps)
  if not mdps:
    raise ValueError("mdps: expected at least one MDP to stack")
  for m in mdps:
    check_mdp(m, "mdps[i]")
  kinds = {type(m) for m in mdps}
  if len(kinds) != 1:
    raise ValueError("mdps: expected MDPs of one kind (all dense or all sparse)")
  shapes = {tuple(x.shape for x in jax.tree.leaves(m)) for m in mdps}
  if len(shapes) != 1:
    raise ValueError(f"mdps: expected MDPs of equal shapes, got {sorted(shapes)}")
  return jax.tree.map(lambda *xs: jnp.stack(xs), *mdps)
