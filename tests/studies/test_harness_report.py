"""harnax.studies.harness_report on a small config: exact columns, intervals, swaps."""

import importlib.util
import os

import jax
import numpy as np
import pytest

from harnax.studies import harness_report
from harnax.studies import miniwob_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(name):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}",
                                                os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.fixture(scope="module")
def report():
  cfg = _config("harness_report")
  cfg.train.steps = 40
  cfg.estimate.num_states = 64
  cfg.estimate.num_rollouts = 64
  cfg.estimate.num_resamples = 200
  with jax.enable_x64(True):
    result = harness_report.run(cfg)
    text = harness_report.render(cfg, result)
  return cfg, result, text


def test_harness_report_exact_columns_and_intervals(report):
  cfg, result, text = report
  assert [r["harness"] for r in result["rows"]] == ["H0", "H1", "H2"]
  for r in result["rows"]:
    assert abs(r["J"] - (r["C"] - r["M"])) < 1e-9
    for name in cfg.estimate.estimators:
      lo, hi = r["M_hat"][name]["ci"]
      assert lo <= r["M_hat"][name]["value"] <= hi
    lo, hi = r["J_rollout"]["ci"]
    assert lo <= r["J_rollout"]["value"] <= hi
  # H2 only reorders the observation fields: the same ceiling as H0, exactly.
  assert result["rows"][0]["C"] == result["rows"][2]["C"]
  p = result["swaps"].pairs
  off = ~np.eye(3, dtype=bool)
  np.testing.assert_allclose(np.asarray(p.realized_gain)[off],
                             np.asarray(p.threshold - p.adapted_mismatch)[off], atol=1e-9)
  assert text.count("\n| H") == 3 + 6  # three harness rows, six swaps


def test_harness_report_rejects_unknown_names(report):
  cfg = _config("harness_report")
  cfg.family = "nope"
  with pytest.raises(ValueError, match="family: expected one of"):
    harness_report.run(cfg)
  cfg = _config("harness_report")
  cfg.policy = "H9"
  with pytest.raises(ValueError, match="policy: expected a harness name"):
    harness_report.run(cfg)


def test_miniwob_study_rejects_unknown_family():
  cfg = _config("miniwob_study")
  cfg.families = ("click-everything",)
  with pytest.raises(ValueError, match="families: expected names from"):
    miniwob_report.run(cfg)
