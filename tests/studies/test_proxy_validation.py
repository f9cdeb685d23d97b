"""The proxy-optimum validation on MiniWoB++: categories, sampled episodes and the estimates
they give against float64 NumPy values computed here (soft value iteration, occupancy as a
power series), rank agreement by hand, and the script end to end on a tiny config."""

import importlib.util
import json
import os

import ml_collections
import numpy as np
import pytest

from harnax.envs import miniwob as mw
from harnax.estimate import proxy
from harnax.studies import proxy_validation as pv

pytestmark = pytest.mark.x64
TAU, GAMMA = 0.1, 0.9
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _soft_optimum(p, r, ref, tau, gamma, iters=3000):
  """Soft value iteration in NumPy: (V*, pi*)."""
  v = np.zeros(p.shape[0])
  avail = ref > 0
  for _ in range(iters):
    q = r + gamma * p @ v
    z = np.where(avail, q / tau + np.log(np.where(avail, ref, 1.0)), -np.inf)
    m = z.max(-1, keepdims=True)
    v = tau * (m[:, 0] + np.log(np.exp(z - m).sum(-1)))
  pi = np.where(avail, np.exp(z - v[:, None] / tau), 0.0)
  return v, pi / pi.sum(-1, keepdims=True)


def _discounted_visits(p, pol, mu0, gamma, terms=600):
  """sum_t gamma^t mu0 P_pi^t, summed term by term."""
  p_pi = np.einsum("sa,sat->st", pol, p)
  dist, total = mu0.copy(), np.zeros_like(mu0)
  for t in range(terms):
    total += gamma ** t * dist
    dist = dist @ p_pi
  return total


def _kl_rows(a, b):
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(a > 0, a * np.log(a / b), 0.0).sum(-1)


@pytest.fixture(scope="module")
def option_instance():
  """click-option under H3 (it has the verify action), a random policy over the available
  actions, and pi* with its exact values by NumPy."""
  c = mw.compile_harness(mw.OptionTask(labels=("red", "blue", "green"), answer=1), "H3",
                         discount=GAMMA)
  h = c.harness
  p, r = np.asarray(h.mdp.transitions), np.asarray(h.mdp.rewards)
  ref, mu0 = np.asarray(h.pi_ref), np.asarray(h.mdp.initial)
  rng = np.random.default_rng(7)
  pol = np.where(ref > 0, rng.dirichlet(np.ones(ref.shape[1]), ref.shape[0]), 0.0)
  pol /= pol.sum(-1, keepdims=True)
  v_star, pi_star = _soft_optimum(p, r, ref, TAU, GAMMA)
  visits = _discounted_visits(p, pol, mu0, GAMMA)
  # Categories by hand for this page: radios select, Submit submits.
  cat = {"wait": "wait", "verify": "verify", "click [1]": "select", "click [2]": "select",
         "click [3]": "select", "click [4]": "submit"}
  onehot = np.array([[cat[a.name] == k for k in pv.COARSE_CATEGORIES] for a in c.actions],
                    float)
  return dict(c=c, p=p, r=r, ref=ref, mu0=mu0, pol=pol, pi_star=pi_star,
              ceiling=float(mu0 @ v_star), visits=visits, cat=cat, onehot=onehot,
              mismatch=float(TAU * visits @ _kl_rows(pol, pi_star)),
              cat_mismatch=float(TAU * visits @ _kl_rows(pol @ onehot, pi_star @ onehot)))


def test_estimates_converge_to_the_exact_values_with_the_optimum_as_proxy(option_instance):
  d = option_instance
  c, horizon = d["c"], 150
  rng = np.random.default_rng(0)
  kw = dict(tau=TAU, horizon=horizon, policy_access="probs", proxy_access="probs")
  eps = (pv.sample_episodes(rng, c, d["pol"], d["pi_star"], num_episodes=3000, **kw)
         + pv.sample_episodes(rng, c, d["pol"], d["pi_star"], num_episodes=200, actor="proxy",
                              **kw))
  # The dropped tail after `horizon` decisions, bounded by its largest per-step term.
  live = d["ref"] > 0
  worst = np.max(np.abs(np.log(d["pol"][live] / d["ref"][live])))
  worst = max(worst, np.max(_kl_rows(d["pol"], d["pi_star"])))
  tail = GAMMA ** horizon / (1 - GAMMA) * (np.max(np.abs(d["r"])) + TAU * worst)
  assert tail < 1e-5
  for cats, categorizer, want in (
      (tuple(a.name for a in c.actions), lambda a: a, d["mismatch"]),
      (pv.COARSE_CATEGORIES, d["cat"].__getitem__, d["cat_mismatch"])):
    est = proxy.proxy_estimates(eps, categorizer=categorizer, categories=cats, tau=TAU,
                                discount=GAMMA)["H3"]
    assert abs(est.mismatch - want) < 4 * est.mismatch_stderr + tail
    assert est.mismatch_stderr < 0.05 * want
    # Deterministic pages: every pi* episode's regularized return telescopes to V*(s0).
    assert est.ceiling == pytest.approx(d["ceiling"], abs=tail)
    assert est.num_policy_episodes == 3000 and est.num_proxy_episodes == 200
  assert d["cat_mismatch"] < 0.9 * d["mismatch"]       # categories merge actions
  # The policy's own returns estimate J = C - M.
  realized = np.array([e.outcome for e in eps if e.actor == "policy"])
  j = d["ceiling"] - d["mismatch"]
  assert abs(realized.mean() - j) < 4 * realized.std() / np.sqrt(realized.size) + tail


def test_category_mismatch_matches_the_power_series(option_instance):
  d = option_instance
  got = pv.category_mismatch(d["p"], d["mu0"], GAMMA, d["pol"], d["pi_star"], d["onehot"], TAU)
  assert got == pytest.approx(d["cat_mismatch"], rel=1e-9)
  eye = np.eye(d["pol"].shape[1])
  assert pv.category_mismatch(d["p"], d["mu0"], GAMMA, d["pol"], d["pi_star"], eye,
                              TAU) == pytest.approx(d["mismatch"], rel=1e-9)
  # A proxy with no mass where the policy acts, at the start: infinite.
  q = np.zeros_like(d["pol"])
  q[:, 0] = 1.0
  assert pv.category_mismatch(d["p"], d["mu0"], GAMMA, d["pol"], q, eye, TAU) == np.inf


def test_episodes_record_what_the_policy_and_proxy_did(option_instance):
  d = option_instance
  c = d["c"]
  rng = np.random.default_rng(1)
  eps = pv.sample_episodes(rng, c, d["pol"], d["pi_star"], tau=TAU, num_episodes=50,
                           horizon=7, policy_samples=3, proxy_samples=5, episode_prefix="x")
  names = {a.name for a in c.actions}
  assert [e.episode_id for e in eps[:2]] == ["x0", "x1"]
  for e in eps:
    assert e.harness == "H3" and e.actor == "policy" and 1 <= len(e.steps) <= 7
    for st in e.steps:
      assert len(st.policy_samples) == 3 and len(st.proxy_samples) == 5
      assert set(st.policy_samples + st.proxy_samples) <= names
      assert st.state != c.done_state
      # Every sampled action is available at its state.
      idx = [next(k for k, a in enumerate(c.actions) if a.name == n) for n in st.policy_samples]
      assert np.all(d["ref"][st.state, idx] > 0)
    assert e.steps[0].state == int(np.argmax(d["mu0"]))


def test_categorize_episodes_maps_samples_and_sums_distributions():
  step = proxy.Step(state=0, policy_samples=("click [1]", "click [3]", "wait"),
                    proxy_samples=(), proxy_probs=(("click [1]", 0.25), ("click [2]", 0.5),
                                                   ("click [3]", 0.25)))
  ep = proxy.Episode(episode_id="e", harness="H1", actor="policy", outcome=0.5, steps=(step,))
  cmap = {"wait": "wait", "click [1]": "select", "click [2]": "select", "click [3]": "submit"}
  (got,) = pv.categorize_episodes([ep], cmap)
  assert got.steps[0].policy_samples == ("select", "submit", "wait")
  assert dict(got.steps[0].proxy_probs) == {"select": 0.75, "submit": 0.25}
  assert got.steps[0].policy_probs is None
  assert (got.episode_id, got.harness, got.outcome) == ("e", "H1", 0.5)
  with pytest.raises(ValueError, match="cmap: no category for output 'click \\[3\\]'"):
    pv.categorize_episodes([ep], {"wait": "wait", "click [1]": "select"})


def test_study_categorizes_each_instance_by_its_own_page():
  # "click [3]" is Submit on the two-option page and a radio on the four-option page: the
  # estimates must follow each page's map and approach its exact limit (one map for both
  # pages, the four-option page's, merges Submit into select on the first page).
  train = (mw.OptionTask(labels=("a", "b"), answer=0),)
  test = (mw.OptionTask(labels=("a", "b"), answer=1),
          mw.OptionTask(labels=("c", "d", "e", "f"), answer=2))
  st = pv.run_family("click-option", train, test, tau=TAU, discount=GAMMA, steps=5,
                     proxies=("optimal",), category_maps=("coarse",), proxy_access=("probs",),
                     episodes_per_instance=100, proxy_episodes_per_instance=1,
                     policy_samples=32, horizon=40)
  est = st.estimates[("optimal", "coarse", "probs", 0)]
  limit = st.limit_mismatch[("optimal", "coarse")]
  for i, h in enumerate(st.harnesses):
    # Miller–Madow leaves an O(1/N^2) bias per decision at N = 32: within 5 %.
    assert abs(est[h].mismatch - limit[i]) < 4 * est[h].mismatch_stderr + 0.05 * limit[i], h
  np.testing.assert_allclose([est[h].ceiling for h in st.harnesses], st.exact["ceiling"],
                             atol=1e-4)


def test_coarse_categories_of_every_family_and_harness():
  boxes = mw.compile_harness(mw.CheckboxesTask(labels=("a", "b", "c"),
                                               targets=(True, False, True)), "H5")
  cmap = pv.category_map(boxes)
  assert cmap["wait"] == "wait" and cmap["verify"] == "verify"
  assert [cmap[f"click [{i}]"] for i in (1, 2, 3, 4)] == ["select"] * 3 + ["submit"]
  batches = [a.name for a in boxes.actions if len(a.clicks) > 1]
  assert len(batches) == 4 and all(cmap[b] == "select" for b in batches)   # boxes only
  option = pv.category_map(mw.compile_harness(mw.OptionTask(labels=("x", "y"), answer=1), "H1"))
  assert option == {"wait": "wait", "click [1]": "select", "click [2]": "select",
                    "click [3]": "submit", "click [1] [3]": "submit", "click [2] [3]": "submit"}
  tabs = mw.compile_harness(mw.TabsTask(links=(("a",), (), ("b", "c")), target="c"), "H1")
  tmap = pv.category_map(tabs)
  assert [tmap[f"click [{i}]"] for i in range(1, 7)] == ["navigate"] * 3 + ["submit"] * 3
  assert tmap["click [3] [6]"] == "submit"
  assert pv.category_map(tabs, "action") == {a.name: a.name for a in tabs.actions}
  with pytest.raises(ValueError, match="category_map: expected one of"):
    pv.category_map(tabs, "fine")


def test_ranking_agreement_by_hand():
  truth = [3.0, 1.0, 2.0, 0.5]
  same = pv.ranking_agreement([30, 10, 20, 5], truth)
  assert same == {"exact": 1.0, "top": 1.0, "spearman": pytest.approx(1.0),
                  "kendall": pytest.approx(1.0)}
  rev = pv.ranking_agreement([-3, -1, -2, -0.5], truth)
  assert rev["exact"] == 0.0 and rev["top"] == 0.0
  assert rev["spearman"] == pytest.approx(-1.0) and rev["kendall"] == pytest.approx(-1.0)
  # The two worst harnesses swapped: one discordant pair of six.
  last = pv.ranking_agreement([3.0, 0.4, 2.0, 0.5], truth)
  assert last["exact"] == 0.0 and last["top"] == 1.0
  assert last["kendall"] == pytest.approx(4 / 6) and last["spearman"] == pytest.approx(0.8)
  with pytest.raises(ValueError, match="scores"):
    pv.ranking_agreement([1.0, 2.0], truth)


def test_bad_inputs_raise_naming_the_argument(option_instance):
  d = option_instance
  assert pv.parse_proxy("optimal") == ("optimal", 0.0)
  assert pv.parse_proxy("mix:0.25") == ("mix", 0.25)
  assert pv.parse_proxy("trained:30") == ("trained", 30.0)
  for bad in ("mix:1.5", "mix:x", "trained:-1", "trained:2.5", "optimal:1", "teacher"):
    with pytest.raises(ValueError, match="proxies: expected"):
      pv.parse_proxy(bad)
  rng = np.random.default_rng(0)
  args = (rng, d["c"], d["pol"], d["pi_star"])
  with pytest.raises(ValueError, match="actor"):
    pv.sample_episodes(*args, tau=TAU, num_episodes=1, horizon=1, actor="teacher")
  with pytest.raises(ValueError, match="proxy_access"):
    pv.sample_episodes(*args, tau=TAU, num_episodes=1, horizon=1, proxy_access="logits")
  with pytest.raises(ValueError, match="horizon"):
    pv.sample_episodes(*args, tau=TAU, num_episodes=1, horizon=0)
  with pytest.raises(ValueError, match="category_maps"):
    pv.run_family("click-option", (), (), category_maps=("fine",))
  with pytest.raises(ValueError, match="families"):
    pv.run(ml_collections.ConfigDict({"families": ("click-nothing",)}))


def _script():
  spec = importlib.util.spec_from_file_location(
      "proxy_validation_script", os.path.join(ROOT, "scripts", "proxy_validation.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_script_writes_report_metrics_and_plot(tmp_path, capsys):
  spec = importlib.util.spec_from_file_location(
      "proxy_validation_config", os.path.join(ROOT, "configs", "proxy_validation.py"))
  config_module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(config_module)
  cfg = config_module.get_config()
  cfg.families = ("click-option",)
  cfg.num_train, cfg.num_test, cfg.steps = 2, 2, 5
  cfg.proxies = ("optimal", "mix:0.5", "trained:3")
  cfg.num_seeds, cfg.episodes_per_instance, cfg.proxy_episodes_per_instance = 2, 3, 3
  cfg.horizon = 10
  cfg.output_dir = str(tmp_path / "pv")
  _script().main([], config=cfg)
  out = tmp_path / "pv"
  text = (out / "report.md").read_text()
  assert "| paper: Terminal-Bench Lite, 5 harnesses, frozen Qwen3.5-9B" in text
  assert "| harnax, exact limits (no sampling), action categories (1 family) | 100 % /" in text
  assert "## click-option" in text and "optimal · coarse · probs" in text
  assert text in capsys.readouterr().out
  m = json.loads((out / "metrics.json").read_text())
  fam = m["families"]["click-option"]
  c, j, mm = (np.array(fam["exact"][k]) for k in ("ceiling", "value", "mismatch"))
  np.testing.assert_allclose(j, c - mm, atol=1e-8)
  # The limits: J(pi*) = C, and with every action its own category the limit of M~ is
  # the exact M (category_mismatch against the harness layer's mismatch).
  np.testing.assert_allclose(fam["proxy_value"]["optimal"], c, atol=1e-8)
  np.testing.assert_allclose(fam["limit_mismatch"]["optimal · action"], mm, rtol=1e-6)
  assert np.all(np.array(fam["proxy_value"]["mix:0.5"]) < c)
  assert len(fam["estimates"]) == 3 * 2 * 2 * 2            # proxies x maps x access x seeds
  for key, rec in m["pooled"].items():
    for r in ("score", "ceiling", "mismatch"):
      assert 0.0 <= rec[r]["exact"] <= rec[r]["top"] <= 1.0 or rec[r]["exact"] == 0.0, key
      assert -1.0 <= rec[r]["spearman"] <= 1.0
  assert m["pooled"]["optimal · action · probs"]["limit"]["score"]["exact"] == 1.0
  assert json.loads((out / "config.json").read_text())["num_seeds"] == 2
  assert (out / "recovery.png").stat().st_size > 10_000
