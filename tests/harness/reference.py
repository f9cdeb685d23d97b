"""Independent float64 NumPy references for the harness layer (no harnax imports).

Written from the definitions (docs/theory.md §1, docs/harness.md) with explicit loops
and direct linear solves.
"""

import numpy as np

# The MDP-level references are shared with the core tests (also harnax-free).
from tests.core.reference import evaluate  # noqa: F401
from tests.core.reference import kl_rows  # noqa: F401
from tests.core.reference import log_ref  # noqa: F401
from tests.core.reference import occupancy  # noqa: F401


def aggregate(output_probs, decode_table, num_actions, invalid, noop_action=None):
  """Pi_H by looping over outputs."""
  s, o = decode_table.shape
  out = np.zeros((s, num_actions))
  inv = np.zeros(s)
  for st in range(s):
    for k in range(o):
      a = decode_table[st, k]
      if a < 0:
        inv[st] += output_probs[st, k]
      else:
        out[st, a] += output_probs[st, k]
  if invalid == "noop":
    out[:, noop_action] += inv
    return out
  return out / out.sum(-1, keepdims=True)


def soft_optimum(P, r, gamma, pi_ref, tau, iters=100):
  """(V*, F*, pi*) by soft policy iteration to machine precision."""
  policy = pi_ref.copy()
  for _ in range(iters):
    v, q = evaluate(P, r, gamma, policy, pi_ref, tau)
    z = q / tau + log_ref(pi_ref)
    z = z - z.max(-1, keepdims=True)
    new = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    if np.max(np.abs(new - policy)) < 1e-15:
      break
    policy = new
  v, q = evaluate(P, r, gamma, policy, pi_ref, tau)
  with np.errstate(invalid="ignore"):
    scores = np.where(pi_ref > 0, q + tau * log_ref(pi_ref), -np.inf)
  return v, scores, policy


def centered(x, mask):
  """Per-row mean over mask subtracted; 0 outside."""
  out = np.zeros_like(x, dtype=float)
  for st in range(x.shape[0]):
    idx = np.flatnonzero(mask[st])
    out[st, idx] = x[st, idx] - x[st, idx].mean()
  return out


def random_harness_arrays(rng, s, a, o, *, unavailable=0.0, invalid=0.2, gamma=0.9):
  """P, r, mu0, pi_ref (uniform over available), decode table [S, O] (valid ids available)."""
  P = rng.dirichlet(np.ones(s), size=(s, a))
  r = rng.uniform(size=(s, a))
  mu0 = rng.dirichlet(np.ones(s))
  avail = rng.uniform(size=(s, a)) >= unavailable
  avail[np.arange(s), rng.integers(0, a, s)] = True
  pi_ref = avail / avail.sum(-1, keepdims=True)
  table = np.full((s, o), -1, np.int32)
  for st in range(s):
    acts = np.flatnonzero(avail[st])
    for k in range(o):
      if rng.uniform() >= invalid:
        table[st, k] = rng.choice(acts)
    # Every state keeps at least one valid output (renormalize needs it).
    if np.all(table[st] < 0):
      table[st, 0] = rng.choice(acts)
  return dict(P=P, r=r, mu0=mu0, pi_ref=pi_ref, table=table, gamma=gamma)
