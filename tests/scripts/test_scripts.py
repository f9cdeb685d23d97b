"""The entry points in scripts/: run on tiny configs, check their tables."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_LOADED = {}


def _load(name):
  # A script defines its absl flags at import: load each one once per process.
  if name in _LOADED:
    return _LOADED[name]
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  _LOADED[name] = module
  return module


def _config(name):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}",
                                                os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.fixture(scope="module")
def report():
  script = _load("harness_report")
  cfg = _config("harness_report")
  cfg.train.steps = 40
  cfg.estimate.num_states = 64
  cfg.estimate.num_rollouts = 64
  cfg.estimate.num_resamples = 200
  with jax.enable_x64(True):
    result = script.run(cfg)
    text = script.render(cfg, result)
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
  script = _load("harness_report")
  cfg.family = "nope"
  with pytest.raises(ValueError, match="family: expected one of"):
    script.run(cfg)
  cfg = _config("harness_report")
  cfg.policy = "H9"
  with pytest.raises(ValueError, match="policy: expected a harness name"):
    script.run(cfg)


def test_demo_script_writes_its_table(tmp_path):
  out = tmp_path / "demo"
  proc = subprocess.run(
      [sys.executable, "scripts/demo.py", "--config=configs/demo.py", "--config.num_mdps=4",
       "--config.num_states=8", "--config.num_actions=3", f"--config.output_dir={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (out / "demo.md").read_text()
  assert "| value_iteration |" in text and "| policy_iteration |" in text
  assert json.loads((out / "config.json").read_text())["num_mdps"] == 4


def test_miniwob_study_writes_report_metrics_and_plot(tmp_path):
  out = tmp_path / "study"
  proc = subprocess.run(
      [sys.executable, "scripts/miniwob_study.py", "--config=configs/miniwob_study.py",
       "--config.families=('click-option',)", "--config.num_train=3", "--config.num_test=2",
       "--config.steps=5", "--config.adapt_steps=2", f"--config.output_dir={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (out / "report.md").read_text()
  assert "## click-option" in text
  assert sum(line.startswith("| H") and "→" in line for line in text.splitlines()) == 9
  assert sum(line.startswith("| H") and "→" not in line for line in text.splitlines()) == 12
  metrics = json.loads((out / "metrics.json").read_text())
  fam = metrics["families"]["click-option"]
  c, j, m = (np.array(fam["frozen"][k]) for k in ("ceiling", "value", "mismatch"))
  np.testing.assert_allclose(j, c - m, atol=1e-5)
  assert fam["optimal_decisions_unchanged"] is True
  assert all(0.0 <= x <= 1.0 for x in fam["success"]["optimal"])
  assert (out / "study.png").stat().st_size > 10_000


def test_miniwob_study_rejects_unknown_family():
  script = _load("miniwob_study")
  cfg = _config("miniwob_study")
  cfg.families = ("click-everything",)
  with pytest.raises(ValueError, match="families: expected names from"):
    script.run(cfg)
