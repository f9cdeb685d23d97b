"""The built-in checkbox harness family, its text features, and a log-linear policy on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from harnax import policies
from harnax import train
from harnax.envs import checkbox

pytestmark = pytest.mark.x64


def test_semantic_mdp_and_decode_tables():
  h = checkbox.checkbox_harnesses()
  h0, h1, h2 = h["H0"], h["H1"], h["H2"]
  assert (h0.num_states, h0.num_actions, h0.num_outputs) == (9, 5, 10)
  assert (h1.num_actions, h1.num_outputs) == (8, 13)
  p = np.asarray(h1.mdp.transitions)
  a = h1.action_names.index
  assert p[0, a("click alpha"), 1] == 1 and p[3, a("click bravo"), 1] == 1
  assert p[0, a("click alpha+charlie"), 5] == 1  # two toggles in one step
  assert p[6, a("wait"), 6] == 1 and np.all(p[8, :, 8] == 1)
  r = np.asarray(h1.mdp.rewards)
  assert r[5, a("submit")] == 1 and r.sum() == 1  # only a correct submit pays
  # click and toggle decode to the same action; garbage is invalid.
  table = np.asarray(h0.decode_table[0])
  out = h0.output_names.index
  assert table[out("click bravo")] == table[out("toggle bravo")] == 1
  assert table[out("scroll down")] == table[out("click delta")] == hh.INVALID
  assert np.asarray(h1.decode_table)[0, h1.output_names.index("click alpha and charlie")] == a(
      "click alpha+charlie")
  # H2 differs from H0 in the encoder only.
  for x, y in zip(jax.tree.leaves(h0), jax.tree.leaves(h2)):
    np.testing.assert_array_equal(x, y)
  assert h0.encode(1).splitlines()[::-1] == h2.encode(1).splitlines()
  assert h0.encode(1) == "task: check alpha and charlie\nalpha: [x]\nbravo: [ ]\ncharlie: [ ]"


def test_ceilings_batch_raises_and_reversal_keeps():
  h = checkbox.checkbox_harnesses()
  c = {k: float(hx.ceiling(x.mdp, x.pi_ref, 0.1, tol=1e-12)) for k, x in h.items()}
  assert c["H0"] == c["H2"] and c["H1"] > c["H0"]


def test_features_depend_on_field_position():
  h = checkbox.checkbox_harnesses()
  f0, f2 = checkbox.checkbox_features(h["H0"]), checkbox.checkbox_features(h["H2"])
  assert f0.shape == (9, 10, checkbox.NUM_FEATURES)
  o = h["H0"].output_names.index("click alpha")
  assert not np.array_equal(f0[:, o], f2[:, o])  # alpha sits on another line
  for name in ("submit", "wait", "scroll down", "click delta"):
    k = h["H0"].output_names.index(name)
    np.testing.assert_array_equal(f0[:, k], f2[:, k])  # position-free features
  # One feature per box line: (position, glyph, named in task).
  phi = checkbox.text_features("task: check alpha\nalpha: [ ]\nbravo: [x]", "click alpha")
  assert phi.sum() == 2  # the position-glyph-task indicator and the verb


def test_training_lowers_the_mismatch(checkbox_models):
  m = checkbox_models
  h, f, tau = m["harnesses"]["H0"], m["features"]["H0"], m["tau"]
  sol = hx.solve_soft_bellman(h.mdp, h.pi_ref, tau, tol=1e-12)
  untrained = policies.harness_semantic_policy(jnp.zeros(checkbox.NUM_FEATURES), f, h)
  trained = policies.harness_semantic_policy(m["theta"]["H0"], f, h)
  m0 = float(hx.mismatch(h.mdp, untrained, h.pi_ref, tau, solution=sol))
  m1 = float(hx.mismatch(h.mdp, trained, h.pi_ref, tau, solution=sol))
  assert m1 < 0.5 * m0


def test_bad_options():
  with pytest.raises(ValueError, match="variant: expected one of"):
    checkbox.checkbox_harness("sideways")
  with pytest.raises(ValueError, match="targets: expected distinct labels"):
    checkbox.checkbox_harness(targets=("delta",))
  h = checkbox.checkbox_harness()
  with pytest.raises(ValueError, match=r"features: expected shape \[9, 10, D\]"):
    train.fit_log_linear(h, np.zeros((9, 13, checkbox.NUM_FEATURES)), 0.1)
  with pytest.raises(ValueError, match=r"theta: expected shape"):
    train.fit_log_linear(h, np.zeros((9, 10, checkbox.NUM_FEATURES)), 0.1, theta=np.zeros(3))
  with pytest.raises(ValueError, match="tau: expected"):
    train.fit_log_linear(h, np.zeros((9, 10, checkbox.NUM_FEATURES)), -1.0)
  with pytest.raises(ValueError, match="num_steps: expected a non-negative int"):
    train.fit_log_linear(h, np.zeros((9, 10, checkbox.NUM_FEATURES)), 0.1, num_steps=-1)
