"""benchmarks/children.py `met`: a target's verdict agrees with the ratio its table prints."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def children():
  spec = importlib.util.spec_from_file_location(
      "bench_children", os.path.join(ROOT, "benchmarks", "children.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("ratio, goal, digits, at_most, verdict", [
    (0.997, 1.0, 2, False, "yes"),      # prints "1.00x": met (CI once printed "1.00x | **no**")
    (0.994, 1.0, 2, False, "**no**"),   # prints "0.99x"
    (2.96, 3.0, 1, False, "yes"),       # prints "3.0x"
    (2.94, 3.0, 1, False, "**no**"),    # prints "2.9x"
    (2.004, 2.0, 2, True, "yes"),       # prints "2.00x" against "<= 2x"
    (2.006, 2.0, 2, True, "**no**"),    # prints "2.01x"
])
def test_the_verdict_follows_the_printed_ratio(children, ratio, goal, digits, at_most, verdict):
  assert children.met(ratio, goal, digits=digits, at_most=at_most) == verdict
  shown = float(f"{ratio:.{digits}f}")
  assert (shown <= goal if at_most else shown >= goal) == (verdict == "yes")
