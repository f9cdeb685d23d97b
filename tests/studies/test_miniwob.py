"""The text model and the study's padded batches against unpadded, per-instance references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from harnax.envs import miniwob as mw
from harnax.envs.miniwob import features as fe
from harnax.studies import miniwob as st

TAU = 0.1


pytestmark = pytest.mark.x64


@pytest.fixture(scope="module")
def option_study():
  with jax.enable_x64(True):
    train, test = mw.task_split("click-option", 4, 3, seed=5)
    return st.run_family("click-option", train, test, tau=TAU, steps=40, adapt_steps=10,
                         learning_rate=0.2), train, test


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
  assert [r["swap"] for r in rows] == [f"{a} → {b}" for a, b in mw.SWAPS]
  for r in rows:
    assert r["threshold"] == pytest.approx(r["delta_ceiling"] + r["source_mismatch"])
    # Returns are evaluated independently of C and M: gain = T - M(adapted) is a check.
    assert r["realized_gain"] == pytest.approx(r["threshold"] - r["adapted_mismatch"],
                                               abs=1e-5)
  # H4 only adds instructions: the ceiling does not move.
  h4 = next(r for r in rows if r["swap"] == "H0 → H4")
  assert h4["delta_ceiling"] == pytest.approx(0.0, abs=1e-9)
  assert s.optimal_decisions_unchanged


def test_frozen_cell_matches_the_unpadded_reference(option_study):
  s, train, test = option_study
  batch = st.pad_batch([mw.compile_harness(t, "H0") for t in train])
  theta, _ = st.train(batch, tau=TAU, steps=40, learning_rate=0.2)
  refs = np.array([_unpadded_scores(theta, mw.compile_harness(t, "H2")) for t in test])
  np.testing.assert_allclose([s.frozen.ceiling[0, 2], s.frozen.value[0, 2],
                              s.frozen.mismatch[0, 2]], refs.mean(0), atol=1e-6)


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
