"""The README's ten-line example runs as written, converges, and shows J = C - M."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_ten_line_example_runs_and_converges():
  text = README.read_text(encoding="utf-8")
  section = text[text.index("## Ten lines"):]
  (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
  namespace = {}
  exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
  sol = namespace["sol"]
  assert bool(sol.converged), (float(sol.error_bound), float(sol.tol))
  assert float(sol.error_bound) <= float(sol.tol)
  c, m, j = (float(namespace[k]) for k in ("C", "M", "J"))
  # float32 with gamma = 0.99: rounding of ~eps * |C| / (1 - gamma) ~ 1e-5 |C|.
  np.testing.assert_allclose(j, c - m, atol=2e-5 * abs(c))
  assert namespace["Cs"].shape == (128,)
  assert np.all(np.isfinite(np.asarray(namespace["grad"])))
