"""MDPs for tests, benchmarks and examples.

Random generators take a `jax.random` key and build on device, so a batch is
`jax.vmap(lambda k: random_dense_mdp(k, S, A))(keys)`. The structured ones
(`chain_mdp`, `gridworld_5x5`) have answers known in closed form or from the
literature.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import mdp as mdp_lib

Array = jax.Array


def _dtype(dtype):
  return jax.dtypes.canonicalize_dtype(dtype if dtype is not None else jnp.float64)


def _dirichlet_rows(key, concentration, shape, dtype):
  """Dirichlet(concentration) along the last axis of `shape`.

  Dirichlet(1) is normalized Exponential(1) draws: about 100x faster than the
  gamma sampler behind `jax.random.dirichlet`, which serves the other cases.
  """
  if concentration == 1.0:
    w = jax.random.exponential(key, shape, dtype)
    return w / jnp.sum(w, axis=-1, keepdims=True)
  alpha = jnp.full(shape[-1:], concentration, dtype)
  return jax.random.dirichlet(key, alpha, shape[:-1], dtype=dtype)


def random_dense_mdp(key, num_states: int, num_actions: int, *, discount: float = 0.9,
                     concentration: float = 1.0, reward_scale: float = 1.0,
                     dtype=None) -> mdp_lib.TabularMDP:
  """Transitions with Dirichlet(concentration) rows, rewards U(0, reward_scale).

  The initial distribution is uniform. Returns a `TabularMDP` `[S, A, S]`.
  """
  dtype = _dtype(dtype)
  k_p, k_r = jax.random.split(key)
  p = _dirichlet_rows(k_p, concentration, (num_states, num_actions, num_states), dtype)
  r = reward_scale * jax.random.uniform(k_r, (num_states, num_actions), dtype)
  mu0 = jnp.full((num_states,), 1.0 / num_states, dtype)
  return mdp_lib.TabularMDP(transitions=p, rewards=r, discount=jnp.asarray(discount, dtype),
                            initial=mu0)


def random_sparse_mdp(key, num_states: int, num_actions: int, num_successors: int, *,
                      discount: float = 0.9, concentration: float = 1.0,
                      reward_scale: float = 1.0, dtype=None) -> mdp_lib.SparseTabularMDP:
  """K uniformly drawn successors (with replacement) per state-action.

  With `num_successors=1` the MDP is deterministic.
  """
  dtype = _dtype(dtype)
  k_s, k_p, k_r = jax.random.split(key, 3)
  succ = jax.random.randint(k_s, (num_states, num_actions, num_successors), 0, num_states,
                            dtype=jnp.int32)
  if num_successors == 1:
    probs = jnp.ones(succ.shape, dtype)
  else:
    probs = _dirichlet_rows(k_p, concentration, succ.shape, dtype)
  r = reward_scale * jax.random.uniform(k_r, (num_states, num_actions), dtype)
  mu0 = jnp.full((num_states,), 1.0 / num_states, dtype)
  return mdp_lib.SparseTabularMDP(successors=succ, probabilities=probs, rewards=r,
                                  discount=jnp.asarray(discount, dtype), initial=mu0)


def random_deterministic_mdp(key, num_states: int, num_actions: int,
                             **kwargs) -> mdp_lib.SparseTabularMDP:
  """A sparse MDP with one successor per state-action."""
  return random_sparse_mdp(key, num_states, num_actions, 1, **kwargs)


def uniform_reference(num_states: int, num_actions: int, *, dtype=None) -> Array:
  """`pi_ref(a|s) = 1/A` everywhere, `[S, A]`."""
  dtype = _dtype(dtype)
  return jnp.full((num_states, num_actions), 1.0 / num_actions, dtype)


def random_reference(key, num_states: int, num_actions: int, *,
                     unavailable_fraction: float = 0.0, dtype=None) -> Array:
  """A random reference policy with some actions unavailable (exact zeros).

  Each state keeps at least one available action (action 0 when all others are
  removed). Rows are Dirichlet(1) over the available actions.
  """
  dtype = _dtype(dtype)
  k_m, k_p = jax.random.split(key)
  drop = jax.random.uniform(k_m, (num_states, num_actions)) < unavailable_fraction
  drop = drop.at[:, 0].set(drop[:, 0] & ~jnp.all(drop, axis=-1))
  w = jax.random.exponential(k_p, (num_states, num_actions), dtype)
  w = jnp.where(drop, 0.0, w)
  return w / jnp.sum(w, axis=-1, keepdims=True)


def random_policy(key, pi_ref: Array, *, temperature: float = 1.0) -> Array:
  """A random softmax policy over the actions `pi_ref` allows, `[S, A]`."""
  logits = jax.random.normal(key, pi_ref.shape, pi_ref.dtype) / temperature
  logits = jnp.where(pi_ref > 0, logits, -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)


def chain_mdp(rewards, *, discount: float = 0.9, dtype=None) -> mdp_lib.SparseTabularMDP:
  """A deterministic chain: every action in state s moves to s + 1.

  State `n` (the last, appended) is absorbing with zero reward. With `rewards`
  of shape `[n, A]` the soft values are known in closed form:
  `V*(s) = sum_{t >= s} gamma^(t-s) tau log sum_a pi_ref(a|t) exp(r(t, a) / tau)`.
  The start state is 0.
  """
  dtype = _dtype(dtype)
  r = np.asarray(rewards, dtype=np.float64)
  if r.ndim != 2:
    raise ValueError(f"rewards: expected shape [n, A], got {list(r.shape)}")
  n, a = r.shape
  succ = np.minimum(np.arange(n + 1) + 1, n)[:, None].repeat(a, axis=1)
  r_full = np.concatenate([r, np.zeros((1, a))], axis=0)
  mu0 = np.zeros(n + 1)
  mu0[0] = 1.0
  return mdp_lib.SparseTabularMDP(successors=succ.astype(np.int32), rewards=r_full.astype(dtype),
                                  discount=np.asarray(discount, dtype), initial=mu0.astype(dtype))


# Sutton & Barto (2018), Example 3.5: actions north, south, east, west.
_MOVES = ((-1, 0), (1, 0), (0, 1), (0, -1))


def gridworld_5x5(*, discount: float = 0.9, dtype=None) -> mdp_lib.SparseTabularMDP:
  """Sutton & Barto's 5x5 gridworld (Example 3.5), states row-major.

  From A = (0, 1) every action jumps to A' = (4, 1) with reward +10; from
  B = (0, 3) to B' = (2, 3) with +5; a move off the grid stays put with -1;
  all other moves give 0. The initial distribution is uniform.
  """
  dtype = _dtype(dtype)
  size = 5
  succ = np.zeros((size * size, 4), np.int32)
  rew = np.zeros((size * size, 4))
  for i in range(size):
    for j in range(size):
      s = i * size + j
      for a, (di, dj) in enumerate(_MOVES):
        if (i, j) == (0, 1):
          succ[s, a], rew[s, a] = 4 * size + 1, 10.0
        elif (i, j) == (0, 3):
          succ[s, a], rew[s, a] = 2 * size + 3, 5.0
        elif 0 <= i + di < size and 0 <= j + dj < size:
          succ[s, a] = (i + di) * size + (j + dj)
        else:
          succ[s, a], rew[s, a] = s, -1.0
  mu0 = np.full(size * size, 1.0 / (size * size))
  return mdp_lib.SparseTabularMDP(successors=succ, rewards=rew.astype(dtype),
                                  discount=np.asarray(discount, dtype), initial=mu0.astype(dtype))
