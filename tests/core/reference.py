"""Independent float64 NumPy references for the tabular core (no harnax imports).

Written from the definitions in docs/theory.md §1, with dense matrices and direct
linear solves, so that a bug in harnax's solvers cannot hide in both.
"""

import numpy as np


def log_ref(pi_ref):
  with np.errstate(divide="ignore"):
    return np.where(pi_ref > 0, np.log(np.where(pi_ref > 0, pi_ref, 1.0)), -np.inf)


def soft_max(q, pi_ref, tau):
  """tau log sum_a pi_ref exp(q / tau) over available actions, stably."""
  z = q / tau + log_ref(pi_ref)
  m = z.max(-1, keepdims=True)
  return tau * (m[:, 0] + np.log(np.exp(z - m).sum(-1)))


def soft_argmax(q, pi_ref, tau):
  z = q / tau + log_ref(pi_ref)
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def kl_rows(p, q):
  with np.errstate(divide="ignore", invalid="ignore"):
    t = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(np.where(q > 0, q, 1e-300))),
                 0.0)
  return t.sum(-1)


def evaluate(P, r, gamma, policy, pi_ref, tau):
  """Returns V^pi, Q^pi, J for regularized evaluation."""
  s = r.shape[0]
  P_pi = np.einsum("sa,sat->st", policy, P)
  c = (policy * r).sum(-1) - tau * kl_rows(policy, pi_ref)
  v = np.linalg.solve(np.eye(s) - gamma * P_pi, c)
  q = r + gamma * P @ v
  return v, q


def occupancy(P, gamma, mu0, policy):
  s = P.shape[0]
  P_pi = np.einsum("sa,sat->st", policy, P)
  return (1 - gamma) * np.linalg.solve((np.eye(s) - gamma * P_pi).T, mu0)


def soft_optimum(P, r, gamma, pi_ref, tau, iters=200):
  """Soft policy iteration to machine precision, then checked as a fixed point."""
  policy = np.where(pi_ref > 0, pi_ref, 0.0)
  v = None
  for _ in range(iters):
    v_new, q = evaluate(P, r, gamma, policy, pi_ref, tau)
    policy = soft_argmax(q, pi_ref, tau)
    if v is not None and np.max(np.abs(v_new - v)) < 1e-14 * max(1, np.abs(v).max()):
      v = v_new
      break
    v = v_new
  q = r + gamma * P @ v
  tv = soft_max(q, pi_ref, tau)
  assert np.max(np.abs(tv - v)) < 1e-10 * max(1.0, np.abs(v).max()), "reference did not converge"
  return v, q, soft_argmax(q, pi_ref, tau)


def hard_optimum(P, r, gamma, pi_ref, iters=100000):
  """Unregularized value iteration over available actions (sup-norm stop)."""
  v = np.zeros(r.shape[0])
  mask = pi_ref > 0
  for _ in range(iters):
    q = r + gamma * P @ v
    v_new = np.where(mask, q, -np.inf).max(-1)
    if np.max(np.abs(v_new - v)) < 1e-13:
      return v_new
    v = v_new
  raise AssertionError("hard value iteration did not converge")


def random_problem(rng, s, a, *, unavailable=0.0, gamma=0.9, sparse_k=None):
  """Dense P [S, A, S] (optionally with K-sparse rows), r, mu0, pi_ref, policy."""
  if sparse_k is None:
    P = rng.dirichlet(np.ones(s), size=(s, a))
  else:
    P = np.zeros((s, a, s))
    for i in range(s):
      for j in range(a):
        idx = rng.choice(s, size=sparse_k, replace=False)
        P[i, j, idx] = rng.dirichlet(np.ones(sparse_k))
  r = rng.normal(size=(s, a))
  mu0 = rng.dirichlet(np.ones(s))
  mask = rng.random((s, a)) >= unavailable
  mask[np.arange(s), rng.integers(0, a, size=s)] = True
  w = rng.random((s, a)) + 0.1
  pi_ref = np.where(mask, w, 0.0)
  pi_ref /= pi_ref.sum(-1, keepdims=True)
  logits = rng.normal(size=(s, a))
  pol = np.where(mask, np.exp(logits), 0.0)
  pol /= pol.sum(-1, keepdims=True)
  return dict(P=P, r=r, gamma=gamma, mu0=mu0, pi_ref=pi_ref, policy=pol)


def sparse_arrays(P):
  """(successors [S, A, K], probabilities [S, A, K]) holding P's nonzeros."""
  k = int((P > 0).sum(-1).max())
  order = np.argsort(-P, axis=-1, kind="stable")[..., :k]
  return order.astype(np.int32), np.take_along_axis(P, order, axis=-1)
