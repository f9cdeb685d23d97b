"""Sampling a finite MDP in JAX: `reset`, `step`, `rollout` of many copies at once.

For either container (`TabularMDP` `P[s, a, s']` or `SparseTabularMDP`
successors + probabilities):

  s_0 ~ mu0,   a_t ~ pi(.|s_t),   s_{t+1} ~ P(.|s_t, a_t),   r_t = r(s_t, a_t).

`done` marks an *absorbing* state (terminal states are ordinary states whose
every action self-loops with zero reward, docs/theory.md), e.g. the end state
of a compiled harness. Stepping on from it is harmless, which keeps shapes
static: a rollout always runs `num_steps` steps.

Random keys come first. Functions take one MDP; batch over MDPs with
`jax.vmap`. States and actions may carry any batch shape (they must agree).
Values are validated when concrete; under a trace an out-of-range state or
action yields `next_state = -1`, `reward = NaN`, `done = True` (NaN propagates
into returns) instead of a silently clamped index.

The kernels `inverse_cdf` and `next_state` take uniforms instead of keys and
do no validation: the estimators build their samplers on them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from harnax.core import mdp as mdp_lib
from harnax.core import validation as val

Array = jax.Array


class Rollout(NamedTuple):
  """Batched fixed-horizon rollouts of a policy, batch-major.

  Attributes:
    states: int32 `[num_envs, num_steps]`, `s_0 .. s_{T-1}`.
    actions: int32 `[num_envs, num_steps]`, `a_t ~ pi(.|s_t)`.
    rewards: `[num_envs, num_steps]`, `r(s_t, a_t)`.
    dones: bool `[num_envs, num_steps]`, `s_{t+1}` is absorbing.
    final_states: int32 `[num_envs]`, `s_T`.
    returns: `[num_envs]`, the discounted return `sum_{t<T} gamma^t r_t`.
    truncation_bias: scalar, `gamma^T max|r| / (1 - gamma)`, a bound on
      `|E[returns] - J|` from stopping after T steps (J the plain, tau-free
      value `mu0^T (I - gamma P_pi)^{-1} r_pi`).
  """

  states: Array
  actions: Array
  rewards: Array
  dones: Array
  final_states: Array
  returns: Array
  truncation_bias: Array


# ---------------------------------------------------------------------------
# Kernels (no validation; any batch shape).
# ---------------------------------------------------------------------------

def inverse_cdf(u: Array, probs: Array) -> Array:
  """The index `i` with `cdf[i-1] <= u < cdf[i]`; `u [...]` uniform on [0, 1), `probs [..., K]`.

  One uniform per draw (cheaper in a compiled loop than Gumbel-max).
  Zero-probability entries have empty intervals and are never drawn; the clip
  to the last positive entry absorbs rounding of the cumulative sum.

  Returns:
    int32 `[...]`.
  """
  cdf = jnp.cumsum(probs, axis=-1)
  idx = jnp.sum(cdf <= u[..., None], axis=-1)
  last = probs.shape[-1] - 1 - jnp.argmax(jnp.flip(probs > 0, axis=-1), axis=-1)
  return jnp.minimum(idx, last).astype(jnp.int32)


def categorical(key, probs: Array) -> Array:
  """One draw from each row of `probs` `[..., K]` (zeros never drawn). int32 `[...]`."""
  return inverse_cdf(jax.random.uniform(key, probs.shape[:-1], probs.dtype), probs)


def next_state(u: Array, mdp: mdp_lib.AnyMDP, state: Array, action: Array) -> Array:
  """`s' ~ P(.|s, a)` by inversion of the uniforms `u`; all `[...]`, indices in range."""
  if isinstance(mdp, mdp_lib.TabularMDP):
    return inverse_cdf(u, mdp.transitions[state, action])
  k = inverse_cdf(u, mdp.probabilities[state, action])
  return jnp.take_along_axis(mdp.successors[state, action], k[..., None], axis=-1)[..., 0]


def _absorbing(mdp, states: Array) -> Array:
  """Whether each state self-loops with probability 1 and reward 0 under every action."""
  # Row sums are validated to within this tolerance at construction.
  atol = val.stochastic_atol(mdp.rewards.dtype)
  if isinstance(mdp, mdp_lib.TabularMDP):
    a = mdp.num_actions
    stay = mdp.transitions[states[..., None], jnp.arange(a), states[..., None]]
  else:
    stay = jnp.sum(mdp.probabilities[states] * (mdp.successors[states] == states[..., None, None]),
                   axis=-1)
  return jnp.all(stay >= 1.0 - atol, axis=-1) & jnp.all(mdp.rewards[states] == 0, axis=-1)


def _transition(u, mdp, state, action):
  """`(next_state, reward, done)` with out-of-range inputs mapped to `(-1, NaN, True)`."""
  s, a = mdp.num_states, mdp.num_actions
  ok = (state >= 0) & (state < s) & (action >= 0) & (action < a)
  # Gathers clamp out-of-range indices; `ok` replaces their results below.
  st, ac = jnp.clip(state, 0, s - 1), jnp.clip(action, 0, a - 1)
  nxt = next_state(u, mdp, st, ac)
  reward = mdp.rewards[st, ac]
  done = _absorbing(mdp, nxt)
  return (jnp.where(ok, nxt, -1), jnp.where(ok, reward, jnp.nan).astype(reward.dtype),
          jnp.where(ok, done, True))


@jax.jit
def _absorbing_all(mdp):
  return _absorbing(mdp, jnp.arange(mdp.num_states))


@functools.partial(jax.jit, static_argnums=(2,))
def _reset(key, mdp, shape):
  return categorical(key, jnp.broadcast_to(mdp.initial, shape + mdp.initial.shape))


@jax.jit
def _step(key, mdp, state, action):
  return _transition(jax.random.uniform(key, state.shape, mdp.rewards.dtype), mdp, state, action)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _rollout(key, mdp, policy, num_envs, num_steps):
  k0, kloop = jax.random.split(key)
  s0 = _reset(k0, mdp, (num_envs,))
  uniforms = jax.random.uniform(kloop, (num_steps, 2, num_envs), mdp.rewards.dtype)

  def body(s, u):
    a = inverse_cdf(u[0], policy[s])
    nxt, r, done = _transition(u[1], mdp, s, a)
    return nxt, (s, a, r, done)

  final, (states, actions, rewards, dones) = lax.scan(body, s0, uniforms)
  dtype = mdp.rewards.dtype
  weights = mdp.discount ** jnp.arange(num_steps, dtype=dtype)
  returns = jnp.einsum("t,tn->n", weights, rewards)
  bias = (mdp.discount ** jnp.asarray(num_steps, dtype) * jnp.max(jnp.abs(mdp.rewards))
          / (1.0 - mdp.discount))
  return Rollout(states=states.T, actions=actions.T, rewards=rewards.T, dones=dones.T,
                 final_states=final, returns=returns, truncation_bias=bias)


# ---------------------------------------------------------------------------
# Public entry points.
# ---------------------------------------------------------------------------

def absorbing_states(mdp: mdp_lib.AnyMDP) -> Array:
  """bool `[S]`: states whose every action self-loops with reward 0 (terminal states)."""
  mdp_lib.check_single_mdp(mdp)
  return _absorbing_all(mdp)


def reset(key, mdp: mdp_lib.AnyMDP, *, num_envs: int | None = None) -> Array:
  """Initial states `s_0 ~ mu0`.

  Args:
    key: a `jax.random` key.
    mdp: one `TabularMDP` or `SparseTabularMDP`.
    num_envs: number of independent copies (static); None for one.

  Returns:
    int32 scalar, or `[num_envs]`.
  """
  mdp_lib.check_single_mdp(mdp)
  shape = () if num_envs is None else (val.check_count("num_envs", num_envs),)
  return _reset(key, mdp, shape)


def step(key, mdp: mdp_lib.AnyMDP, state, action) -> tuple[Array, Array, Array]:
  """One transition `s' ~ P(.|s, a)` of every environment in a batch.

  Args:
    key: a `jax.random` key (one for the whole batch).
    mdp: one `TabularMDP` or `SparseTabularMDP`.
    state: int `[...]`, current states in `[0, S)`.
    action: int `[...]`, same shape as `state`, actions in `[0, A)`.

  Returns:
    `(next_state, reward, done)`: int32 `[...]`, `r(s, a)` `[...]` in the MDP's
    dtype, bool `[...]` (next state absorbing). Under a trace an out-of-range
    state or action gives `(-1, NaN, True)` (module docstring).

  Raises:
    ValueError: a batched MDP, non-integer or mismatched state / action, or
      (when concrete) an index out of range.
  """
  mdp_lib.check_single_mdp(mdp)
  state = val.check_index("state", state, mdp.num_states, "state")
  action = val.check_index("action", action, mdp.num_actions, "action")
  if state.shape != action.shape:
    raise ValueError(f"action: expected the shape of state {list(state.shape)}, got "
                     f"{list(action.shape)}")
  return _step(key, mdp, state, action)


def rollout(key, mdp: mdp_lib.AnyMDP, policy, *, num_envs: int, num_steps: int) -> Rollout:
  """`num_envs` independent rollouts of `num_steps` steps from `mu0` (`lax.scan`).

  All environments advance together (one batched step per scan iteration).
  `Rollout.returns` estimates the plain (tau-free) value
  `J = mu0^T (I - gamma P_pi)^{-1} r_pi` to within `Rollout.truncation_bias`
  plus Monte Carlo error.

  Args:
    key: a `jax.random` key.
    mdp: one `TabularMDP` or `SparseTabularMDP`.
    policy: `[S, A]`, a distribution per state.
    num_envs: N >= 1 (static).
    num_steps: T >= 1 (static).

  Returns:
    `Rollout` with `[num_envs, num_steps]` fields.
  """
  mdp_lib.check_single_mdp(mdp)
  policy = val.check_policy_array("policy", policy, mdp.num_states, mdp.num_actions,
                                  mdp.rewards.dtype)
  return _rollout(key, mdp, policy, val.check_count("num_envs", num_envs),
                  val.check_count("num_steps", num_steps))
