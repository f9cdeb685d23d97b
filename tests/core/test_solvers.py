"""Soft-Bellman solvers: agreement with an independent float64 reference,
certified bounds, the hard-max limit, implicit gradients and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from tests.core import reference as ref

METHODS = ["value_iteration", "anderson", "policy_iteration"]


def _dense(p):
  return hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])


def _sparse(p):
  succ, probs = ref.sparse_arrays(p["P"])
  return hx.SparseTabularMDP(successors=succ, probabilities=probs, rewards=p["r"],
                             discount=p["gamma"], initial=p["mu0"])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("s,a,unavailable,gamma", [(1, 3, 0.0, 0.5), (7, 2, 0.0, 0.9),
                                                   (20, 5, 0.4, 0.95), (40, 4, 0.3, 0.99)])
def test_matches_float64_reference(method, kind, s, a, unavailable, gamma):
  rng = np.random.default_rng(s * 100 + a)
  p = ref.random_problem(rng, s, a, unavailable=unavailable, gamma=gamma,
                         sparse_k=None if kind == "dense" else min(3, s))
  tau = 0.7
  v, q, pi = ref.soft_optimum(p["P"], p["r"], gamma, p["pi_ref"], tau)
  mdp = _dense(p) if kind == "dense" else _sparse(p)
  sol = hx.solve_soft_bellman(mdp, p["pi_ref"], tau, method=method, tol=1e-10)
  assert bool(sol.converged)
  np.testing.assert_allclose(sol.v, v, atol=1e-9, rtol=0)
  np.testing.assert_allclose(sol.q, q, atol=1e-9, rtol=0)
  np.testing.assert_allclose(sol.policy, pi, atol=1e-9, rtol=0)
  # Unavailable actions: exact zero probability and -inf score.
  unavail = p["pi_ref"] == 0
  assert np.all(np.asarray(sol.policy)[unavail] == 0)
  assert np.all(np.isneginf(np.asarray(sol.scores)[unavail]))
  avail = ~unavail
  np.testing.assert_allclose(np.asarray(sol.scores)[avail],
                             (q + tau * np.log(np.where(avail, p["pi_ref"], 1)))[avail], atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_certified_bound_contains_the_true_error(method):
  rng = np.random.default_rng(3)
  p = ref.random_problem(rng, 30, 5, gamma=0.99)
  v, _, _ = ref.soft_optimum(p["P"], p["r"], 0.99, p["pi_ref"], 0.3)
  mdp = _dense(p)
  # A loose tolerance: the loop stops early and the bound must still hold.
  for tol in (1e-1, 1e-3, 1e-6):
    sol = hx.solve_soft_bellman(mdp, p["pi_ref"], 0.3, method=method, tol=tol)
    err = np.max(np.abs(np.asarray(sol.v) - v))
    assert float(sol.error_bound) <= tol
    assert err <= float(sol.error_bound) * (1 + 1e-9) + 1e-12


def test_macqueen_midpoint_needs_far_fewer_sweeps_than_a_sup_norm_stop():
  # At gamma = 0.99 the span stop ends ~100x earlier on random dense MDPs.
  rng = np.random.default_rng(0)
  p = ref.random_problem(rng, 64, 8, gamma=0.99)
  sol = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 1.0, method="value_iteration", tol=1e-6)
  v, _, _ = ref.soft_optimum(p["P"], p["r"], 0.99, p["pi_ref"], 1.0)
  assert np.max(np.abs(np.asarray(sol.v) - v)) <= 1e-6
  # A sup-norm stop ||V_{k+1}-V_k|| (1-g)/g... needs log(1e-6 (1-g) / |V|) / log(g) sweeps.
  sup_norm_sweeps = np.log(1e-6 * 0.01 / np.abs(v).max()) / np.log(0.99)
  assert int(sol.iterations) * 20 < sup_norm_sweeps


def test_policy_iteration_converges_in_a_handful_of_newton_steps():
  rng = np.random.default_rng(5)
  p = ref.random_problem(rng, 30, 5, gamma=0.9)
  vi = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.5, method="value_iteration", tol=1e-10)
  pi = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.5, method="policy_iteration", tol=1e-10)
  an = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.5, method="anderson", tol=1e-10)
  assert int(pi.iterations) <= 8 < int(vi.iterations)
  np.testing.assert_allclose(pi.v, vi.v, atol=1e-9)
  np.testing.assert_allclose(an.v, vi.v, atol=1e-9)


def test_anderson_needs_fewer_sweeps_on_a_slowly_mixing_mdp():
  # Random dense MDPs mix in a few sweeps, leaving nothing to accelerate; a sparse
  # MDP at low temperature and gamma = 0.99 mixes slowly.
  mdp = hx.random_sparse_mdp(jax.random.key(0), 200, 3, 2, discount=0.99)
  pi_ref = hx.uniform_reference(200, 3)
  vi = hx.solve_soft_bellman(mdp, pi_ref, 0.01, method="value_iteration", tol=1e-8)
  an = hx.solve_soft_bellman(mdp, pi_ref, 0.01, method="anderson", tol=1e-8)
  assert bool(vi.converged) and bool(an.converged)
  assert int(an.iterations) < int(vi.iterations)
  np.testing.assert_allclose(an.v, vi.v, atol=2e-8)


def test_chain_closed_form():
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(6, 3))
  tau, gamma = 0.4, 0.8
  mdp = hx.chain_mdp(rewards, discount=gamma)
  pi_ref = np.full((7, 3), 1 / 3)
  sol = hx.solve_soft_bellman(mdp, pi_ref, tau, tol=1e-12)
  # V*(s) = L(s) + gamma V*(s+1), L(s) = tau log mean_a exp(r(s,a)/tau); V*(terminal) = 0.
  local = tau * np.log(np.mean(np.exp(rewards / tau), axis=1))
  expected = np.zeros(7)
  for s in range(5, -1, -1):
    expected[s] = local[s] + gamma * expected[s + 1]
  np.testing.assert_allclose(sol.v, expected, atol=1e-10)
  np.testing.assert_allclose(hx.ceiling(mdp, pi_ref, tau, tol=1e-12), expected[0], atol=1e-10)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_hard_limit_bounds_and_tau_to_zero(kind):
  rng = np.random.default_rng(11)
  p = ref.random_problem(rng, 25, 4, gamma=0.9, sparse_k=None if kind == "dense" else 3)
  mdp = _dense(p) if kind == "dense" else _sparse(p)
  uniform = np.full((25, 4), 0.25)
  v_hard = ref.hard_optimum(p["P"], p["r"], 0.9, uniform)
  hard = hx.solve_hard_bellman(mdp, uniform, tol=1e-10)
  np.testing.assert_allclose(hard.v, v_hard, atol=1e-9)
  gap = None
  for tau in (1.0, 0.1, 0.01, 0.001):
    v = np.asarray(hx.solve_soft_bellman(mdp, uniform, tau, tol=1e-11).v)
    # V* - tau log|A| / (1 - gamma) <= V*_tau <= V*.
    assert np.all(v <= v_hard + 1e-9)
    assert np.all(v >= v_hard - tau * np.log(4) / 0.1 - 1e-9)
    new_gap = np.max(v_hard - v)
    assert gap is None or new_gap < gap
    gap = new_gap
  # The lower bound is attained where all actions tie, so compare at the solve's accuracy.
  assert gap <= 0.001 * np.log(4) / 0.1 + 1e-9


def test_sparse_and_dense_forms_agree():
  mdp = hx.random_sparse_mdp(jax.random.key(0), 50, 4, 3, discount=0.95)
  pi_ref = hx.random_reference(jax.random.key(1), 50, 4, unavailable_fraction=0.3)
  a = hx.solve_soft_bellman(mdp, pi_ref, 0.5, tol=1e-11)
  b = hx.solve_soft_bellman(hx.to_dense(mdp), pi_ref, 0.5, tol=1e-11)
  np.testing.assert_allclose(a.v, b.v, atol=1e-9)
  np.testing.assert_allclose(a.policy, b.policy, atol=1e-9)
  back = hx.to_sparse(hx.to_dense(mdp))
  c = hx.solve_soft_bellman(back, pi_ref, 0.5, tol=1e-11)
  np.testing.assert_allclose(c.v, a.v, atol=1e-9)


def test_float32_default_and_float64_when_asked():
  with jax.enable_x64(False):
    mdp = hx.random_dense_mdp(jax.random.key(0), 16, 3, discount=0.9)
    sol = hx.solve_soft_bellman(mdp, hx.uniform_reference(16, 3), 0.5, tol=1e-4)
    assert sol.v.dtype == jnp.float32
    assert bool(sol.converged)
  mdp64 = hx.random_dense_mdp(jax.random.key(0), 16, 3, discount=0.9)
  assert hx.solve_soft_bellman(mdp64, hx.uniform_reference(16, 3), 0.5).v.dtype == jnp.float64


def _on_float32_grid(P):
  """Rows on the 2^-20 grid summing to exactly 1: the same MDP in float32 and float64.

  Otherwise float32 rounding of `P` moves `V*` by about `gamma/(1-gamma) eps |V*|`, an
  input error no solver certificate covers.
  """
  q = np.floor(P * 2.0**20)
  top = q.argmax(-1)[..., None]
  np.put_along_axis(q, top, np.take_along_axis(q, top, -1) + (2.0**20 - q.sum(-1))[..., None], -1)
  return q / 2.0**20


def _float32(p):
  return hx.TabularMDP(transitions=p["P"].astype(np.float32), rewards=p["r"].astype(np.float32),
                       discount=np.float32(p["gamma"]), initial=p["mu0"].astype(np.float32))


@pytest.mark.parametrize("method", METHODS + ["auto"])
def test_float32_tol_below_the_floor_stops_at_the_floor(method):
  rng = np.random.default_rng(2)
  p = ref.random_problem(rng, 64, 8, gamma=0.99)
  # Rewards of order 100: |V*| ~ 1e4, so float32 cannot certify 1e-6.
  p["P"] = _on_float32_grid(p["P"])
  # The reference solves the float32 numbers (a 1e-8 change of gamma moves V* by 1e-2 here).
  p["r"] = np.asarray(p["r"] * 100.0, np.float32).astype(np.float64)
  p["gamma"] = float(np.float32(0.99))
  p["pi_ref"] = p["pi_ref"].astype(np.float32).astype(np.float64)
  v64, _, _ = ref.soft_optimum(p["P"], p["r"], p["gamma"], p["pi_ref"], 1.0)
  with jax.enable_x64(False):
    mdp, pi_ref = _float32(p), p["pi_ref"].astype(np.float32)
    reachable = hx.solve_soft_bellman(mdp, pi_ref, 1.0, method=method)
    below = hx.solve_soft_bellman(mdp, pi_ref, 1.0, method=method, tol=1e-6)
  assert bool(reachable.converged)
  # tol is below float32's floor: the loop stops once the bound is at the floor
  # (within twice it), says it did not converge, reports the floor, and costs no
  # more iterations than the reachable default.
  assert not bool(below.converged)
  assert 1e-6 < float(below.rounding_floor) and float(below.tol) == pytest.approx(1e-6)
  assert float(below.error_bound) <= 2 * float(below.rounding_floor)
  assert int(below.iterations) <= int(reachable.iterations)
  for sol in (reachable, below):
    err = np.max(np.abs(np.asarray(sol.v, np.float64) - v64))
    assert err <= float(sol.error_bound)


def test_default_tol_converges_on_the_readme_problem_in_float32():
  with jax.enable_x64(False):
    mdp = hx.random_dense_mdp(jax.random.key(0), 64, 8, discount=0.99)
    pi_ref = hx.random_reference(jax.random.key(1), 64, 8, unavailable_fraction=0.25)
    sol = hx.solve_soft_bellman(mdp, pi_ref, 0.1)
    assert sol.v.dtype == jnp.float32
  assert bool(sol.converged)
  # The default aims at twice the floor: a few float32 ulps of |V*| (~80 here).
  assert float(sol.tol) == pytest.approx(2 * float(sol.rounding_floor), rel=1e-6)
  v_scale = float(np.max(np.abs(np.asarray(sol.v))))
  assert float(sol.tol) < 1e3 * np.finfo(np.float32).eps * v_scale
  v64, _, _ = ref.soft_optimum(np.asarray(mdp.transitions, np.float64),
                               np.asarray(mdp.rewards, np.float64), float(mdp.discount),
                               np.asarray(pi_ref, np.float64), 0.1)
  assert np.max(np.abs(np.asarray(sol.v, np.float64) - v64)) <= float(sol.error_bound)


def test_default_tol_in_float64_is_near_machine_precision():
  rng = np.random.default_rng(4)
  p = ref.random_problem(rng, 30, 4, gamma=0.95)
  v64, _, _ = ref.soft_optimum(p["P"], p["r"], 0.95, p["pi_ref"], 0.5)
  sol = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.5)
  assert bool(sol.converged)
  assert float(sol.tol) < 1e-11 * max(1.0, np.abs(v64).max())
  assert np.max(np.abs(np.asarray(sol.v) - v64)) <= float(sol.error_bound)


def _ring(s, gamma, seed):
  """Two deterministic moves, one step either way round a cycle: it mixes slowly."""
  rng = np.random.default_rng(seed)
  a = 2
  offsets = np.array([1, -1])
  succ = (np.arange(s)[:, None] + offsets[None, :]) % s
  P = np.zeros((s, a, s))
  np.put_along_axis(P, succ[..., None], 1.0, axis=-1)
  return dict(P=P, r=rng.uniform(size=(s, a)), gamma=gamma, mu0=np.full(s, 1 / s),
              pi_ref=np.full((s, a), 1 / a))


def test_auto_runs_plain_sweeps_on_a_well_mixing_mdp():
  # Dirichlet(1) rows mix in a few sweeps: "auto" is value iteration there.
  p = ref.random_problem(np.random.default_rng(6), 64, 8, gamma=0.99)
  v64, _, _ = ref.soft_optimum(p["P"], p["r"], 0.99, p["pi_ref"], 0.1)
  auto = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.1, tol=1e-9)
  vi = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.1, method="value_iteration", tol=1e-9)
  assert bool(auto.converged)
  assert int(auto.iterations) == int(vi.iterations)
  np.testing.assert_array_equal(auto.v, vi.v)
  assert np.max(np.abs(np.asarray(auto.v) - v64)) <= float(auto.error_bound)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_auto_accelerates_a_slowly_mixing_mdp(kind):
  # A deterministic cycle at gamma = 0.99 contracts the span by about gamma per
  # sweep: "auto" hands over to Anderson and needs far fewer sweeps.
  p = _ring(40, 0.99, seed=0)
  v64, _, _ = ref.soft_optimum(p["P"], p["r"], 0.99, p["pi_ref"], 0.1, iters=400)
  mdp = _dense(p) if kind == "dense" else _sparse(p)
  auto = hx.solve_soft_bellman(mdp, p["pi_ref"], 0.1, tol=1e-8)
  vi = hx.solve_soft_bellman(mdp, p["pi_ref"], 0.1, method="value_iteration", tol=1e-8)
  assert bool(auto.converged) and bool(vi.converged)
  assert 4 * int(auto.iterations) < int(vi.iterations)
  assert np.max(np.abs(np.asarray(auto.v) - v64)) <= float(auto.error_bound)


def test_hard_solution_reports_its_floor_and_tolerance():
  p = ref.random_problem(np.random.default_rng(12), 20, 3, gamma=0.9)
  uniform = np.full((20, 3), 1 / 3)
  hard = hx.solve_hard_bellman(_dense(p), uniform)
  assert bool(hard.converged)
  assert float(hard.tol) == pytest.approx(2 * float(hard.rounding_floor), rel=1e-6)
  v_hard = ref.hard_optimum(p["P"], p["r"], 0.9, uniform)
  # The reference (value iteration) is itself accurate to about 1e-12.
  assert np.max(np.abs(np.asarray(hard.v) - v_hard)) <= float(hard.error_bound) + 1e-11


# ----------------------------------------------------------------------------
# Implicit differentiation
# ----------------------------------------------------------------------------

def _unrolled_ceiling(P, r, gamma, mu0, pi_ref, tau, sweeps=800):
  """Differentiable-by-unrolling soft value iteration (the check, not the method)."""
  from harnax.core import bellman
  mdp = hx.TabularMDP(transitions=P, rewards=r, discount=gamma, initial=mu0)

  def body(_, v):
    return bellman.soft_bellman_operator(mdp, v, pi_ref, tau)

  v = jax.lax.fori_loop(0, sweeps, body, jnp.zeros(r.shape[0]))
  return jnp.dot(mu0, v)


def _implicit_ceiling(P, r, gamma, mu0, pi_ref, tau, method="policy_iteration"):
  mdp = hx.TabularMDP(transitions=P, rewards=r, discount=gamma, initial=mu0)
  return hx.ceiling(mdp, pi_ref, tau, method=method, tol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_implicit_gradients_match_unrolled_differentiation(method):
  rng = np.random.default_rng(7)
  p = ref.random_problem(rng, 12, 3, unavailable=0.3, gamma=0.95)
  args = (p["P"], p["r"], 0.95, p["mu0"], p["pi_ref"], 0.6)
  argnums = (0, 1, 2, 4, 5)
  g_imp = jax.grad(lambda *a: _implicit_ceiling(*a, method=method), argnums=argnums)(*args)
  g_unr = jax.grad(_unrolled_ceiling, argnums=argnums)(*args)
  for name, gi, gu in zip(["transitions", "rewards", "discount", "pi_ref", "tau"], g_imp, g_unr):
    np.testing.assert_allclose(gi, gu, atol=1e-8, err_msg=name)


def test_implicit_gradients_match_central_finite_differences():
  rng = np.random.default_rng(8)
  p = ref.random_problem(rng, 6, 3, gamma=0.9)
  tau = 0.5

  def c_of(r, t):
    mdp = hx.TabularMDP(transitions=p["P"], rewards=r, discount=0.9, initial=p["mu0"])
    return hx.ceiling(mdp, p["pi_ref"], t, tol=1e-13)

  g_r, g_t = jax.grad(c_of, argnums=(0, 1))(p["r"], tau)
  eps = 1e-6
  fd_r = np.zeros_like(p["r"])
  for idx in np.ndindex(p["r"].shape):
    e = np.zeros_like(p["r"])
    e[idx] = eps
    fd_r[idx] = (c_of(p["r"] + e, tau) - c_of(p["r"] - e, tau)) / (2 * eps)
  fd_t = (c_of(p["r"], tau + eps) - c_of(p["r"], tau - eps)) / (2 * eps)
  np.testing.assert_allclose(g_r, fd_r, atol=1e-7)
  np.testing.assert_allclose(g_t, fd_t, atol=1e-7)
  # dC/dr(s, a) = d*(s) pi*(a|s) / (1 - gamma): sums to 1 / (1 - gamma).
  np.testing.assert_allclose(np.sum(g_r), 10.0, atol=1e-9)


def test_implicit_gradient_through_sparse_probabilities():
  mdp = hx.random_sparse_mdp(jax.random.key(3), 15, 3, 2, discount=0.9)
  pi_ref = hx.uniform_reference(15, 3)

  def c_sparse(probs):
    m = hx.SparseTabularMDP(successors=mdp.successors, probabilities=probs,
                            rewards=mdp.rewards, discount=mdp.discount, initial=mdp.initial)
    return hx.ceiling(m, pi_ref, 0.5, method="value_iteration", tol=1e-12)

  def c_dense(probs):
    m = hx.SparseTabularMDP(successors=mdp.successors, probabilities=probs,
                            rewards=mdp.rewards, discount=mdp.discount, initial=mdp.initial)
    return hx.ceiling(hx.to_dense(m), pi_ref, 0.5, tol=1e-12)

  np.testing.assert_allclose(jax.grad(c_sparse)(mdp.probabilities),
                             jax.grad(c_dense)(mdp.probabilities), atol=1e-8)


def test_gradient_is_zero_for_unavailable_reference_entries():
  rng = np.random.default_rng(9)
  p = ref.random_problem(rng, 8, 4, unavailable=0.4, gamma=0.9)
  g = jax.grad(lambda pr: _implicit_ceiling(p["P"], p["r"], 0.9, p["mu0"], pr, 0.5))(p["pi_ref"])
  assert np.all(np.isfinite(g))
  assert np.all(np.asarray(g)[p["pi_ref"] == 0] == 0)


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
  rng = np.random.default_rng(0)
  p = ref.random_problem(rng, 4, 2)
  return p


@pytest.mark.parametrize("tau", [0.0, -1.0, np.nan, np.inf])
def test_rejects_bad_temperature(small, tau):
  with pytest.raises(ValueError, match="tau"):
    hx.solve_soft_bellman(_dense(small), small["pi_ref"], tau)


def test_rejects_state_without_available_action(small):
  pi_ref = small["pi_ref"].copy()
  pi_ref[2] = 0
  with pytest.raises(ValueError,
                     match="pi_ref: every state needs at least one available action; state 2"):
    hx.solve_soft_bellman(_dense(small), pi_ref, 1.0)


def test_rejects_bad_reference_shape_and_values(small):
  with pytest.raises(ValueError, match=r"pi_ref: expected shape \[4, 2\]"):
    hx.solve_soft_bellman(_dense(small), np.full((4, 3), 1 / 3), 1.0)
  with pytest.raises(ValueError, match="pi_ref: expected non-negative"):
    hx.solve_soft_bellman(_dense(small), np.array([[1.5, -0.5]] * 4), 1.0)
  with pytest.raises(ValueError, match="pi_ref: expected probabilities summing to 1"):
    hx.solve_soft_bellman(_dense(small), np.full((4, 2), 0.4), 1.0)
  with pytest.raises(ValueError, match="pi_ref: expected finite"):
    hx.solve_soft_bellman(_dense(small), np.array([[np.nan, 1.0]] * 4), 1.0)


def test_rejects_bad_options(small):
  with pytest.raises(ValueError, match="method"):
    hx.solve_soft_bellman(_dense(small), small["pi_ref"], 1.0, method="magic")
  for bad_tol in (0, -1e-3, np.nan, "1e-6"):
    with pytest.raises(ValueError, match="tol: expected None or a positive finite number"):
      hx.solve_soft_bellman(_dense(small), small["pi_ref"], 1.0, tol=bad_tol)
  with pytest.raises(ValueError, match="max_iters"):
    hx.solve_soft_bellman(_dense(small), small["pi_ref"], 1.0, max_iters=0)
  with pytest.raises(ValueError, match="tau: expected a scalar"):
    hx.solve_soft_bellman(_dense(small), small["pi_ref"], np.ones(3))


def test_rejects_a_batch_without_vmap(small):
  batch = hx.stack([_dense(small), _dense(small)])
  with pytest.raises(ValueError, match="jax.vmap"):
    hx.solve_soft_bellman(batch, small["pi_ref"], 1.0)


def test_max_iters_cap_reports_not_converged(small):
  p = ref.random_problem(np.random.default_rng(1), 10, 3, gamma=0.99)
  sol = hx.solve_soft_bellman(_dense(p), p["pi_ref"], 0.1, method="value_iteration",
                              tol=1e-12, max_iters=3)
  assert int(sol.iterations) == 3
  assert not bool(sol.converged)
  assert float(sol.error_bound) > 1e-12
