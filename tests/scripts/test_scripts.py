"""The entry points in scripts/, run as a user runs them (tiny configs): files, tables, progress.

The pipelines behind them are tested in tests/studies.
"""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



def test_demo_script_writes_its_report(tmp_path):
  # The CLI plumbing only (the log-linear family, no base model to build); the LM side of
  # the same pipeline runs end to end in tests/studies/test_lm_study.py.
  out = tmp_path / "demo"
  proc = subprocess.run(
      [sys.executable, "scripts/demo.py", "--config=configs/demo.py",
       "--config.policies=('log_linear',)", "--config.families=('click-option',)",
       "--config.num_train=2", "--config.num_test=2", "--config.log_linear.steps=5",
       "--config.log_linear.adapt_steps=2", f"--config.output_dir={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (out / "report.md").read_text()
  assert "| finding | paper (Qwen3.5-2B) | harnax, log-linear |" in text
  assert "| finding | paper (Qwen3.5-2B) | harnax, log-linear |" in proc.stdout
  metrics = json.loads((out / "metrics.json").read_text())
  fam = metrics["policies"]["log_linear"]["families"]["click-option"]
  c, j, m = (np.array(fam["frozen"][k]) for k in ("ceiling", "value", "mismatch"))
  np.testing.assert_allclose(j, c - m, atol=1e-5)
  assert json.loads((out / "config.json").read_text())["num_train"] == 2
  assert "[log_linear] click-option: trained on H5" in proc.stderr
  assert "Unable to initialize backend" not in proc.stderr, proc.stderr[:2000]


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
  lines = text.splitlines()
  metrics = json.loads((out / "metrics.json").read_text())
  fam = metrics["families"]["click-option"]
  # Every ordered pair in the 6 x 6 swap matrix; one row per swap the paper's rule selects.
  assert sum(line.startswith("| from H") for line in lines) == 6
  selection = fam["selection"]
  assert selection["num_pairs"] == 30
  assert sum(line.startswith(("| raises C |", "| lowers C |")) for line in lines) == \
      selection["num_selected"]
  # The checkpoint x harness error matrix (six checkpoints), the rankings, the pi_ref verdict.
  for heading in ("### Geometric error: checkpoint × harness", "### Three-way decomposition",
                  "### Rankings of the harnesses",
                  "## The reference policy π_ref and the sign of the H1 ceiling change"):
    assert heading in lines
  assert sum(line.startswith("| π_H") for line in lines) >= 6
  assert np.array(fam["errors"]["matrix"]).shape == (6, 6)
  c, j, m = (np.array(fam["frozen"][k]) for k in ("ceiling", "value", "mismatch"))
  np.testing.assert_allclose(j, c - m, atol=1e-5)
  assert fam["optimal_decisions_unchanged"] is True
  assert all(0.0 <= x <= 1.0 for x in fam["success"]["optimal"])
  assert (out / "study.png").stat().st_size > 10_000
  # Progress on stderr, one line per stage; no backend-probe noise.
  assert "click-option: trained on H5" in proc.stderr
  assert "click-option: adapted" in proc.stderr
  for noise in ("Unable to initialize backend", "Falling back to", "platform"):
    assert noise not in proc.stderr, proc.stderr[:2000]



def test_text_agent_script_takes_a_checkpoint_and_rooms_from_the_command_line(tmp_path):
  # The documented overrides parse (fields that default to None are typed placeholders, which
  # absl's flags can override), and a checkpoint that is no model directory is refused by name.
  missing = str(tmp_path / "no_model")
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "scripts", "text_agents.py"),
       f"--config={os.path.join(ROOT, 'configs', 'text_agents.py')}:micro",
       f"--config.checkpoint={missing}", "--config.rooms=('bathroom',)",
       f"--config.output_dir={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode != 0
  assert "Flags parsing error" not in proc.stderr
  assert f"checkpoint: expected a Hugging Face model directory (with config.json), got " \
         f"{missing!r}" in proc.stderr
