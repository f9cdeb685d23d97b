"""benchmarks/solver_throughput.py end to end on a quick run: targets, classes and certificates
are reported consistently, and importing the module has no side effects. (A module of its own,
so that pytest-xdist's per-module scheduling can run it beside the other benchmark scripts.)"""

import os
import subprocess
import sys

import pytest

from tests.scripts import tables as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOLVER_SCRIPT = os.path.join(ROOT, "benchmarks", "solver_throughput.py")


@pytest.mark.slow
def test_quick_solver_run_reports_targets_and_classes_consistently(tmp_path):
  out = tmp_path / "solver.md"
  # A smoke test, and compiling is nearly all of its time: XLA's cheapest optimisation level,
  # and a persistent compilation cache of its own, so that a program compiled for the targets
  # (each dense class runs the same shapes and methods at the default tolerance) is compiled
  # once, not once per class. Every distinct program is still compiled, and every row run.
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env = dict(os.environ, XLA_FLAGS=flags, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  proc = subprocess.run([sys.executable, SOLVER_SCRIPT, "--quick", "--repeats", "1", "--out",
                         str(out)], capture_output=True, text=True, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  # Progress goes to stderr, one line per measured row; nothing to stdout.
  assert proc.stdout == ""
  progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
  [classes] = md.tables(text, "class")
  assert len(progress) >= len(classes)
  # Targets: the verdict follows from the ratio and the goal; the ratio from the times
  # (printed to 0.1 ms, so only roughly).
  [targets] = md.tables(text, "target")
  assert len(targets) == 4
  for name, ours, base, ratio, goal, met in targets:
    value = float(ratio.rstrip("x"))
    op, bound = goal.split()
    ok = value >= float(bound.rstrip("x")) if op == ">=" else value <= float(bound.rstrip("x"))
    assert met == ("yes" if ok else "**no**")
    ours_s, base_s = md.seconds(ours), md.seconds(base)
    if min(ours_s, base_s) >= 1e-3:
      expected = ours_s / base_s if "unreachable" in name else base_s / ours_s
      assert abs(value - expected) <= 0.15 * expected + 0.05
  # Every certificate contains the true error, in every table (column "error within bound").
  method_tables = md.tables(text, "method")
  assert len(method_tables) == 4
  for rows in method_tables + [[row[1:] for row in classes]]:
    for row in rows:
      assert row[9] == "yes", row
  # Each dense class lists the four methods, the sparse class the three sparse ones.
  methods = {}
  for row in classes:
    methods.setdefault(row[0], []).append(row[1])
  for name, listed in methods.items():
    expected = ["`auto`", "`value_iteration`", "`anderson`"]
    if name.startswith("dense"):
      expected.append("`policy_iteration`")
    assert listed == expected, name


def test_solver_benchmark_imports_without_side_effects():
  # Importing the module (e.g. from a notebook) runs nothing and edits no global state
  # beyond what importing jax and harnax themselves do.
  code = ("import os, sys, jax, harnax; env = dict(os.environ); path = list(sys.path); "
          f"sys.path.insert(0, {os.path.dirname(SOLVER_SCRIPT)!r}); import solver_throughput; "
          "sys.path.pop(0); assert sys.path == path; assert dict(os.environ) == env; print('ok')")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "ok"
  assert proc.stderr == ""
