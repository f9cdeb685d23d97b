"""Synthetic deployment logs from tabular MDPs whose truth is known.

Each synthetic *harness* is a small episodic MDP (a terminal state with one
action and zero reward ends the episode, so logging stops there without any
truncation bias), a deployed policy, and the exact optimum `pi*` standing in
for the proxy teacher. Actions are the five coding-agent categories and are
rendered as short command strings that `proxy.coding_agent_category` maps
back. Rewards are shifted and the policy interpolated (geometrically, between
`pi*` and a random policy) until `C` and `M` hit prescribed targets, chosen so
that ranking by `C` alone or by `M` alone is wrong and only `C - M` is right
(as in the harness-transfer study's Terminal-Bench comparison).

`data/synthetic_logs.jsonl` was written by
`write_jsonl(synthetic_logs(synthetic_harnesses(seed=0), seed=1), path)`.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import jax
import numpy as np

from harnax.core import evaluation
from harnax.core import mdp as mdp_lib
from harnax.core import objectives
from harnax.core import solvers
from harnax.estimate import proxy

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "synthetic_logs.jsonl")

# name -> (target C, target M, termination probability, non-terminal states).
# "agentic" takes many more decisions per episode (the harness-transfer study's DeepAgents).
DEFAULT_TARGETS = {
    "minimal": (6.0, 1.0, 0.3, 6),
    "tools": (8.5, 6.0, 0.08, 16),
    "verbose": (4.2, 0.4, 0.35, 6),
    "agentic": (8.0, 1.5, 0.1, 14),
}

# Short on purpose: the committed log file stays small.
RENDERINGS = {
    "inspect_file": ("cat a", "ls", "grep x", "head f"),
    "edit": ("sed -i x", "patch", "cat >a"),
    "run_command": ("pytest", "make", "python m"),
    "plan": ("Plan: x", "I will y"),
    "other": ("ok", "??", "done"),
}


class SyntheticHarness(NamedTuple):
  """One harness with its exact answers (float64).

  Attributes:
    name: harness name.
    mdp: `TabularMDP` (last state terminal, start state 0).
    pi_ref, policy, pi_star: `[S, A]`.
    tau: temperature.
    ceiling, mismatch, value: exact `C`, `M`, `J = C - M`.
  """

  name: str
  mdp: mdp_lib.TabularMDP
  pi_ref: np.ndarray
  tau: float
  policy: np.ndarray
  pi_star: np.ndarray
  ceiling: float
  mismatch: float
  value: float


# Certified sup-norm error of every optimum solved here (float64).
_TOL = 1e-12


def _bisect(f, lo, hi, target, iters=50):
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    if f(mid) < target:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def _harness(rng, name, c_target, m_target, p_term, *, num_states, discount, tau):
  a = len(proxy.CODING_AGENT_CATEGORIES)
  s = num_states + 1                                   # + terminal
  term = s - 1
  # Deterministic transitions on a DAG: from state i an action ends the
  # episode (with probability p_term when the MDP is drawn, always from the
  # last state) or moves to a later state. Episodes take at most num_states
  # decisions, and as the only randomness is the policy's, the regularized
  # return of every episode of pi* telescopes to V*(s0) exactly.
  p = np.zeros((s, a, s))
  for i in range(num_states):
    for j in range(a):
      last = i == num_states - 1
      if last or rng.uniform() < p_term:
        nxt = term
      else:
        nxt = int(min(i + 1 + rng.integers(2), num_states - 1))
      p[i, j, nxt] = 1.0
  p[term, :, term] = 1.0
  base = rng.uniform(0.0, 1.0, (s, a))
  base[term] = 0.0
  pi_ref = np.zeros((s, a))
  pi_ref[:num_states] = rng.dirichlet(np.full(a, 3.0), num_states)
  pi_ref[term, 0] = 1.0
  mu0 = np.zeros(s)
  mu0[0] = 1.0
  nonterm = np.arange(s) < num_states

  def mdp_of(shift):
    return mdp_lib.TabularMDP(transitions=p, rewards=base + shift * nonterm[:, None],
                              discount=discount, initial=mu0)

  def optimum(mdp):
    return solvers.solve_soft_bellman(mdp, pi_ref, tau, tol=_TOL)

  shift = _bisect(lambda x: float(objectives.ceiling(mdp_of(x), pi_ref, tau, tol=_TOL)),
                  -20.0, 20.0, c_target)
  mdp = mdp_of(shift)
  sol = optimum(mdp)
  pi_star = np.asarray(sol.policy)
  avail = pi_ref > 0
  bad = np.where(avail, rng.normal(0.0, 2.5, (s, a)), 0.0)
  log_star = np.log(np.where(avail, pi_star, 1.0))

  def policy(lam):
    logits = np.where(avail, (1 - lam) * log_star + lam * bad, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(-1, keepdims=True)

  def mism(x):
    return float(objectives.mismatch(mdp, policy(x), pi_ref, tau, solution=sol))

  lam = _bisect(mism, 0.0, 4.0, m_target)
  pol = policy(lam)
  c = float(objectives.ceiling(mdp, pi_ref, tau, solution=sol))
  m = mism(lam)
  j = float(evaluation.evaluate_policy(mdp, pol, pi_ref, tau).value)
  return SyntheticHarness(name=name, mdp=mdp, pi_ref=pi_ref, tau=tau, policy=pol,
                          pi_star=pi_star, ceiling=c, mismatch=m, value=j)


def synthetic_harnesses(*, seed: int = 0, targets: dict | None = None,
                        discount: float = 0.9, tau: float = 1.0) -> list:
  """Builds the harnesses (exact values in float64).

  Args:
    seed: numpy seed.
    targets: `{name: (C, M, termination probability, non-terminal states)}`;
      default `DEFAULT_TARGETS`.
    discount, tau: shared gamma and temperature.

  Returns:
    A list of `SyntheticHarness`, in the order of `targets`.
  """
  targets = DEFAULT_TARGETS if targets is None else targets
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True):
    return [_harness(rng, name, c, m, q, num_states=n, discount=discount, tau=tau)
            for name, (c, m, q, n) in targets.items()]


def _render(rng, actions):
  cats = proxy.CODING_AGENT_CATEGORIES
  return [str(rng.choice(RENDERINGS[cats[int(x)]])) for x in actions]


def _episode(rng, h, acting, *, num_samples, max_steps):
  p = np.asarray(h.mdp.transitions)
  r = np.asarray(h.mdp.rewards)
  gamma = float(h.mdp.discount)
  term = p.shape[0] - 1
  s = int(rng.choice(p.shape[0], p=np.asarray(h.mdp.initial)))
  steps, ret = [], 0.0
  for t in range(max_steps):
    if s == term:
      break
    a = int(rng.choice(p.shape[1], p=acting[s]))
    ret += gamma ** t * (r[s, a] - h.tau * np.log(acting[s, a] / h.pi_ref[s, a]))
    if acting is h.policy:
      pol = _render(rng, rng.choice(p.shape[1], size=num_samples, p=h.policy[s]))
      prox = _render(rng, rng.choice(p.shape[1], size=num_samples, p=h.pi_star[s]))
      steps.append({"state": s, "policy_samples": pol, "proxy_samples": prox})
    else:
      steps.append({"state": s, "policy_samples": [], "proxy_samples": _render(rng, [a])})
    s = int(rng.choice(p.shape[0], p=p[s, a]))
  return steps, ret


def synthetic_logs(harnesses, *, seed: int = 1, num_policy_episodes: int = 40,
                   num_proxy_episodes: int = 40, num_samples: int = 16,
                   max_steps: int = 60) -> list:
  """Episode records (dicts in the JSONL schema of `proxy`) for `harnesses`.

  Policy episodes: the deployed policy acts; at each decision N outputs of
  the policy and N of the proxy (`pi*`) are logged; the outcome is the
  discounted regularized return. Proxy episodes: `pi*` acts; its outcome
  estimates `C`. Episodes end at the terminal state (or `max_steps`).
  """
  rng = np.random.default_rng(seed)
  records = []
  for h in harnesses:
    for actor, n, acting in (("policy", num_policy_episodes, h.policy),
                             ("proxy", num_proxy_episodes, h.pi_star)):
      for i in range(n):
        steps, ret = _episode(rng, h, acting, num_samples=num_samples, max_steps=max_steps)
        records.append({"episode_id": f"{h.name}-{actor}-{i}", "harness": h.name,
                        "actor": actor, "outcome": round(ret, 6), "steps": steps})
  return records


def write_jsonl(records, path) -> None:
  """Writes one compact JSON object per line."""
  with open(path, "w", encoding="utf-8") as f:
    for rec in records:
      f.write(json.dumps(rec, separators=(",", ":")) + "\n")
