"""benchmarks/lm_throughput.py end to end on a tiny run: its tables are consistent, and bad
arguments are refused with the valid choices."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "lm_throughput.py")


def _run(*args, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env,
                        timeout=600, **kw)


@pytest.mark.slow
def test_lm_throughput_quick_moe_run_writes_consistent_tables(tmp_path):
  out = tmp_path / "lm.md"
  # The checkpoint stored in bfloat16 (as for Gemma-4-E2B on a small machine), measured in
  # float32 by both frameworks.
  proc = _run("--quick", "--families", "qwen3_moe", "--torch-device", "cpu", "--out", str(out),
              "--checkpoint-dtype", "bfloat16")
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  assert "float32 weights and activations in both frameworks" in text
  assert "same for both, stored in bfloat16" in text
  rows = re.findall(r"^\| qwen3_moe \| 97M \| (\w+) tok/s \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                    text, re.M)
  assert [r[0] for r in rows] == ["prefill", "decode_b1"]
  for _, ours, ref, ratio in rows:
    ours, ref, ratio = float(ours), float(ref), float(ratio)
    assert ours > 0 and ref > 0
    # Rates are printed to 0.1 and the ratio (of the unrounded rates) to 0.01.
    lo, hi = (ours - 0.05) / (ref + 0.05), (ours + 0.05) / (ref - 0.05)
    assert lo - 0.005 <= ratio <= hi + 0.005
  # Memory breakdown: runtime < loaded <= peak for both frameworks.
  row = r"^\| qwen3_moe \| (harnax|transformers) \| (\d+) \| (\d+) \| (\d+) \| (-?\d+) \|$"
  mem = re.findall(row, text, re.M)
  assert [m[0] for m in mem] == ["harnax", "transformers"]
  for _, runtime, loaded, peak, extra in mem:
    assert int(runtime) < int(loaded) <= int(peak)
    assert abs(int(extra) - (int(peak) - int(loaded))) <= 1  # each printed rounded
  # The bound row: the MoE reads its routed experts only (4 of 16 per layer).
  bound = re.search(r"^\| qwen3_moe \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
  assert bound is not None and int(bound.group(1)) < 388  # fewer MB than all parameters


def test_lm_throughput_refuses_an_unknown_family_naming_the_choices():
  proc = _run("--preset", "0.6b-2b", "--families", "qwen3_moe")
  assert proc.returncode == 2
  assert "--families: ['qwen3_moe'] not in preset '0.6b-2b'" in proc.stderr
  assert "qwen3-0.6b" in proc.stderr


# ----------------------------------------------------------------------------
# benchmarks/solver_throughput.py
# ----------------------------------------------------------------------------

SOLVER_SCRIPT = os.path.join(ROOT, "benchmarks", "solver_throughput.py")


def _tables(text, first_header):
  """Every markdown table whose header starts with `first_header`, as lists of rows of cells."""
  lines = text.splitlines()
  tables = []
  for start, line in enumerate(lines):
    if line.startswith(f"| {first_header} |"):
      rows = []
      for row in lines[start + 2:]:
        if not row.startswith("|"):
          break
        rows.append([c.strip() for c in row.strip().strip("|").split("|")])
      tables.append(rows)
  return tables


def _seconds(cell):
  value, unit = cell.split()
  return float(value) * {"s": 1.0, "ms": 1e-3}[unit]


@pytest.mark.slow
def test_quick_solver_run_reports_targets_and_classes_consistently(tmp_path):
  out = tmp_path / "solver.md"
  proc = subprocess.run([sys.executable, SOLVER_SCRIPT, "--quick", "--repeats", "1", "--out",
                         str(out)], capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  # Progress goes to stderr, one line per measured row; nothing to stdout.
  assert proc.stdout == ""
  progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
  [classes] = _tables(text, "class")
  assert len(progress) >= len(classes)
  # Targets: the verdict follows from the ratio and the goal; the ratio from the times
  # (printed to 0.1 ms, so only roughly).
  [targets] = _tables(text, "target")
  assert len(targets) == 4
  for name, ours, base, ratio, goal, met in targets:
    value = float(ratio.rstrip("x"))
    op, bound = goal.split()
    ok = value >= float(bound.rstrip("x")) if op == ">=" else value <= float(bound.rstrip("x"))
    assert met == ("yes" if ok else "**no**")
    ours_s, base_s = _seconds(ours), _seconds(base)
    if min(ours_s, base_s) >= 1e-3:
      expected = ours_s / base_s if "unreachable" in name else base_s / ours_s
      assert abs(value - expected) <= 0.15 * expected + 0.05
  # Every certificate contains the true error, in every table (column "error within bound").
  method_tables = _tables(text, "method")
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
