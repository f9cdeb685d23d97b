"""benchmarks/text_rollouts.py end to end on its `--quick` setting: every table is written,
harnax and transformers generate the same texts on the same turns, and the ratios and rates
follow from the times printed beside them."""

import os
import subprocess
import sys

import pytest

from tests.scripts import tables as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "text_rollouts.py")


@pytest.mark.slow
def test_quick_run_writes_consistent_tables(tmp_path):
  pytest.importorskip("harnax.envs.text.alfworld")
  out = tmp_path / "text_rollouts.md"
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=flags)
  proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out)],
                        capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = out.read_text()
  assert text.startswith("# Agent rollouts in ALFWorld")
  assert "CPU cores" in text and "load average" in text

  # 1. The rollout: 2 games x 2 turns with 2 live games = 2 batched turns of 2.
  [rollout] = md.table(text, "| size | turns |")
  assert rollout[:3] == ["quick", "4", "2"]
  tokens = int(rollout[3])
  assert 4 <= tokens <= 4 * 8  # at most --new tokens per turn (8 in --quick)
  wall, generation, games = (md.seconds(c) for c in rollout[5:8])
  assert generation + games <= wall * 1.01
  assert float(rollout[8]) == pytest.approx(4 / wall, rel=0.05, abs=0.01)

  # 2. The same turns regenerated: greedy harnax and transformers write the same texts, and
  # harnax's warm pass reproduces the rollout's log.
  [versus] = md.table(text, "| size | batches |")
  assert versus[1:3] == ["2", "4"]
  assert versus[3] == "4 / 4"
  assert int(versus[4]) == tokens
  harnax_s, torch_s = md.seconds(versus[5]), md.seconds(versus[6])
  if min(harnax_s, torch_s) >= 0.01:
    assert float(versus[7]) == pytest.approx(torch_s / harnax_s, rel=0.1, abs=0.02)

  # 3. The games' own cost: ALFWorld's first load, then with and without admissible commands.
  games = md.table(text, "| game |")
  assert [row[0] for row in games] == ["ALFWorld, first load", "ALFWorld, admissible=True",
                                       "ALFWorld, admissible=False"]
  for row in games[1:]:
    assert int(row[2]) >= 1 and md.seconds(row[5]) > 0

  # The target's verdict follows from its ratio.
  [target] = md.table(text, "| size | torch / harnax (median) |")
  assert target[5] == ("yes" if float(target[1].rstrip("x")) >= 1.0 else "**no**")
  assert float(target[1].rstrip("x")) == pytest.approx(float(versus[7]), abs=0.01)
