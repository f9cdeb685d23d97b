"""The harness-transfer study with a language model, end to end on a micro configuration.

The LM family runs the whole protocol of `run_family` (post-training per harness through
`harnax.train`, frozen reads, swaps, the continued control, the field reversal); checks are
identities that hold for any policy (J = C − M in every cell, distributions), the base
model's support under `pi_ref="base"`, and the report's shape.
"""

import importlib.util
import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from harnax.envs import miniwob as mw
from harnax.studies import families
from harnax.studies import lm_study
from harnax.studies import miniwob

pytest.importorskip("tokenizers")
pytestmark = pytest.mark.x64

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def micro_config(tmp):
  cfg = load_config("demo").get_config()
  cfg.families = ("click-option",)
  # Two harnesses and one swap: every step of the protocol, at the fewest compiles.
  cfg.harnesses = ("H0", "H1")
  cfg.swap_rule, cfg.swaps = "given", (("H0", "H1"),)
  cfg.num_train, cfg.num_test = 2, 2
  cfg.lm.steps, cfg.lm.adapt_steps = 2, 1
  cfg.log_linear.steps, cfg.log_linear.adapt_steps = 10, 3
  cfg.base_model = load_config("base_model").get_config("micro")
  cfg.base_model.num_train, cfg.base_model.num_test, cfg.base_model.split_seed = 3, 0, 1000
  cfg.base_model.sft.num_steps = 40
  cfg.base_model_dir = str(tmp / "base")
  cfg.output_dir = str(tmp / "out")
  return cfg


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lm_study")
  cfg = micro_config(tmp)
  with jax.enable_x64(True):
    result = lm_study.run(cfg)
  return cfg, result


def test_every_cell_satisfies_j_equals_c_minus_m(study):
  _, result = study
  s = result["policies"]["lm"]["click-option"]
  for sc in (s.frozen, s.reference, s.reversed_frozen, s.base):
    np.testing.assert_allclose(np.asarray(sc.value),
                               np.asarray(sc.ceiling) - np.asarray(sc.mismatch), atol=1e-6)
  for sc in list(s.adapted.values()) + list(s.continued.values()):
    assert abs(sc.value - (sc.ceiling - sc.mismatch)) < 1e-6
  assert set(s.adapted) == {(0, 1)} and set(s.continued) == {0}
  for rate in np.ravel(s.success["frozen"]):
    assert 0.0 <= rate <= 1.0


def test_post_training_curves_and_run_files(study):
  cfg, result = study
  s = result["policies"]["lm"]["click-option"]
  for h, curve in s.train_curves.items():
    assert curve.shape == (cfg.lm.steps,) and np.all(np.isfinite(curve)), h
  # Each post-training run went through harnax.train: one metrics line per step.
  lines = (open(os.path.join(lm_study.runs_dir(cfg), "click-option", "H0", "metrics.jsonl"))
           .read().splitlines())
  records = [json.loads(x) for x in lines]
  assert [r["step"] for r in records] == list(range(cfg.lm.steps))
  assert all(0.0 <= r["success"] <= 1.0 for r in records)
  assert all(r["score_error"] >= 0.0 and np.isfinite(r["score_error"]) for r in records)
  np.testing.assert_allclose([r["mismatch"] for r in records],
                             [r["ceiling"] - r["value"] for r in records], atol=1e-9)
  np.testing.assert_allclose([r["value"] for r in records], s.train_curves["H0"], rtol=1e-9)


def test_lm_family_gets_the_per_checkpoint_metrics(study):
  _, result = study
  s = result["policies"]["lm"]["click-option"]
  n = len(s.harnesses)
  assert s.errors.shape == (n, n) and np.all(np.isfinite(s.errors)) and np.all(s.errors > 0)
  assert s.base_errors.shape == (n,) and np.all(s.base_errors > 0)
  assert set(s.decompositions) == set(s.adapted)
  for d in list(s.decompositions.values()) + s.reversal_decompositions:
    assert all(np.isfinite(v) and v >= 0 for v in d.values())
  # Field reversal with pi_ref uniform: the optimum does not move, only the readout.
  assert all(d["target_shift"] == 0.0 for d in s.reversal_decompositions)
  found = lm_study.findings(result["policies"]["lm"])
  assert found["swaps_rejected"].endswith(f"of {n * (n - 1)} ordered pairs")
  assert " to " in found["error_reduction"] and "/" in found["own_lowest"]


def test_report_shows_the_paper_beside_both_families(study):
  cfg, result = study
  text = lm_study.render(cfg, result)
  assert "| finding | paper (Qwen3.5-2B) | harnax, LM | harnax, log-linear |" in text
  assert "85.0 % → 19.2 %" in text
  assert "| score error reduction by post-training (own harness) | 69–90 % |" in text
  assert "## harnax, LM: click-option" in text and "## harnax, log-linear: click-option" in text
  metrics = lm_study.metrics(result)
  assert set(metrics["policies"]) == {"lm", "log_linear"}
  json.dumps(metrics)                                   # serializable


def test_base_reference_is_the_base_models_policy_with_the_uniform_support(study):
  cfg, result = study
  model, tok, _ = lm_study.load_base_model(cfg)
  train, _ = mw.task_split("click-option", 2, 2, seed=cfg.split_seed)
  compiled = [mw.compile_harness(t, "H1") for t in train]
  policy = families.LMFamily(model, tok)
  with jax.enable_x64(True):
    batch = miniwob.pad_batch(compiled, policy=policy)
    base = np.asarray(policy.semantic_policy(policy.initial_params(), batch))
  np.testing.assert_allclose(base.sum(-1), 1.0, atol=1e-6)
  uniform = np.asarray(batch.pi_ref)
  assert np.array_equal(base > 0, uniform > 0)


def test_config_errors_before_anything_runs(tmp_path):
  cfg = micro_config(tmp_path)
  for field, value, match in [("families", ("click-nothing",), "families"),
                              ("policies", ("gpt",), "policies"),
                              ("harnesses", ("H0", "H9"), "harnesses"),
                              ("pi_ref", "teacher", "pi_ref"),
                              ("swaps", (("H0", "H5"),), "swaps"),
                              ("swap_rule", "random", "swap_rule"),
                              ("max_swaps", -1, "max_swaps")]:
    bad = ml_collections.ConfigDict(cfg.to_dict())
    bad[field] = value
    with pytest.raises(ValueError, match=match):
      lm_study.run(bad)
  # A pre-training pool that holds a held-out instance (seeds 0.. again).
  bad = ml_collections.ConfigDict(cfg.to_dict())
  bad.base_model.split_seed = cfg.split_seed
  with pytest.raises(ValueError, match="held-out instances"):
    lm_study.run(bad)
  bad = ml_collections.ConfigDict(cfg.to_dict())
  bad.model_dir = str(tmp_path / "missing")
  with pytest.raises(ValueError, match="model_dir"):
    lm_study.run(bad)


def test_score_error_metric_against_numpy():
  import harnax as hx
  s, a, tau, gamma = 5, 3, 0.4, 0.8
  with jax.enable_x64(True):
    mdp = hx.random_dense_mdp(jax.random.key(0), s, a, discount=gamma)
    pi_ref = np.full((s, a), 1.0 / a)
    pi_ref[1, 2] = 0.0
    pi_ref /= pi_ref.sum(-1, keepdims=True)
    pol = np.asarray(hx.random_policy(jax.random.key(1), pi_ref))
    with np.errstate(divide="ignore"):                  # log 0 = -inf where unavailable
      got = float(families.score_error_rms(mdp, np.log(pol), pi_ref, tau))
  p, r, mu = (np.asarray(x, np.float64) for x in (mdp.transitions, mdp.rewards, mdp.initial))
  avail = pi_ref > 0
  v = np.zeros(s)                                       # soft value iteration, float64
  for _ in range(2000):
    q = r + gamma * p @ v
    z = np.where(avail, pi_ref * np.exp((q - q.max(-1, keepdims=True)) / tau), 0.0)
    v = q.max(-1) + tau * np.log(z.sum(-1))
  star = z / z.sum(-1, keepdims=True)
  ell = np.where(avail, np.log(np.where(avail, pol, 1.0)) - np.log(np.where(avail, star, 1.0)),
                 0.0)
  mean = ell.sum(-1, keepdims=True) / avail.sum(-1, keepdims=True)
  eps = np.where(avail, tau * (ell - mean), 0.0)
  per_state = (eps ** 2).sum(-1) / avail.sum(-1)
  p_pi = np.einsum("sa,sat->st", pol, p)
  d = (1 - gamma) * np.linalg.solve(np.eye(s) - gamma * p_pi.T, mu)
  np.testing.assert_allclose(got, np.sqrt(d @ per_state), rtol=1e-8)
  with jax.enable_x64(True):
    with np.errstate(divide="ignore"):
      zero = float(families.score_error_rms(mdp, np.log(star), pi_ref, tau))
  assert zero < 1e-7
