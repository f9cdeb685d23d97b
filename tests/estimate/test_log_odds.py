"""The log-odds route: score errors from pairs of actions and the bounds
`lower <= M <= upper` of docs/estimation.md §5, property-tested with hypothesis."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax.estimate import log_odds as lo

PROFILE = settings(max_examples=30, deadline=None, derandomize=True)

# Relative slack for rounding only (the bounds are tight: ratios reach 1).
RTOL = 1e-9


def _distribution(rng, a, scale, zeros):
  logits = rng.normal(size=a) * scale
  logits[zeros] = -np.inf
  p = np.exp(logits - logits[np.isfinite(logits)].max())
  return p / p.sum()


pairs_of_policies = st.builds(
    lambda seed, a, sp, sq, unavailable, policy_zero, tau: _pair(
        np.random.default_rng(seed), a, sp, sq, unavailable, policy_zero, tau),
    seed=st.integers(0, 2**31 - 1), a=st.sampled_from([2, 3, 5, 8]),
    sp=st.sampled_from([0.01, 0.5, 2.0, 8.0, 25.0]),
    sq=st.sampled_from([0.01, 0.5, 2.0, 8.0, 25.0]),
    unavailable=st.booleans(), policy_zero=st.booleans(), tau=st.sampled_from([0.01, 1.0, 30.0]))


def _pair(rng, a, sp, sq, unavailable, policy_zero, tau):
  off = [a - 1] if unavailable else []           # unavailable: zero in both
  q = _distribution(rng, a, sq, off)
  zero_p = off + ([0] if policy_zero and a - len(off) > 1 else [])
  p = _distribution(rng, a, sp, zero_p)
  return p, q, tau


def _kl(p, q):
  pos = p > 0
  return float(np.sum(p[pos] * (np.log(p[pos]) - np.log(q[pos]))))


@PROFILE
@given(pairs_of_policies)
def test_state_kl_is_sandwiched_by_score_errors(case):
  p, q, tau = case
  kl = _kl(p, q)
  rng_ = float(lo.score_error_range(p[None], q[None], tau=tau)[0])
  # Upper: KL <= Delta^2 / (8 tau^2)  (infinite Delta when p misses an available action).
  assert kl <= rng_ ** 2 / (8 * tau ** 2) * (1 + RTOL) + 1e-15
  # Lower: w(a, b) e(a, b)^2 <= 2 tau^2 KL for every pair.
  a = p.shape[0]
  aa, bb = np.repeat(np.arange(a), a)[None], np.tile(np.arange(a), a)[None]
  we = np.asarray(lo.weighted_pair_errors(p[None], q[None], aa, bb, tau=tau))[0]
  assert np.all(we <= 2 * tau ** 2 * kl * (1 + RTOL) + 1e-15)


def _mdp_case(seed, s, a, gamma, tau, temp, unavail):
  key = jax.random.PRNGKey(seed)
  k1, k2, k3 = jax.random.split(key, 3)
  mdp = hx.random_dense_mdp(k1, s, a, discount=gamma)
  ref = hx.random_reference(k2, s, a, unavailable_fraction=unavail)
  pi = hx.random_policy(k3, ref, temperature=temp)
  return mdp, ref, pi, tau


mdp_cases = st.builds(
    _mdp_case, seed=st.integers(0, 2**31 - 1), s=st.sampled_from([4]), a=st.sampled_from([3]),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99]), tau=st.sampled_from([0.02, 0.3, 5.0]),
    temp=st.sampled_from([0.05, 0.5, 1.0, 4.0]), unavail=st.sampled_from([0.0, 0.4]))


@PROFILE
@given(mdp_cases)
def test_mismatch_bounds_hold_on_random_mdps(case):
  mdp, ref, pi, tau = case
  sol = hx.solve_soft_bellman(mdp, ref, tau, tol=1e-12)
  m = float(hx.mismatch(mdp, pi, ref, tau, solution=sol))
  lower, m2, upper = (float(x) for x in lo.exact_bounds(mdp, pi, ref, tau, solution=sol))
  assert m2 == pytest.approx(m, rel=1e-9, abs=1e-12)
  scale = max(abs(m), 1e-300)
  assert lower <= m * (1 + 1e-7) + 1e-12 * scale
  assert m <= upper * (1 + 1e-7) + 1e-12


def test_exact_bounds_match_an_independent_numpy_computation():
  mdp, ref, pi, tau = _mdp_case(3, 4, 3, 0.9, 0.3, 1.0, 0.4)
  sol = hx.solve_soft_bellman(mdp, ref, tau, tol=1e-12)
  p, q = np.asarray(pi), np.asarray(sol.policy)
  d = np.asarray(hx.occupancy(mdp, pi))
  up, low = 0.0, 0.0
  for s in range(4):
    avail = q[s] > 0
    l = np.log(p[s][avail]) - np.log(q[s][avail])
    up += d[s] * (tau * (l.max() - l.min())) ** 2
    best = 0.0
    for a in np.flatnonzero(avail):
      for b in np.flatnonzero(avail):
        if a == b:
          continue
        bv = lambda x, y: x * y / (x + y) ** 2  # noqa: E731
        w = (p[s, a] + p[s, b]) * min(bv(p[s, a], p[s, b]), bv(q[s, a], q[s, b]))
        e = tau * (np.log(p[s, a] / p[s, b]) - np.log(q[s, a] / q[s, b]))
        best = max(best, w * e * e)
    low += d[s] * best
  lower, _, upper = lo.exact_bounds(mdp, pi, ref, tau, solution=sol)
  assert float(upper) == pytest.approx(up / (8 * tau * 0.1), rel=1e-10)
  assert float(lower) == pytest.approx(low / (2 * tau * 0.1), rel=1e-10)


def test_sampled_log_odds_route_estimates_the_upper_bound():
  # Deployment version: states from d^pi, N sampled actions, empirical log-odds of
  # every available pair against the exact scores F*, Delta_s as the largest pair
  # error, and the bound averaged over sampled states.
  mdp, ref, pi, tau = _mdp_case(7, 4, 3, 0.8, 0.5, 1.0, 0.0)
  sol = hx.solve_soft_bellman(mdp, ref, tau, tol=1e-12)
  m = float(hx.mismatch(mdp, pi, ref, tau, solution=sol))
  _, _, exact_upper = (float(x) for x in lo.exact_bounds(mdp, pi, ref, tau, solution=sol))
  rng = np.random.default_rng(3)
  d, p = np.asarray(hx.occupancy(mdp, pi)), np.asarray(pi)
  states = rng.choice(4, size=2000, p=d)
  counts = np.stack([rng.multinomial(4000, p[s]) for s in states])
  aa, bb = np.repeat(np.arange(3), 3)[None], np.tile(np.arange(3), 3)[None]
  aa, bb = np.broadcast_to(aa, (2000, 9)), np.broadcast_to(bb, (2000, 9))
  log_odds = lo.empirical_log_odds(counts, aa, bb)
  f = np.asarray(sol.scores)[states]
  e = tau * np.asarray(log_odds) - (np.take_along_axis(f, aa, -1) - np.take_along_axis(f, bb, -1))
  delta = e.max(-1)
  est = float(lo.mismatch_upper_bound(np.full(2000, 1 / 2000), delta, tau=tau, discount=0.8))
  assert est == pytest.approx(exact_upper, rel=0.1)
  assert est >= m


def test_pair_score_errors_are_log_odds_differences_and_ignore_constants():
  tau = 0.7
  logp = np.log(np.array([[0.5, 0.3, 0.2]]))
  f = np.array([[1.0, -0.5, 0.25]])
  aa, bb = np.array([[0, 2]]), np.array([[1, 0]])
  e = lo.pair_score_errors(logp, f, aa, bb, tau=tau)
  want = [tau * (logp[0, 0] - logp[0, 1]) - (f[0, 0] - f[0, 1]),
          tau * (logp[0, 2] - logp[0, 0]) - (f[0, 2] - f[0, 0])]
  np.testing.assert_allclose(e[0], want, atol=1e-14)
  e_shift = lo.pair_score_errors(logp + 3.0, f - 2.0, aa, bb, tau=tau)
  np.testing.assert_allclose(e_shift, e, atol=1e-13)
  # Centred errors: zero mean over available actions, and their range is Delta.
  p = np.array([[0.5, 0.3, 0.2, 0.0]])
  q = np.array([[0.2, 0.2, 0.6, 0.0]])
  eps = np.asarray(lo.centered_score_errors(p, q, tau=tau))
  assert abs(eps[0, :3].sum()) < 1e-14 and eps[0, 3] == 0.0
  delta = float(lo.score_error_range(p, q, tau=tau)[0])
  assert delta == pytest.approx(eps[0, :3].max() - eps[0, :3].min())


def test_empirical_log_odds_recover_the_policy_log_odds():
  p = np.array([0.5, 0.3, 0.2])
  rng = np.random.default_rng(0)
  counts = np.bincount(rng.choice(3, size=200000, p=p), minlength=3)
  est = lo.empirical_log_odds(counts, np.array([0, 1]), np.array([1, 2]))
  np.testing.assert_allclose(est, [np.log(5 / 3), np.log(3 / 2)], atol=0.02)
  assert np.isfinite(float(lo.empirical_log_odds(np.array([4, 0]), 0, 1)))


def test_study_literal_form_is_not_scale_consistent():
  # The harness-transfer study's bound read literally:
  # max_a eps(s, a)^2 <= M / (4 tau (1 - gamma)). Scaling
  # rewards and tau by c leaves both policies unchanged, multiplies scores, score
  # errors and M by c: the left side grows as c^2, the right side not at all.
  mdp, ref, pi, tau = _mdp_case(5, 4, 3, 0.9, 0.3, 1.0, 0.0)
  out = []
  for c in (1.0, 100.0):
    scaled = mdp.replace(rewards=c * mdp.rewards)
    sol = hx.solve_soft_bellman(scaled, ref, c * tau, tol=1e-12)
    m = float(hx.mismatch(scaled, pi, ref, c * tau, solution=sol))
    eps = np.asarray(lo.centered_score_errors(pi, sol.policy, tau=c * tau))
    d = np.asarray(hx.occupancy(scaled, pi))
    out.append((float(d @ np.max(eps ** 2, -1)), m / (4 * c * tau * 0.1), m))
  (lhs1, rhs1, m1), (lhs2, rhs2, m2) = out
  assert m2 == pytest.approx(100 * m1, rel=1e-8)
  assert lhs2 == pytest.approx(1e4 * lhs1, rel=1e-8)
  assert rhs2 == pytest.approx(rhs1, rel=1e-8)
  assert lhs2 > rhs2     # so the literal form fails at large enough scale


def _literal_bound_violation(policy, pi_star, tau, gamma):
  """Per state, `max_a eps(s, a)^2 - M_s / (4 tau (1 - gamma))` in NumPy, with
  `M_s = tau / (1 - gamma) KL(s)`: positive where the literal form fails."""
  l = np.log(policy) - np.log(pi_star)
  eps = tau * (l - l.mean(-1, keepdims=True))
  kl = np.array([_kl(p, q) for p, q in zip(policy, pi_star)])
  return np.max(eps ** 2, -1) - tau / (1 - gamma) * kl / (4 * tau * (1 - gamma))


def test_study_literal_form_fails_on_rarely_taken_actions():
  # Both policies almost never take action 2, but disagree on it by a factor e^10:
  # its score error is large while KL (hence M) is tiny.
  tau, gamma = 1.0, 0.5
  q = np.array([[0.5, 0.5 - 1e-9, 1e-9]])
  p = np.array([[0.5, 0.5 - 1e-9 * np.exp(-10), 1e-9 * np.exp(-10)]])
  p = p / p.sum()
  viol = _literal_bound_violation(p, q, tau, gamma)
  assert viol[0] > 10.0
  # The corrected upper bound still holds.
  kl = _kl(p[0], q[0])
  assert kl <= float(lo.score_error_range(p, q, tau=tau)[0]) ** 2 / 8


def test_policy_weighted_errors_are_not_bounded_by_kl():
  # pi = (1/2, 1/2), pi* = (1 - delta, delta): Var_pi(l) grows like log^2(1/delta) while
  # KL grows like log(1/delta), so no constant c gives Var_pi(l) <= c KL.
  ratios = []
  for delta in (1e-2, 1e-8, 1e-32):
    p, q = np.array([0.5, 0.5]), np.array([1 - delta, delta])
    l = np.log(p) - np.log(q)
    var_pi = np.dot(p, l ** 2) - np.dot(p, l) ** 2
    ratios.append(var_pi / _kl(p, q))
  assert ratios[0] < ratios[1] < ratios[2] and ratios[2] > 15
  # Theorem 2's weight stays within its bound on the same pair.
  for delta in (1e-2, 1e-8, 1e-32):
    p, q = np.array([[0.5, 0.5]]), np.array([[1 - delta, delta]])
    we = float(lo.weighted_pair_errors(p, q, np.array([[0]]), np.array([[1]]), tau=1.0)[0, 0])
    assert we <= 2 * _kl(p[0], q[0])


def test_bound_functions_work_under_jit_and_vmap():
  p = jnp.array([[[0.5, 0.3, 0.2]], [[0.1, 0.1, 0.8]]])
  q = jnp.array([[[0.2, 0.2, 0.6]], [[0.3, 0.3, 0.4]]])
  f = jax.jit(jax.vmap(lambda x, y: lo.score_error_range(x, y, tau=1.0)))
  out = f(p, q)
  assert out.shape == (2, 1)
  np.testing.assert_allclose(out[1], lo.score_error_range(p[1], q[1], tau=1.0))


def test_bad_input_raises():
  with pytest.raises(ValueError, match="pi_star"):
    lo.score_error_range(np.array([[0.5, 0.5]]), np.array([[0.5, 0.5, 0.0]]), tau=1.0)
  with pytest.raises(ValueError, match="policy"):
    lo.centered_score_errors(np.array([[0.5, 0.6]]), np.array([[0.5, 0.5]]), tau=1.0)
  with pytest.raises(ValueError, match="tau"):
    lo.pair_score_errors(np.zeros((1, 2)), np.zeros((1, 2)), np.array([[0]]), np.array([[1]]),
                         tau=0.0)
  with pytest.raises(ValueError, match="pseudocount"):
    lo.empirical_log_odds(np.array([1, 2]), 0, 1, pseudocount=-1.0)
