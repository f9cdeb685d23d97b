"""The text model and the study's padded batches against unpadded, per-instance references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from harnax.envs import miniwob as mw
from harnax.envs.miniwob import features as fe
from harnax.studies import families
from harnax.studies import miniwob as st

TAU = 0.1


pytestmark = pytest.mark.x64


@pytest.fixture(scope="module")
def option_study():
  with jax.enable_x64(True):
    train, test = mw.task_split("click-option", 4, 3, seed=5)
    return st.run_family("click-option", train, test, tau=TAU, steps=40, adapt_steps=10,
                         learning_rate=0.2, swaps="select"), train, test


def _unpadded_scores(theta, compiled):
  """C, J, M of the model on one instance through the harness layer, no padding."""
  h = compiled.harness
  logp = jax.nn.log_softmax(jnp.asarray(fe.harness_features(compiled)) @ theta, axis=-1)
  policy = hh.semantic_policy(h, logp, invalid="noop")
  c = hx.ceiling(h.mdp, h.pi_ref, TAU)
  j = hx.evaluate_policy(h.mdp, policy, h.pi_ref, TAU).value
  m = hx.mismatch(h.mdp, policy, h.pi_ref, TAU)
  return float(c), float(j), float(m)


def test_padding_changes_nothing():
  tasks = [mw.CheckboxesTask(labels=("ab", "cd"), targets=(True, True)),
           mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(False, True, True))]
  compiled = [mw.compile_harness(t, "H1") for t in tasks]
  theta = jax.random.normal(jax.random.key(0), (fe.NUM_FEATURES,), jnp.float64)
  shape = tuple(x + 3 for x in st.batch_shape(compiled))  # pad beyond the largest
  scores = st.evaluate_model(theta, st.pad_batch(compiled, shape), TAU)
  for k, c in enumerate(compiled):
    ref = _unpadded_scores(theta, c)
    np.testing.assert_allclose([scores.ceiling[k], scores.value[k], scores.mismatch[k]], ref,
                               rtol=1e-6, atol=1e-6)


def test_every_cell_satisfies_j_equals_c_minus_m(option_study):
  s, _, _ = option_study
  for sc in (s.frozen, s.reference, s.reversed_frozen):
    np.testing.assert_allclose(np.asarray(sc.value),
                               np.asarray(sc.ceiling) - np.asarray(sc.mismatch), atol=1e-5)
  for sc in s.adapted.values():
    assert abs(sc.value - (sc.ceiling - sc.mismatch)) < 1e-5


def test_training_raises_the_return(option_study):
  s, _, _ = option_study
  for h, curve in s.train_curves.items():
    assert curve[-1] > curve[0] + 0.1, h
  # The trained model beats the reference policy on held-out instances.
  assert np.all(np.diag(s.frozen.value) > s.reference.value)


def test_swap_identities(option_study):
  s, _, _ = option_study
  rows = st.swap_rows(s)
  assert rows and [r["swap"] for r in rows] == [f"{a} → {b}" for a, b in s.swaps]
  for r in rows:
    assert r["threshold"] == pytest.approx(r["delta_ceiling"] + r["source_mismatch"])
    # Returns are evaluated independently of C and M: gain = T - M(adapted) is a check.
    assert r["realized_gain"] == pytest.approx(r["threshold"] - r["adapted_mismatch"],
                                               abs=1e-5)
  # H4 only adds instructions: the ceiling does not move.
  h4 = st.swap_rows(s, [("H0", "H4")])[0]
  assert h4["delta_ceiling"] == pytest.approx(0.0, abs=1e-9)
  assert s.optimal_decisions_unchanged


def _plain_return(h, pol):
  """The plain discounted return by a float64 NumPy linear solve."""
  pol, p, r = (np.asarray(x, np.float64) for x in (pol, h.mdp.transitions, h.mdp.rewards))
  v = np.linalg.solve(np.eye(len(p)) - float(h.mdp.discount) * np.einsum("sa,sat->st", pol, p),
                      (pol * r).sum(-1))
  return float(np.asarray(h.mdp.initial) @ v)


def test_frozen_cell_matches_the_unpadded_reference(option_study):
  s, train, test = option_study
  batch = st.pad_batch([mw.compile_harness(t, "H0") for t in train])
  theta, _ = st.train(batch, tau=TAU, steps=40, learning_rate=0.2)
  refs = np.array([_unpadded_scores(theta, mw.compile_harness(t, "H2")) for t in test])
  np.testing.assert_allclose([s.frozen.ceiling[0, 2], s.frozen.value[0, 2],
                              s.frozen.mismatch[0, 2]], refs.mean(0), atol=1e-6)
  # The score error and the plain return of the same cell.
  errs, plain = [], []
  for t in test:
    c = mw.compile_harness(t, "H2")
    h = c.harness
    logp = jax.nn.log_softmax(jnp.asarray(fe.harness_features(c)) @ theta, axis=-1)
    log_pol = hh.semantic_log_policy(h, logp, invalid="noop")
    errs.append(float(families.score_error_rms(h.mdp, log_pol, h.pi_ref, TAU)))
    plain.append(_plain_return(h, jnp.exp(log_pol)))
  assert s.errors[0, 2] == pytest.approx(np.mean(errs), rel=1e-6)
  assert s.plain_return["frozen"][0, 2] == pytest.approx(np.mean(plain), rel=1e-6)
  # Without the KL price the return can only be higher than J.
  assert np.all(s.plain_return["frozen"] >= s.frozen.value - 1e-9)


def test_bad_input():
  tasks = [mw.sample_task("click-option", 0)]
  batch = st.pad_batch([mw.compile_harness(t, "H0") for t in tasks])
  with pytest.raises(ValueError, match="steps: expected a non-negative int"):
    st.train(batch, tau=TAU, steps=-1)
  with pytest.raises(ValueError, match="tau: expected a positive float"):
    st.train(batch, tau=0.0, steps=1)
  with pytest.raises(ValueError, match="shape: expected at least"):
    st.pad_batch([mw.compile_harness(t, "H5") for t in tasks], (2, 2, 2))
  with pytest.raises(ValueError, match="swaps: .* names a harness not in"):
    st.run_family("click-option", tasks, tasks, steps=1, adapt_steps=1,
                  harnesses=("H0", "H1"), swaps=(("H0", "H9"),))


def test_success_rate_against_a_hand_count():
  # Option task, H0: the reference policy is uniform over (wait, 2 radios, Submit).
  task = mw.OptionTask(labels=("x1", "y2"), answer=0)
  c = mw.compile_harness(task, "H0")
  batch = st.pad_batch([c])
  # One step: success needs option 0 selected and Submit; from the start that is
  # impossible, so within 1 step the rate is 0, within 2 steps (1/4)·(1/4).
  assert float(st.success_rate(batch.pi_ref, batch, horizon=1)[0]) == 0.0
  assert float(st.success_rate(batch.pi_ref, batch, horizon=2)[0]) == pytest.approx(1 / 16)
  # A deterministic optimal policy succeeds with certainty in two steps.
  pol = np.zeros_like(np.asarray(batch.pi_ref))
  pol[0, 0, 1] = 1.0                           # click [1] (option 0)
  pol[0, 1, 3] = 1.0                           # then Submit
  pol[0, 2:, 0] = 1.0                          # elsewhere wait
  assert float(st.success_rate(jnp.asarray(pol), batch, horizon=2)[0]) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="horizon: expected a positive int"):
    st.success_rate(batch.pi_ref, batch, horizon=0)


def test_study_reports_success_and_optimal_return(option_study):
  s, _, _ = option_study
  assert np.all(s.success["optimal"] >= s.success["reference"])
  assert np.all((0 <= s.success["frozen"]) & (s.success["frozen"] <= 1))
  # pi*'s plain return lies between the ceiling (which pays the KL) and 1.
  assert np.all(s.optimal_return >= s.ceiling - 1e-9) and np.all(s.optimal_return <= 1.0)


# -- the paper's selection rule and the per-checkpoint metrics ----------------------------------

def test_select_adapts_exactly_the_rejected_swaps_with_positive_threshold(option_study):
  s, _, _ = option_study
  names = s.harnesses
  f, n = s.frozen, len(names)
  want = [(i, j) for i in range(n) for j in range(n) if i != j
          and f.value[i, j] - f.value[i, i] < 0
          and f.ceiling[j, j] - f.ceiling[i, i] + f.mismatch[i, i] > 0]
  assert s.selection == "select" and sorted(s.adapted) == want
  assert s.swaps == tuple((names[i], names[j]) for i, j in want)
  rows = st.swap_rows(s, st.all_pairs(s))
  assert len(rows) == n * (n - 1)
  assert [r["swap"] for r in rows if r["selected"]] == [f"{a} → {b}" for a, b in s.swaps]
  for r in rows:
    if r["selected"]:  # every source got the continued control (controls=None)
      a = names.index(r["swap"].split(" → ")[0])
      assert r["gain_vs_continued"] == pytest.approx(
          r["realized_gain"] + f.value[a, a] - s.continued[a].value)
  assert set(s.decompositions) == set(s.adapted) == set(s.adapted_errors)


def test_base_model_error_matches_the_unpadded_reference(option_study):
  s, _, test = option_study
  assert s.errors.shape == (len(s.harnesses),) * 2 and np.all(s.errors > 0)
  # The base model (zero weights): every output equally likely.
  base = []
  for t in test:
    c = mw.compile_harness(t, "H3")
    o = c.harness.num_outputs
    log_pol = hh.semantic_log_policy(c.harness, np.full((c.harness.num_states, o), -np.log(o)),
                                     invalid="noop")
    base.append(float(families.score_error_rms(c.harness.mdp, log_pol, c.harness.pi_ref, TAU)))
  assert s.base_errors[s.harnesses.index("H3")] == pytest.approx(np.mean(base), rel=1e-6)


def test_reversal_decomposition_moves_only_the_readout(option_study):
  s, _, _ = option_study
  for d in s.reversal_decompositions:
    assert d["target_shift"] == 0.0            # same MDP, same pi_ref: F* does not move
    assert d["readout_drift"] > 0.0 and 0.0 < d["coverage"] <= 1.0
  # H4 only adds instructions: a swap between H0 and H4 shifts no target either.
  for key in ((0, 4), (4, 0)):
    if key in s.decompositions:
      assert s.decompositions[key]["target_shift"] == pytest.approx(0.0, abs=1e-12)


def test_report_sections_and_metrics_of_a_selected_study(option_study):
  import json

  import ml_collections

  from harnax.studies import miniwob_report as rep
  s, _, _ = option_study
  cfg = ml_collections.ConfigDict(dict(
      families=("click-option",), num_train=4, num_test=3, split_seed=5, discount=0.9,
      tau=TAU, steps=40, adapt_steps=10, swap_rule="select", max_swaps=None))
  result = {"families": {"click-option": s}, "by_pi_ref": {"uniform": {"click-option": s}},
            "seconds": 1.0}
  text = rep.render(cfg, result)
  for heading in ("### Swaps", "### Geometric error: checkpoint × harness",
                  "### Three-way decomposition", "### Rankings of the harnesses",
                  "## The reference policy π_ref"):
    assert heading in text
  assert "(paper: 9)" in text and "paper 7 / 7" in text and "69.0 % to 90.0 %" in text
  assert sum(line.startswith("| from H") for line in text.splitlines()) == 6
  m = json.loads(json.dumps(rep.metrics(result)))
  fam = m["families"]["click-option"]
  assert fam["selection"]["num_pairs"] == 30
  assert fam["selection"]["num_selected"] == len(s.swaps)
  np.testing.assert_allclose(fam["errors"]["matrix"], s.errors)
  assert set(fam["rankings"]) == {"base model", "π_H0, frozen", "own checkpoints"}
  assert set(fam["rankings"]["own checkpoints"]) == {"success", "plain return"}


def test_selection_bad_input():
  tasks = [mw.sample_task("click-option", 0)]
  kw = dict(steps=1, adapt_steps=1, harnesses=("H0", "H1"))
  with pytest.raises(ValueError, match="swaps: expected 'select' or a sequence"):
    st.run_family("click-option", tasks, tasks, swaps="all", **kw)
  with pytest.raises(ValueError, match="max_swaps: expected None or a non-negative int"):
    st.run_family("click-option", tasks, tasks, swaps="select", max_swaps=-2, **kw)
  import ml_collections

  from harnax.studies import miniwob_report as rep
  with pytest.raises(ValueError, match="swap_rule: expected one of"):
    rep.swaps_of(ml_collections.ConfigDict({"swap_rule": "random"}))
  with pytest.raises(ValueError, match="pi_refs: expected a non-empty tuple"):
    rep.run(ml_collections.ConfigDict({"families": ("click-option",), "pi_refs": ("teacher",)}))
