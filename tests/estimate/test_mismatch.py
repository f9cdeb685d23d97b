"""Sample-based mismatch: per-state KL estimators, convergence to the exact M,
the variance formula, bootstrap coverage, the every-step variant, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax.estimate import bootstrap
from harnax.estimate import mismatch as mm

TAU = 0.5
S, A = 6, 3


@pytest.fixture(scope="module")
def problem():
  mdp = hx.random_dense_mdp(jax.random.PRNGKey(10), S, A, discount=0.8)
  ref = hx.random_reference(jax.random.PRNGKey(11), S, A, unavailable_fraction=0.3)
  pi = hx.random_policy(jax.random.PRNGKey(12), ref)
  sol = hx.solve_soft_bellman(mdp, ref, TAU, tol=1e-12)
  m = float(hx.mismatch(mdp, pi, ref, TAU, solution=sol))
  return mdp, ref, pi, sol.policy, m


def _np_kl(p, q):
  pos = p > 0
  return float(np.sum(p[pos] * np.log(p[pos] / q[pos])))


def test_plugin_kl_and_miller_madow_match_numpy():
  counts = np.array([[3.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
  target = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
  plain = mm.plugin_kl(counts, target, correction="none")
  for i in range(2):
    assert float(plain[i]) == pytest.approx(_np_kl(counts[i] / counts[i].sum(), target[i]),
                                            abs=1e-14)
  mad = mm.plugin_kl(counts, target, clip=False)
  np.testing.assert_allclose(mad, plain - np.array([1 / 8, 0.0]), atol=1e-14)
  clipped = mm.plugin_kl(np.array([[1.0, 1.0, 0.0]]), np.array([[0.5, 0.5, 0.0]]))
  assert float(clipped[0]) == 0.0   # -(2-1)/4 clipped at 0


def test_k1_and_k3_match_numpy():
  rng = np.random.default_rng(0)
  lp, lq = np.log(rng.dirichlet(np.ones(5), 3)), np.log(rng.dirichlet(np.ones(5), 3))
  l = lp - lq
  np.testing.assert_allclose(mm.k1_kl(lp, lq), l.mean(-1), atol=1e-14)
  np.testing.assert_allclose(mm.k3_kl(lp, lq), (np.exp(-l) - 1 + l).mean(-1), atol=1e-14)
  assert np.all(np.asarray(mm.k3_kl(lp, lq)) >= 0)


def test_k1_and_k3_are_unbiased_exactly():
  # E_{a~p} of the per-action term equals KL(p || q) exactly (finite sum).
  p = np.array([0.6, 0.3, 0.1])
  q = np.array([0.2, 0.5, 0.3])
  l = np.log(p) - np.log(q)
  kl = _np_kl(p, q)
  assert np.dot(p, np.asarray(mm.k1_kl(l[:, None], np.zeros((3, 1))))) == pytest.approx(kl)
  assert np.dot(p, np.asarray(mm.k3_kl(l[:, None], np.zeros((3, 1))))) == pytest.approx(kl)


@pytest.mark.parametrize("estimator", ["k1", "k3", "miller_madow"])
def test_estimate_converges_to_exact_mismatch(problem, estimator):
  mdp, _, pi, pi_star, m = problem
  est = mm.estimate_mismatch(jax.random.PRNGKey(20), mdp, pi, pi_star, TAU, num_states=20000,
                             num_action_samples=32, estimator=estimator, num_resamples=200)
  scale = TAU / (1 - 0.8)
  ses = []
  for n in (200, 2000, 20000):
    sub = np.asarray(est.samples[:n])
    se = scale * sub.std(ddof=1) / np.sqrt(n)
    # Miller–Madow leaves an O(1/N^2) bias; 0.01 M covers it at N = 32.
    assert abs(scale * sub.mean() - m) <= 4 * se + 0.01 * m
    ses.append(se)
  # The error bar shrinks like 1/sqrt(n) and ends below 2% of M.
  assert ses[2] < ses[0] / 5 and ses[2] < 0.02 * m
  assert float(est.value) == pytest.approx(scale * np.mean(np.asarray(est.samples)))
  assert float(est.ci_low) <= m + 4 * float(est.stderr)
  # The pilot rollouts' own actions (one per transition) count, then N per sampled state.
  assert int(est.env_steps) > 0
  assert int(est.action_samples) == int(est.env_steps) + 20000 * 32
  assert 0 <= float(est.truncation_bias) < 1e-12


@pytest.mark.parametrize("n_actions", [4, 32])
def test_plugin_is_biased_up_and_miller_madow_reduces_the_bias(problem, n_actions):
  # States from the exact d^pi and multinomial counts, drawn with NumPy; the same
  # counts feed both estimators, so their difference is the correction itself.
  mdp, _, pi, pi_star, m = problem
  rng = np.random.default_rng(22)
  d, p, q = (np.asarray(x) for x in (hx.occupancy(mdp, pi), pi, pi_star))
  states = rng.choice(S, size=40000, p=d)
  counts = np.stack([rng.multinomial(n_actions, p[s]) for s in states]).astype(float)
  scale = TAU / (1 - 0.8)
  plug = scale * np.asarray(mm.plugin_kl(counts, q[states], correction="none"))
  mad = scale * np.asarray(mm.plugin_kl(counts, q[states]))
  se = plug.std(ddof=1) / np.sqrt(plug.size)
  assert plug.mean() - m > 5 * se
  assert abs(mad.mean() - m) < plug.mean() - m
  if n_actions == 32:     # a large-N device: at N = 32 most of the bias is gone
    assert abs(mad.mean() - m) < 0.5 * (plug.mean() - m)


@pytest.fixture(scope="module")
def repeated(problem):
  """200 independent k1 estimates (n = 100 states, N = 4), vmapped over keys."""
  mdp, _, pi, pi_star, _ = problem
  keys = jax.random.split(jax.random.PRNGKey(30), 200)
  f = lambda k: mm.estimate_mismatch(k, mdp, pi, pi_star, TAU, num_states=100,  # noqa: E731
                                     num_action_samples=4, estimator="k1", confidence=0.9,
                                     num_resamples=300)
  return jax.vmap(f)(keys)


def test_variance_formula_matches_repeated_estimates(problem, repeated):
  mdp, _, pi, pi_star, _ = problem
  formula = float(mm.mismatch_estimator_variance(mdp, pi, pi_star, TAU, num_states=100,
                                                 num_action_samples=4, estimator="k1"))
  empirical = float(np.var(np.asarray(repeated.value), ddof=1))
  # 200 replicates: the sample variance is within ~10% (1 sd) of the truth.
  assert empirical == pytest.approx(formula, rel=0.25)
  # The per-estimate standard errors agree with it as well.
  assert float(np.mean(np.asarray(repeated.stderr) ** 2)) == pytest.approx(formula, rel=0.25)


def test_bootstrap_intervals_cover_at_about_the_nominal_rate(problem, repeated):
  m = problem[-1]
  lo, hi = np.asarray(repeated.ci_low), np.asarray(repeated.ci_high)
  coverage = np.mean((lo <= m) & (m <= hi))
  # Nominal 0.9; binomial sd over 200 seeds is 0.021, and percentile
  # intervals under-cover slightly at n = 100.
  assert 0.82 <= coverage <= 0.96
  assert np.mean(np.asarray(repeated.value)) == pytest.approx(m, rel=0.03)


def test_every_step_estimate_converges_and_reports_its_truncation_bound(problem):
  mdp, _, pi, pi_star, m = problem
  est = mm.every_step_mismatch(jax.random.PRNGKey(40), mdp, pi, pi_star, TAU, num_rollouts=4000,
                               horizon=40, num_action_samples=4, estimator="k3",
                               num_resamples=200)
  kl = np.asarray(hx.kl_between(pi, pi_star))
  bound = TAU * 0.8 ** 40 * kl.max() / (1 - 0.8)
  assert float(est.truncation_bias) == pytest.approx(bound)
  assert abs(float(est.value) - m) <= 4 * float(est.stderr) + bound
  assert int(est.env_steps) == 4000 * 40 and int(est.action_samples) == 4000 * 40 * (1 + 4)


@pytest.mark.parametrize("horizon", [1, 3, 10])
def test_truncation_bias_bound_holds_exactly(problem, horizon):
  # E[tau sum_{t<H} gamma^t KL(s_t)] in closed form vs the bound on M minus it.
  mdp, _, pi, pi_star, m = problem
  p_pi = np.einsum("sa,sat->st", np.asarray(pi), np.asarray(mdp.transitions))
  kl = np.asarray(hx.kl_between(pi, pi_star))
  x, mean = np.asarray(mdp.initial), 0.0
  for t in range(horizon):
    mean += TAU * 0.8 ** t * x @ kl
    x = x @ p_pi
  bias = m - mean
  assert 0 <= bias <= TAU * 0.8 ** horizon * kl.max() / (1 - 0.8) + 1e-12


def test_float32_sparse_estimate_runs_and_agrees():
  # The default dtype path, on a sparse MDP: same estimator, float32 throughout.
  with jax.enable_x64(False):
    mdp = hx.random_sparse_mdp(jax.random.PRNGKey(60), S, A, 2, discount=0.8)
    ref = hx.uniform_reference(S, A)
    pi = hx.random_policy(jax.random.PRNGKey(61), ref)
    sol = hx.solve_soft_bellman(mdp, ref, TAU)
    m = float(hx.mismatch(mdp, pi, ref, TAU, solution=sol))
    est = mm.estimate_mismatch(jax.random.PRNGKey(62), mdp, pi, sol.policy, TAU,
                               num_states=20000, num_action_samples=32, estimator="k3",
                               num_resamples=200)
    assert est.value.dtype == np.float32
    assert abs(float(est.value) - m) <= 4 * float(est.stderr) + 1e-4


def test_mismatch_from_state_kls_and_bootstrap(problem):
  kls = jnp.array([0.1, 0.3, 0.2, 0.4])
  assert float(mm.mismatch_from_state_kls(kls, 2.0, 0.5)) == pytest.approx(1.0)
  lo, hi = bootstrap.bootstrap_ci(jax.random.PRNGKey(0), kls, num_resamples=500, scale=4.0)
  assert 4 * 0.1 <= float(lo) <= 4 * 0.25 <= float(hi) <= 4 * 0.4
  # sample std 0.1291 (ddof=1) over sqrt(4)
  assert float(bootstrap.standard_error(kls)) == pytest.approx(np.sqrt(0.05 / 3) / 2)
  assert float(bootstrap.standard_error(kls[:1])) == np.inf


def test_bad_input_raises_naming_the_field(problem):
  mdp, _, pi, pi_star, _ = problem
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="counts"):
    mm.plugin_kl(np.zeros((0, 3)), np.zeros((0, 3)))
  with pytest.raises(ValueError, match="counts: every state needs N >= 1"):
    mm.plugin_kl([[0.0, 0.0]], [[0.5, 0.5]])
  with pytest.raises(ValueError, match="target"):
    mm.plugin_kl([[1.0, 2.0]], [[0.5, 0.6]])
  with pytest.raises(ValueError, match="log_policy"):
    mm.k1_kl(np.zeros((2, 0)), np.zeros((2, 0)))
  with pytest.raises(ValueError, match="log_target"):
    mm.k3_kl(np.zeros((2, 3)), np.zeros((2, 2)))
  with pytest.raises(ValueError, match="state_kls"):
    mm.mismatch_from_state_kls(jnp.zeros((0,)), tau=1.0, discount=0.5)
  with pytest.raises(ValueError, match="values"):
    bootstrap.bootstrap_ci(key, jnp.zeros((0,)))
  with pytest.raises(ValueError, match="confidence"):
    bootstrap.bootstrap_ci(key, jnp.ones(3), confidence=1.5)
  with pytest.raises(ValueError, match="num_resamples"):
    bootstrap.bootstrap_ci(key, jnp.ones(3), num_resamples=0)
  kw = dict(num_states=10, num_action_samples=2)
  with pytest.raises(ValueError, match="num_action_samples"):
    mm.estimate_mismatch(key, mdp, pi, pi_star, TAU, num_states=10, num_action_samples=0)
  with pytest.raises(ValueError, match="num_states"):
    mm.estimate_mismatch(key, mdp, pi, pi_star, TAU, num_states=0, num_action_samples=2)
  with pytest.raises(ValueError, match="policy"):
    mm.estimate_mismatch(key, mdp, pi * 1.1, pi_star, TAU, **kw)
  with pytest.raises(ValueError, match="pi_star"):
    mm.estimate_mismatch(key, mdp, pi, pi_star * 0.9, TAU, **kw)
  with pytest.raises(ValueError, match="estimator"):
    mm.estimate_mismatch(key, mdp, pi, pi_star, TAU, estimator="k2", **kw)
  with pytest.raises(ValueError, match="tau"):
    mm.estimate_mismatch(key, mdp, pi, pi_star, -1.0, **kw)
  one_hot = jnp.zeros((S, A)).at[:, 0].set(1.0)
  uniform = jnp.full((S, A), 1.0 / A)
  with pytest.raises(ValueError, match="pi_star: zero"):
    mm.estimate_mismatch(key, mdp, uniform, one_hot, TAU, **kw)
  with pytest.raises(ValueError, match="horizon"):
    mm.every_step_mismatch(key, mdp, pi, pi_star, TAU, num_rollouts=2, horizon=0,
                           num_action_samples=2)
