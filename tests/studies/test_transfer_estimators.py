"""harnax.studies.transfer_estimators: the estimator comparisons against independent references.

Exact values come from the float64 NumPy reference of tests/core (soft policy iteration,
occupancy, evaluation by direct solves), never from the code under test; sampled estimates are
checked within central-limit bounds over seeds.
"""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harnax.core import sampling as core_sampling
from harnax.studies import families
from harnax.studies import transfer_estimators as te
from tests.core import reference as ref

pytestmark = pytest.mark.x64

TAU = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3],
                                                os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def option():
  """click-option under H0 and H1: 2 training and 2 held-out instances, an untrained model
  (theta = 0) and one trained 20 steps on H0, read through both harnesses."""
  data = te.compile_family("click-option", num_train=2, num_test=2, harnesses=("H0", "H1"))
  fam = families.LogLinearFamily(0.1)
  theta0 = fam.initial_params()
  trained, _ = fam.train(theta0, data.train["H0"], tau=TAU, steps=20)
  thetas = [theta0, trained]
  pols = jnp.stack([jnp.stack([fam.semantic_policy(t, data.test[h]) for h in ("H0", "H1")])
                    for t in thetas])                                   # [2, 2, N, S, A]
  return data, thetas, pols


def _numpy_instance(batch, n):
  return (np.asarray(batch.mdp.transitions[n]), np.asarray(batch.mdp.rewards[n]),
          float(batch.mdp.discount[n]), np.asarray(batch.mdp.initial[n]),
          np.asarray(batch.pi_ref[n]))


def _reference(batch, policies, horizon=None):
  """Per instance, float64 NumPy: C, J, M, plain value, pi*; with `horizon`, also the means
  truncated after `horizon` steps of the regularized return, the discounted KL sum to pi* and
  the plain reward (what rollouts of that length estimate)."""
  out = []
  for n in range(policies.shape[0]):
    p, r, g, mu0, pref = _numpy_instance(batch, n)
    pol = np.asarray(policies[n])
    v_star, _, pi_star = ref.soft_optimum(p, r, g, pref, TAU)[:3]
    c = mu0 @ v_star
    v, _ = ref.evaluate(p, r, g, pol, pref, TAU)
    d = ref.occupancy(p, g, mu0, pol)
    kl = ref.kl_rows(pol, pi_star)
    m = TAU / (1 - g) * d @ kl
    plain_v, _ = ref.evaluate(p, r, g, pol, pol, TAU)
    row = dict(c=c, j=mu0 @ v, m=m, plain=mu0 @ plain_v, pi_star=pi_star)
    if horizon is not None:
      p_pi = np.einsum("sa,sat->st", pol, p)
      reg = (pol * r).sum(-1) - TAU * ref.kl_rows(pol, pref)
      dist, tr = mu0.copy(), dict(j=0.0, kl=0.0, plain=0.0)
      for t in range(horizon):
        tr["j"] += g ** t * dist @ reg
        tr["kl"] += g ** t * dist @ kl
        tr["plain"] += g ** t * dist @ (pol * r).sum(-1)
        dist = dist @ p_pi
      row["truncated"] = tr
    out.append(row)
  return out


def test_soft_optimum_of_the_reference_matches_the_study(option):
  data, _, pols = option
  for k, h in enumerate(("H0", "H1")):
    b = data.test[h]
    ex = te.exact(pols[1, k], b.mdp, b.pi_ref, TAU)
    refs = _reference(b, pols[1, k])
    np.testing.assert_allclose(ex.ceiling, [x["c"] for x in refs], atol=1e-9)
    np.testing.assert_allclose(ex.value, [x["j"] for x in refs], atol=1e-9)
    np.testing.assert_allclose(ex.mismatch, [x["m"] for x in refs], atol=1e-9)
    np.testing.assert_allclose(ex.plain_value, [x["plain"] for x in refs], atol=1e-9)
    np.testing.assert_allclose(ex.pi_star, np.stack([x["pi_star"] for x in refs]), atol=1e-8)


def test_sampled_mismatch_matches_exact_mismatch_within_clt(option):
  data, _, pols = option
  b = {h: data.test[h] for h in ("H0", "H1")}
  refs = {h: _reference(b[h], pols[1, k]) for k, h in enumerate(b)}
  pi_star = jnp.stack([jnp.stack([x["pi_star"] for x in refs[h]]) for h in b])
  mdp = jax.tree.map(lambda *x: jnp.stack(x), b["H0"].mdp, b["H1"].mdp)
  seeds = 30
  s = te.sample_mismatch_matrix(jax.random.key(0), pols, mdp, pi_star, TAU, num_seeds=seeds,
                                num_states=50, num_action_samples=4, estimator="k1",
                                num_resamples=100)
  assert s.value.shape == (seeds, 2, 2)
  for i in range(2):
    for j, h in enumerate(b):
      exact_m = np.mean([x["m"] for x in _reference(b[h], pols[i, j])])
      x = np.asarray(s.value[:, i, j])
      # k1 is unbiased; the cap (200 steps) biases by < 0.9^200 (negligible).
      assert abs(x.mean() - exact_m) < 4 * x.std(ddof=1) / np.sqrt(seeds) + 1e-12, (i, j)
      assert np.all(np.asarray(s.ci_low[:, i, j]) <= x) and np.all(x <= np.asarray(
          s.ci_high[:, i, j]))


def test_difference_estimates_match_exact_truncated_differences_within_clt(option):
  data, _, pols = option
  horizon, n_act, seeds = 40, 2, 60
  budget = te.match_budget(2 * (2 + n_act) * horizon, horizon=horizon,
                           num_action_samples=n_act)
  assert (budget.num_mismatch_rollouts, budget.num_return_rollouts) == (2, 4)
  b = [data.test["H0"], data.test["H1"]]
  arm_pols = jnp.stack([pols[:, 0], pols[:, 1]])                        # [2 arms, K=2, N, S, A]
  refs = [[_reference(b[a], arm_pols[a, k], horizon) for k in range(2)] for a in range(2)]
  pi_star = jnp.stack([jnp.stack([x["pi_star"] for x in refs[a][0]]) for a in range(2)])
  ceiling = jnp.stack([jnp.array([x["c"] for x in refs[a][0]]) for a in range(2)])
  arms = (jax.tree.map(lambda *x: jnp.stack(x), b[0].mdp, b[1].mdp), arm_pols, pi_star,
          jnp.stack([b[0].pi_ref, b[1].pi_ref]), ceiling)
  est = te.estimate_differences(jax.random.key(1), arms, TAU, budget=budget, horizon=horizon,
                                num_action_samples=n_act, num_seeds=seeds, estimator="k1",
                                num_resamples=100)
  assert est.mismatch.shape == (seeds, 2)

  def mean_over(a, k, key):
    return np.mean([x[key] if key in x else x["truncated"][key] for x in refs[a][k]])

  for k in range(2):
    gap = mean_over(1, k, "c") - mean_over(0, k, "c")
    kl = [np.mean([x["truncated"]["kl"] for x in refs[a][k]]) for a in range(2)]
    targets = {"mismatch": gap - TAU * (kl[1] - kl[0]),
               "rollout": np.mean([x["truncated"]["j"] for x in refs[1][k]])
               - np.mean([x["truncated"]["j"] for x in refs[0][k]]),
               "success": np.mean([x["truncated"]["plain"] for x in refs[1][k]])
               - np.mean([x["truncated"]["plain"] for x in refs[0][k]])}
    for name, target in targets.items():
      x = np.asarray(getattr(est, name)[:, k])
      assert abs(x.mean() - target) < 4 * x.std(ddof=1) / np.sqrt(seeds) + 1e-12, (name, k)
    # Truncation moves each target by less than its bound gamma^H max|.| / (1 - gamma).
    exact_d = mean_over(1, k, "j") - mean_over(0, k, "j")
    assert abs(targets["rollout"] - exact_d) < 2 * 0.9 ** horizon * 10 * 2.0
  # Equal budgets by construction: both sides spend at most the budget, per arm and instance.
  per = 2 * 2                                                           # arms x instances
  assert int(est.mismatch_units[0, 0]) == per * budget.mismatch_units <= per * budget.budget
  assert int(est.rollout_units[0, 0]) == per * budget.return_units <= per * budget.budget


@pytest.mark.parametrize("budget,horizon,n", [(1200, 30, 4), (1000, 20, 1), (97, 7, 3),
                                              (5000, 30, 16)])
def test_budgets_are_equal_by_construction(budget, horizon, n):
  b = te.match_budget(budget, horizon=horizon, num_action_samples=n)
  # Counted by hand: a rollout step is one action query and one transition; the mismatch
  # side queries n more actions at each visited state.
  cost_m, cost_r = horizon * (2 + n), 2 * horizon
  assert b.mismatch_units == b.num_mismatch_rollouts * cost_m <= budget
  assert b.return_units == b.num_return_rollouts * cost_r <= budget
  assert budget - b.mismatch_units < cost_m and budget - b.return_units < cost_r
  assert b.num_mismatch_rollouts >= 1


def test_reversal_step_on_constructed_curves():
  d = jnp.array([-0.3, -0.1, 0.05, 0.2, -0.01, 0.3])
  assert int(te.reversal_step(d)) == 2
  lower = d - 0.1                                                      # an interval of +-0.1
  assert int(te.reversal_step(d, lower)) == 3
  assert int(te.reversal_step(-jnp.abs(d))) == -1
  batch = jnp.stack([d, -jnp.abs(d), jnp.roll(d, -2)])
  np.testing.assert_array_equal(jax.jit(jax.vmap(te.reversal_step))(batch), [2, -1, 0])
  with pytest.raises(ValueError, match="values: expected"):
    te.reversal_step(jnp.zeros((0,)))


def test_small_difference_metrics_on_a_known_crossing():
  steps = np.array([0, 2, 4, 6, 8])
  exact_d = np.array([-0.2, -0.1, 0.1, 0.2, 0.3])                       # true reversal: step 4
  # Seed 0 calls it at step 2 (early), seed 1 at step 4, seed 2 at step 8 (late); seed 3 never.
  est = np.array([[-0.2, 0.05, 0.1, 0.2, 0.3], [-0.2, -0.1, 0.1, 0.2, 0.3],
                  [-0.2, -0.1, -0.1, -0.1, 0.3], [-0.3, -0.3, -0.3, -0.3, -0.3]])
  half = 0.05 * np.ones_like(est)
  diff = te.Difference(est, est - half, est + half, est + 0.1, est, est + 0.2, est, est - half,
                       est + half, np.full_like(est, 8, int), np.full_like(est, 8, int))
  m = te.small_difference_metrics(exact_d, diff, steps, plain_difference=exact_d + 0.1)
  assert m["true_step"] == 4
  np.testing.assert_array_equal(m["mismatch"]["point_calls"], [2, 4, 8, -1])
  assert m["mismatch"]["point"] == pytest.approx(dict(early=0.25, exact=0.25, late=0.5,
                                                      never=0.25, median_step=4.0))
  # Interval rule (lower end > 0): seed 0's 0.05 - 0.05 = 0 is not above zero.
  np.testing.assert_array_equal(m["mismatch"]["interval_calls"], [4, 4, 8, -1])
  err = est - exact_d
  assert m["mismatch"]["rmse"] == pytest.approx(np.sqrt(np.mean(err ** 2)))
  assert m["mismatch"]["bias"] == pytest.approx(np.mean(err))
  assert m["mismatch"]["coverage"] == pytest.approx(np.mean(np.abs(err) <= 0.05))
  # The rollout estimates are the same shifted by +0.1: called one step earlier or more.
  assert m["rollout"]["bias"] == pytest.approx(np.mean(err) + 0.1)
  assert m["success"]["rmse_own_target"] == pytest.approx(np.sqrt(np.mean((err - 0.1) ** 2)))
  assert m["rmse_ratio"] == pytest.approx(m["rollout"]["rmse"] / m["mismatch"]["rmse"])
  with pytest.raises(ValueError, match="steps: expected 5"):
    te.small_difference_metrics(exact_d, diff, steps[:3])


def test_large_change_metrics_on_a_constructed_case():
  ceiling = np.array([1.0, 1.2, 0.8])
  value = np.array([[0.9, 0.7, 0.6], [0.5, 1.1, 0.3], [0.85, 1.0, 0.75]])
  m_true = ceiling[None] - value
  noise = np.array([[[0.0, 0.02, -0.01], [0.01, 0.0, 0.0], [0.0, -0.03, 0.01]],
                    [[0.01, -0.02, 0.01], [0.0, 0.01, 0.02], [0.01, 0.03, 0.0]]])
  m_hat = m_true[None] + noise
  s = te.MismatchSamples(m_hat, m_hat - 0.025, m_hat + 0.025, np.zeros_like(m_hat))
  out = te.large_change_metrics(ceiling, value, s)
  off = ~np.eye(3, dtype=bool)
  assert out["mean_error_mismatch"] == pytest.approx(np.mean(np.abs(noise[:, off])))
  assert out["mean_error_ceiling"] == pytest.approx(np.mean(m_true[off]))
  assert out["coverage"] == pytest.approx(np.mean(np.abs(noise[:, off]) <= 0.025))
  # Directions by hand: J' - J for pairs (0,1) -0.2, (0,2) -0.3, (1,0) -0.6, (1,2) -0.8,
  # (2,0) +0.1, (2,1) +0.25; the ceiling alone predicts the sign of C' - C:
  # +, -, -, -, +, + -> 5 of 6 right.
  assert out["direction_ceiling"] == pytest.approx(5 / 6)
  assert out["direction_mismatch"] == pytest.approx(1.0)
  with pytest.raises(ValueError, match="value: expected"):
    te.large_change_metrics(ceiling, value[:2], s)


def test_difference_from_samples_matches_numpy():
  rng = np.random.default_rng(0)
  kl, ret, plain = (rng.normal(size=(2, 3, n)) for n in (5, 8, 8))
  d = te.difference_from_samples(jax.random.key(0), 0.4, kl, ret, plain, TAU,
                                 num_resamples=400)
  assert float(d.mismatch) == pytest.approx(0.4 - TAU * (kl[1].mean() - kl[0].mean()))
  assert float(d.rollout) == pytest.approx(ret[1].mean() - ret[0].mean())
  assert float(d.success) == pytest.approx(plain[1].mean() - plain[0].mean())
  for v, lo, hi in ((d.mismatch, d.mismatch_low, d.mismatch_high),
                    (d.rollout, d.rollout_low, d.rollout_high)):
    assert float(lo) < float(v) < float(hi)


def test_training_path_is_the_training_run(option):
  # The fixture's trained model is LogLinearFamily(0.1).train(theta0, train["H0"], 20 steps).
  data, thetas, _ = option
  path = te.training_path(thetas[0], data.train["H0"], tau=TAU, steps=20, learning_rate=0.1)
  assert path.shape == (21, thetas[0].shape[0])
  np.testing.assert_array_equal(path[0], thetas[0])
  np.testing.assert_allclose(path[-1], thetas[1], rtol=1e-10, atol=1e-12)
  assert not np.allclose(path[1], path[0])


def test_bad_inputs_raise_naming_the_field(option):
  data, _, pols = option
  with pytest.raises(ValueError, match="family: expected one of"):
    te.compile_family("click-nothing", num_train=1, num_test=1)
  with pytest.raises(ValueError, match="harnesses: expected"):
    te.compile_family("click-option", num_train=1, num_test=1, harnesses=("H0", "H9"))
  with pytest.raises(ValueError, match="num_test: expected a positive int"):
    te.compile_family("click-option", num_train=1, num_test=0)
  with pytest.raises(ValueError, match="budget: expected a positive int"):
    te.match_budget(0, horizon=10, num_action_samples=1)
  with pytest.raises(ValueError, match="budget: expected at least 30 units"):
    te.match_budget(29, horizon=10, num_action_samples=1)
  with pytest.raises(ValueError, match="horizon: expected a positive int"):
    te.match_budget(100, horizon=-1, num_action_samples=1)
  with pytest.raises(ValueError, match="num_action_samples: expected a positive int"):
    te.match_budget(100, horizon=10, num_action_samples=0)
  b = data.test["H0"]
  mdp = jax.tree.map(lambda *x: jnp.stack(x), b.mdp, b.mdp)
  star = jnp.stack([b.pi_ref, b.pi_ref])
  with pytest.raises(ValueError, match="estimator: expected one of"):
    te.sample_mismatch_matrix(jax.random.key(0), pols, mdp, star, TAU, num_seeds=1,
                              num_states=1, num_action_samples=1, estimator="exact")
  with pytest.raises(ValueError, match="num_seeds: expected a positive int"):
    te.sample_mismatch_matrix(jax.random.key(0), pols, mdp, star, TAU, num_seeds=0,
                              num_states=1, num_action_samples=1)
  with pytest.raises(ValueError, match="policies: expected"):
    te.sample_mismatch_matrix(jax.random.key(0), pols[0], mdp, star, TAU, num_seeds=1,
                              num_states=1, num_action_samples=1)
  budget = te.match_budget(200, horizon=10, num_action_samples=2)
  arms = (mdp, jnp.stack([pols[:, 0], pols[:, 0]]), star, star, jnp.zeros((2, 2)))
  with pytest.raises(ValueError, match="budget: .* was not matched"):
    te.estimate_differences(jax.random.key(0), arms, TAU, budget=budget, horizon=20,
                            num_action_samples=2, num_seeds=1)
  with pytest.raises(ValueError, match="arms: expected policies"):
    te.estimate_differences(jax.random.key(0), (mdp, pols[0], star, star, jnp.zeros((2, 2))),
                            TAU, budget=budget, horizon=10, num_action_samples=2, num_seeds=1)
  cfg = _load("configs/transfer_estimators.py").get_config()
  for field, value, match in (("families", ("click-nothing",), "families: expected names"),
                              ("harnesses", ("H0", "H2"), "harnesses: the adaptation study "
                               "needs H1"),
                              ("eval_every", 0, "eval_every: expected a positive int"),
                              ("tau", 0.0, "tau: expected a positive float"),
                              ("discount", 1.0, "discount: expected 0 <= gamma < 1")):
    bad = cfg.copy_and_resolve_references()
    bad[field] = value
    with pytest.raises(ValueError, match=match):
      te.check_config(bad)
  bad = cfg.copy_and_resolve_references()
  bad.small.budget = 10
  with pytest.raises(ValueError, match="budget: expected at least"):
    te.check_config(bad)
  bad = cfg.copy_and_resolve_references()
  bad.large.estimator = "frequency"
  with pytest.raises(ValueError, match="large.estimator: expected one of"):
    te.check_config(bad)


def test_script_writes_report_metrics_and_plot(tmp_path):
  # The sizes of the fixture and of the CLT tests above, so the compiled programs are shared.
  cfg = _load("configs/transfer_estimators.py").get_config()
  cfg.families = ("click-option",)
  cfg.harnesses = ("H0", "H1")
  cfg.num_train, cfg.num_test, cfg.steps = 2, 2, 20
  cfg.adapt_steps, cfg.eval_every = 1, 1
  cfg.large.num_seeds, cfg.large.num_states, cfg.large.num_action_samples = 30, 50, 4
  cfg.large.estimator, cfg.large.max_steps = "k1", 200
  cfg.small.num_seeds, cfg.small.budget, cfg.small.horizon = 60, 320, 40
  cfg.small.num_action_samples, cfg.small.estimator = 2, "k1"
  cfg.num_resamples = 100
  cfg.output_dir = str(tmp_path / "out")
  _load("scripts/transfer_estimators.py").main([], cfg)
  text = (tmp_path / "out" / "report.md").read_text()
  assert "~100× less error with the mismatch" in text
  assert "mismatch ~10× more accurate" in text
  assert "call the reversal too early" in text
  metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
  fam = metrics["families"]["click-option"]
  assert len(fam["large"]["pairs"]) == 2                                # ordered pairs of 2
  assert np.asarray(fam["large"]["mismatch_hat"]).shape == (30, 2, 2)
  # J = C - M in every cell (M from its own formula inside the study).
  np.testing.assert_allclose(np.asarray(fam["large"]["value"]),
                             np.asarray(fam["large"]["ceiling"])[None]
                             - np.asarray(fam["large"]["mismatch"]), atol=1e-9)
  assert fam["small"]["steps"] == [0, 1]
  assert fam["small"]["budget"]["return_units"] <= 320
  assert np.asarray(fam["small"]["estimates"]["mismatch"]).shape == (60, 2)
  assert json.loads((tmp_path / "out" / "config.json").read_text())["num_test"] == 2
  assert (tmp_path / "out" / "adaptation.png").stat().st_size > 10_000


def test_regularized_rollout_is_a_mismatch_estimate_along_its_own_actions(option):
  # docs/transfer_estimators.md §3: with deterministic transitions, every trajectory satisfies
  # sum_{t<H} g^t [r_t - tau log(pi/pi_ref)(a_t|s_t)]
  #   = V*(s_0) - g^H V*(s_H) - tau sum_{t<H} g^t log(pi/pi*)(a_t|s_t),
  # since tau log(pi*/pi_ref)(a|s) = Q*(s, a) - V*(s) = r(s, a) + g V*(s') - V*(s).
  data, _, pols = option
  b = data.test["H1"]
  horizon = 12
  for n in range(2):
    p, r, g, mu0, pref = _numpy_instance(b, n)
    assert np.all(np.isin(p, (0.0, 1.0)))                              # deterministic harness
    pol = np.asarray(pols[1, 1, n])
    v_star, _, pi_star = ref.soft_optimum(p, r, g, pref, TAU)[:3]
    m = jax.tree.map(lambda x: x[n], b.mdp)
    traj = core_sampling.rollout(jax.random.key(n), m, jnp.asarray(pol), num_envs=64,
                                 num_steps=horizon)
    st, ac = np.asarray(traj.states), np.asarray(traj.actions)
    disc = g ** np.arange(horizon)
    with np.errstate(divide="ignore"):
      reg = (r[st, ac] - TAU * (np.log(pol[st, ac]) - np.log(pref[st, ac]))) @ disc
      k1 = (np.log(pol[st, ac]) - np.log(pi_star[st, ac])) @ disc
    final = np.asarray(traj.final_states)
    np.testing.assert_allclose(reg, v_star[st[:, 0]] - g ** horizon * v_star[final] - TAU * k1,
                               atol=1e-9)

