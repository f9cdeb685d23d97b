"""Sampling states from the discounted occupancy of a deployed policy.

Geometric stopping (docs/estimation.md §1): start at `s0 ~ mu0`; before each
step stop with probability `1 - gamma` and emit the current state. The
stopping time has `P(T = t) = (1 - gamma) gamma^t`, so the emitted state is
distributed as

  sum_t (1 - gamma) gamma^t Pr_pi(s_t = s) = d^pi(s)         (exactly).

Every sampler here caps the rollout at `max_steps`: a rollout that has not
stopped by then emits `s_{max_steps}` and is flagged `truncated`. The capped
sampler's distribution differs from `d^pi` only on the event `T >= max_steps`,
which has probability `gamma^max_steps`, so its total-variation distance to
`d^pi` is at most `gamma^max_steps` (the returned `truncation_bias`).

`sample_occupancy` takes one MDP (dense or sparse) and a key first, and builds
on the transition kernels of `harnax.core.sampling` (fixed-horizon rollouts
are `harnax.core.sampling.rollout`); batch over MDPs with `jax.vmap`.
`sample_occupancy_gym` runs any gymnasium environment in a Python loop.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from harnax.core import mdp as mdp_lib
from harnax.core import sampling as core_sampling
from harnax.core import validation as val

Array = jax.Array


class OccupancySamples(NamedTuple):
  """States drawn from the discounted occupancy by geometric stopping.

  Attributes:
    states: int32 `[n]`, the emitted states.
    steps: int32 `[n]`, environment steps each rollout took (`min(T, max_steps)`).
    truncated: bool `[n]`, rollouts stopped by the cap rather than by `T`.
    truncation_bias: scalar, `gamma^max_steps`, a bound on the total-variation
      distance between the capped sampler's distribution and `d^pi`.
  """

  states: Array
  steps: Array
  truncated: Array
  truncation_bias: Array


def _geometric(key, discount, shape) -> Array:
  """`T` with `P(T = t) = (1 - gamma) gamma^t`, by inversion of a uniform."""
  # minval > 0 keeps log(u) finite; gamma = 0 gives log(gamma) = -inf and T = 0.
  u = jax.random.uniform(key, shape, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
  t = jnp.floor(jnp.log(u) / jnp.log(discount))
  return jnp.where(discount > 0, t, 0.0)


def sample_occupancy(key, mdp: mdp_lib.AnyMDP, policy, *, num_samples: int,
                     max_steps: int = 10_000) -> OccupancySamples:
  """Draws `num_samples` states from `d^pi` by geometric stopping.

  Rollouts are independent (vmapped); each runs a `lax.while_loop` for
  `min(T, max_steps)` steps.

  Args:
    key: a `jax.random` key.
    mdp: one `TabularMDP` or `SparseTabularMDP`.
    policy: `[S, A]`, the deployed policy.
    num_samples: number of rollouts (= states emitted), >= 1.
    max_steps: cap on each rollout; bias in total variation <= `gamma^max_steps`.

  Returns:
    `OccupancySamples` with `states [num_samples]`.
  """
  mdp_lib.check_single_mdp(mdp)
  policy = val.check_policy_array("policy", policy, mdp.num_states, mdp.num_actions,
                                  mdp.rewards.dtype)
  num_samples = val.check_count("num_samples", num_samples)
  max_steps = val.check_count("max_steps", max_steps, 0)
  # max_steps is traced, so a new cap does not recompile.
  return _sample_occupancy(key, mdp, policy, num_samples, jnp.asarray(max_steps, jnp.int32))


def _rollout_to(key, mdp, policy, stop):
  k0, kloop = jax.random.split(key)
  s0 = core_sampling.categorical(k0, mdp.initial)

  def body(carry):
    t, s = carry
    u = jax.random.uniform(jax.random.fold_in(kloop, t), (2,), mdp.rewards.dtype)
    a = core_sampling.inverse_cdf(u[0], policy[s])
    return t + 1, core_sampling.next_state(u[1], mdp, s, a)

  _, s = lax.while_loop(lambda c: c[0] < stop, body, (jnp.int32(0), s0))
  return s


@functools.partial(jax.jit, static_argnums=(3,))
def _sample_occupancy(key, mdp, policy, num_samples, max_steps):
  k_t, k_roll = jax.random.split(key)
  t = _geometric(k_t, mdp.discount, (num_samples,))
  truncated = t >= max_steps
  stop = jnp.where(truncated, max_steps, t).astype(jnp.int32)
  keys = jax.random.split(k_roll, num_samples)
  states = jax.vmap(_rollout_to, in_axes=(0, None, None, 0))(keys, mdp, policy, stop)
  return OccupancySamples(states=states, steps=stop, truncated=truncated,
                          truncation_bias=mdp.discount ** max_steps.astype(mdp.discount.dtype))


def state_histogram(states, *, num_states: int) -> Array:
  """Empirical distribution of sampled states, `[n]` -> `[num_states]`."""
  num_states = val.check_count("num_states", num_states)
  states = jnp.asarray(states)
  if states.size == 0:
    raise ValueError("states: expected at least one sampled state, got an empty array")
  counts = jnp.zeros((num_states,)).at[states.reshape(-1)].add(1.0)
  return counts / states.size


def total_variation(p, q) -> Array:
  """`TV(p, q) = 1/2 sum |p - q|` along the last axis."""
  return 0.5 * jnp.sum(jnp.abs(jnp.asarray(p) - jnp.asarray(q)), axis=-1)


class GymOccupancySamples(NamedTuple):
  """States from `sample_occupancy_gym`.

  Attributes:
    observations: list of `num_samples` emitted observations.
    steps: int `[n]` environment steps each rollout took.
    truncated: bool `[n]`, rollouts that hit `max_steps` before stopping.
    ended: bool `[n]`, rollouts whose episode terminated before `T`; the
      terminal observation is emitted (a terminal state is absorbing).
    env_steps: total environment steps used.
    truncation_bias: `gamma^max_steps` (total-variation bound, as above).
  """

  observations: list
  steps: np.ndarray
  truncated: np.ndarray
  ended: np.ndarray
  env_steps: int
  truncation_bias: float


def sample_occupancy_gym(rng: np.random.Generator, env,
                         policy_fn: Callable[[Any, np.random.Generator], Any], discount: float,
                         *, num_samples: int, max_steps: int = 10_000) -> GymOccupancySamples:
  """Geometric stopping on any gymnasium environment (Python loop).

  Each rollout resets `env` with a seed drawn from `rng`, draws
  `T ~ Geometric(1 - gamma)` (support 0, 1, ...), and steps `min(T, max_steps)`
  times with `action = policy_fn(observation, rng)`. An episode that
  terminates earlier is treated as absorbed in its terminal state (terminal
  states are absorbing), whose observation is emitted. Gymnasium *truncation* (a time limit) is
  not part of the MDP: it also ends the rollout early, and those samples are
  flagged in `ended` too — wrap environments without a time limit for exact
  occupancy samples.

  Args:
    rng: a `numpy.random.Generator` (all randomness, including env seeds).
    env: a `gymnasium.Env`.
    policy_fn: `(observation, rng) -> action`, the deployed policy.
    discount: gamma in [0, 1).
    num_samples: number of states to emit, >= 1.
    max_steps: per-rollout cap (bias <= `gamma^max_steps` in total variation).

  Returns:
    `GymOccupancySamples`.
  """
  num_samples = val.check_count("num_samples", num_samples)
  max_steps = val.check_count("max_steps", max_steps, 0)
  if not (0.0 <= float(discount) < 1.0):
    raise ValueError(f"discount: expected 0 <= gamma < 1, got {discount}")
  if not isinstance(rng, np.random.Generator):
    raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
  observations, steps, truncated, ended = [], [], [], []
  for _ in range(num_samples):
    t = int(rng.geometric(1.0 - discount)) - 1 if discount > 0 else 0
    stop = min(t, max_steps)
    obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
    done, n = False, 0
    while n < stop and not done:
      obs, _, term, trunc, _ = env.step(policy_fn(obs, rng))
      n += 1
      done = bool(term or trunc)
    observations.append(obs)
    steps.append(n)
    truncated.append(t >= max_steps)
    ended.append(done and n < stop)
  steps = np.asarray(steps, np.int64)
  return GymOccupancySamples(observations=observations, steps=steps,
                             truncated=np.asarray(truncated), ended=np.asarray(ended),
                             env_steps=int(steps.sum()),
                             truncation_bias=float(discount) ** max_steps)
