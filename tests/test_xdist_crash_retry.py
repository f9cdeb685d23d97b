"""tests/xdist_crash_retry.py: a run whose workers crash ends, reruns the test a worker died in
once, and fails a test that crashes its worker every time."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("xdist")

_TESTS = os.path.dirname(os.path.abspath(__file__))

_FILES = {
    # Several modules of one or two tests: the cases where a one-test batch could hang.
    "test_a.py": "def test_a1():\n  pass\n\n\ndef test_a2():\n  pass\n",
    "test_b.py": textwrap.dedent("""\
        import os
        import pathlib

        def test_b1():
          pass

        def test_b2_crashes_once(tmp_path_factory):
          marker = pathlib.Path(os.environ["CRASH_MARKERS"]) / "b2"
          if not marker.exists():
            marker.write_text("crashed")
            os.abort()

        def test_b3():
          pass
        """),
    "test_c.py": "import os\n\n\ndef test_c1_always_crashes():\n  os.abort()\n",
    "test_d.py": "def test_d1():\n  pass\n",
    "test_e.py": "def test_e1():\n  pass\n\n\ndef test_e2():\n  pass\n",
}


def test_crashed_workers_are_replaced_without_a_hang_and_their_test_rerun_once(tmp_path):
  suite = tmp_path / "suite"
  suite.mkdir()
  for name, text in _FILES.items():
    (suite / name).write_text(text)
  markers = tmp_path / "markers"
  markers.mkdir()
  env = dict(os.environ, PYTHONPATH=_TESTS, CRASH_MARKERS=str(markers))
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope", "-p",
       "xdist_crash_retry", "-p", "no:cacheprovider", "-rA", str(suite)],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  out = run.stdout   # stderr holds the crashed workers' fault dumps
  assert run.returncode == 1, out + run.stderr    # test_c1 fails; nothing hangs
  assert "replacing crashed worker" in out, out
  assert "1 failed, 8 passed, 2 rerun" in out.strip().splitlines()[-1], out
  assert "FAILED suite/test_c.py::test_c1_always_crashes" in out, out
  for name in ("a.py::test_a1", "a.py::test_a2", "b.py::test_b1", "b.py::test_b2_crashes_once",
               "b.py::test_b3", "d.py::test_d1", "e.py::test_e1", "e.py::test_e2"):
    assert f"PASSED suite/test_{name}" in out, out
