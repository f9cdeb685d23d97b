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


class _Worker:
  """What the scheduler reads of a worker: tests sent, shutdown asked."""

  def __init__(self, name):
    self.name, self.sent, self.shutting_down = name, [], False
    self.gateway = type("Gateway", (), {"id": name})()

  def send_runtest_some(self, indices):
    self.sent += indices

  def shutdown(self):
    self.shutting_down = True

  def __repr__(self):
    return self.name


def test_both_workers_crashing_and_one_replacement_collecting_first():
  # The race seen in a full run: gw0 and gw1 die, gw2 finishes collecting while gw3 is still
  # collecting, and rescheduling every node must not index gw3's missing collection.
  import collections
  import types

  from xdist_crash_retry import CrashSafeLoadScope
  sched = CrashSafeLoadScope.__new__(CrashSafeLoadScope)   # no pytest config needed
  sched.numnodes, sched.collection, sched.workqueue = 2, None, collections.OrderedDict()
  sched.assigned_work, sched.registered_collections = {}, {}
  sched.log = lambda *a: None
  sched.config = types.SimpleNamespace(option=types.SimpleNamespace(loadscopereorder=True))
  tests = [f"test_{m}.py::test_{i}" for m in "abc" for i in range(2)]
  gw = [_Worker(f"gw{i}") for i in range(4)]
  for w in gw[:2]:
    sched.add_node(w)
    sched.add_node_collection(w, tests)
  sched.schedule()
  assert gw[0].sent and gw[1].sent
  sched.remove_node(gw[0])
  sched.remove_node(gw[1])
  for w in gw[2:]:
    sched.add_node(w)
  sched.add_node_collection(gw[2], tests)
  sched.schedule()                         # gw3 has not collected yet
  assert gw[2].sent and not gw[3].sent and not gw[3].shutting_down
  sched.add_node_collection(gw[3], tests)
  sched.schedule()
  assert gw[3].sent or gw[3].shutting_down
  handed = [tests[i] for w in gw[2:] for i in w.sent]
  assert sorted(set(handed)) == sorted(tests) and len(handed) == len(tests)
