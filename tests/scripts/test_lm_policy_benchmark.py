"""benchmarks/lm_policy_gradient.py end to end on its `--quick` setting: it writes every table,
with ratios consistent with the times it prints, after checking that torch and harnax agree."""

import os
import re
import subprocess
import sys

from tests.scripts import tables as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "lm_policy_gradient.py")


def test_quick_run_writes_consistent_tables(tmp_path):
  out = tmp_path / "lm_pg.md"
  # A smoke test: XLA's cheapest optimisation level halves the compile times of the children,
  # and a persistent compilation cache of its own lets the torch comparison's child load the
  # `tree` step the `tree` child compiled (same model, states and micro-batch) instead of
  # compiling it again.
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=flags,
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out)],
                        capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = out.read_text()
  assert text.startswith("# Exact policy-gradient step")
  assert "CPU cores" in text and "load average" in text

  # Section 1: the three scorers, tree first; ratios are the median times over the tree's.
  methods = md.table(text, "| size | method |")
  assert [row[1] for row in methods] == ["`tree`", "`cache`", "`unshared`"]
  tree_s = md.seconds(methods[0][4])
  for row in methods:
    ratio = float(row[6].split()[0])
    assert ratio > 0 and int(row[10]) > 0  # peak RSS in MB
    if min(tree_s, md.seconds(row[4])) >= 0.01:  # printed to 1 ms
      assert abs(ratio - md.seconds(row[4]) / tree_s) <= 0.1 * ratio + 0.02
  assert methods[0][6] == "1.00 (1.00)"

  # Section 2: torch agrees with harnax (the script refuses to time otherwise), one thread.
  [versus] = md.table(text, "| size | threads |")
  assert versus[1] == "1"
  assert float(versus[12]) <= 1e-4
  embed_err, norm_err = (float(x) for x in versus[13].split(" / "))
  assert embed_err <= 1e-3 and norm_err <= 1e-3
  assert float(versus[6]) > 0
  # CPU time (process time): the ratio column follows from the two times.
  cpu_harnax, cpu_torch = (md.seconds(x) for x in versus[10].split(" / "))
  if min(cpu_harnax, cpu_torch) >= 0.01:
    assert abs(float(versus[11]) - cpu_torch / cpu_harnax) <= 0.1 * float(versus[11]) + 0.02
  # The one-thread run is profiled: one row per framework, shares summing to ~100%.
  breakdown = md.table(text, "| size | threads | framework |")
  assert [row[2] for row in breakdown] == ["harnax", "torch"]
  for row in breakdown:
    shares = [int(re.search(r"\((\d+)%\)", cell).group(1)) for cell in row[4:]]
    assert len(shares) == 5 and abs(sum(shares) - 100) <= 3

  # Section 3: one row per micro-batch size, peak >= the memory before the first step.
  sweep = md.table(text, "| micro-batch |")
  assert [row[0] for row in sweep] == ["1", "2"]
  for row in sweep:
    assert float(row[3]) > 0
    assert int(row[7]) >= int(row[6])

  # Targets: the verdicts follow from the ratios.
  targets = md.table(text, "| comparison |")
  assert len(targets) == 4  # tree vs cache, vs unshared, vs torch (wall and CPU time)
  for name, value, value_min, goal, met, met_min in targets:
    if goal == "-":
      assert met == met_min == "-"
      continue
    bound = float(goal.split()[1].rstrip("x"))
    for ratio, verdict in ((value, met), (value_min, met_min)):
      assert verdict == ("yes" if float(ratio.rstrip("x")) >= bound else "**no**")
  # One progress line per configuration run (the repeated one is reused, not rerun).
  progress = [line for line in proc.stderr.splitlines() if re.match(r"\[\s*[\d.]+s\] ", line)]
  assert len(progress) == 7  # the workload, 3 methods, torch, 1 new micro-batch, the report
