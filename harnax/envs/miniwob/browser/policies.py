"""Policies that choose the semantic actions of a replay on the real page.

A `Policy` is `policy(compiled, state, t) -> action id`. `random_policy` is
uniform over the available actions; `optimal_policy` is greedy in the
soft-optimal policy of one compiled harness, solved once when it is built.
"""

from __future__ import annotations

import numpy as np

from harnax import core
from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob.browser import episodes as episodes_lib


def random_policy(rng: np.random.Generator) -> episodes_lib.Policy:
  """Uniform over the actions available in the current MDP state."""
  def policy(compiled, state, t):
    del t
    avail = np.flatnonzero(np.asarray(compiled.harness.pi_ref)[state] > 0)
    return int(rng.choice(avail))
  return policy


def _bucket(n: int) -> int:
  return max(8, 1 << (int(n) - 1).bit_length())


def soft_optimal_policy(compiled: harnesses_lib.CompiledHarness, tau: float) -> np.ndarray:
  """`hx.solve_soft_bellman(mdp, pi_ref, tau).policy` of a compiled harness, `[S, A]`.

  The MDP is padded to power-of-two sizes first (extra states absorbing and
  unreachable, extra actions unavailable), which leaves the policy on the
  real states unchanged and lets the solver's compiled loop be reused across
  task instances instead of compiled once per shape.
  """
  mdp = compiled.harness.mdp
  p = np.asarray(mdp.transitions)
  r = np.asarray(mdp.rewards)
  pi_ref = np.asarray(compiled.harness.pi_ref)
  s, a = r.shape
  s_pad, a_pad = _bucket(s), _bucket(a)
  p_big = np.zeros((s_pad, a_pad, s_pad), p.dtype)
  p_big[:s, :a, :s] = p
  for st in range(s_pad):  # padded actions and states: self-loops
    p_big[st, a if st < s else 0:, st] = 1.0
  r_big = np.zeros((s_pad, a_pad), r.dtype)
  r_big[:s, :a] = r
  ref_big = np.zeros((s_pad, a_pad), pi_ref.dtype)
  ref_big[:s, :a] = pi_ref
  ref_big[s:, 0] = 1.0
  mu0 = np.zeros(s_pad, r.dtype)
  mu0[:s] = np.asarray(mdp.initial)
  big = core.TabularMDP(transitions=p_big, rewards=r_big, discount=mdp.discount, initial=mu0)
  # Value iteration: its loop compiles faster than policy iteration's, which
  # dominates here (one compile per padded shape).
  sol = core.solve_soft_bellman(big, ref_big, tau, method="value_iteration")
  return np.asarray(sol.policy)[:s, :a]


def optimal_policy(compiled: harnesses_lib.CompiledHarness, *,
                   tau: float = 0.05) -> episodes_lib.Policy:
  """Greedy in the soft-optimal policy of `compiled` at temperature `tau`.

  The policy is solved here, once (`soft_optimal_policy`); the returned
  `Policy` only looks it up, and only for this compiled harness (the one of
  `start_episode(...).compiled`).

  Args:
    compiled: the compiled harness the policy will be played on.
    tau: temperature > 0 of the soft-optimal policy.

  Returns:
    A `Policy` that raises ValueError when called with another compiled
    harness.
  """
  if not isinstance(compiled, harnesses_lib.CompiledHarness):
    raise ValueError(f"compiled: expected a CompiledHarness, got {type(compiled).__name__}")
  greedy = np.argmax(soft_optimal_policy(compiled, tau), axis=1)

  def policy(played, state, t):
    del t
    # Identity, not equality: the policy is solved for this very object (held here).
    if played is not compiled:
      raise ValueError(f"compiled: this policy was solved for {compiled}, got {played}")
    return int(greedy[state])
  return policy
