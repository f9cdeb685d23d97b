"""pytest-xdist plugin: `--dist loadscope` that survives a crashed worker, and one retry of the
test a worker died in.

Why: XLA:CPU occasionally aborts a test worker while compiling (README, "Known issues"; the
same test passes when run again). pytest-xdist 3.8 then does two things wrong under
`--dist loadscope` (pytest-xdist issues #1323, #1327 and #1378):

* it re-queues every module the dead worker had run, finished ones included; a finished module
  is sent to a worker as an empty batch, which never reports completion, and the run hangs;
* it gives the replacement worker a single test, but a worker only runs a test once it knows
  the next one (or that none follows), so a one-test batch also hangs.

`CrashSafeLoadScope` re-queues only the unfinished tests and keeps giving a worker work until it
holds more than two tests or the queue is empty (then it is told to finish). The test a worker
died in is run once more, on the replacement worker: the first crash is reported as a "rerun"
(shown in the summary line), not a failure, and the rerun's result is the test's result. A
test that crashes its worker twice fails and is not run a third time.

Loaded by tests/conftest.py; `-p xdist_crash_retry` loads it elsewhere.
"""

from __future__ import annotations

import pytest

try:
  from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist absent: a serial run needs none of this
  LoadScopeScheduling = None

# How many times each test's worker has died in it (the controller's count).
_CRASHES: dict[str, int] = {}
_RETRIES = 1


if LoadScopeScheduling is not None:

  class CrashSafeLoadScope(LoadScopeScheduling):
    """`--dist loadscope` scheduling whose recovery from a crashed worker cannot hang."""

    def remove_node(self, node):
      workload = self.assigned_work.pop(node)
      unfinished = {scope: unit for scope, unit in workload.items()
                    if not all(unit.values())}
      if not unfinished:
        return None
      # A worker runs its tests in the order it was given them: the first unfinished one is
      # the one it died in.
      crashed = next(nodeid for unit in unfinished.values()
                     for nodeid, done in unit.items() if not done)
      if _CRASHES.get(crashed, 0) >= _RETRIES:  # the retry crashed too: do not run it again
        unit = unfinished[self._split_scope(crashed)]
        unit[crashed] = True
        if all(unit.values()):
          del unfinished[self._split_scope(crashed)]
      self.workqueue.update(unfinished)
      for other in self.assigned_work:
        self._reschedule(other)
      return crashed

    def _assign_work_unit(self, node):
      while self.workqueue:
        scope, unit = self.workqueue.popitem(last=False)
        pending = [nodeid for nodeid, done in unit.items() if not done]
        if not pending:   # never send an empty batch: it would never complete
          continue
        self.assigned_work.setdefault(node, {})[scope] = unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid in pending])
        return

    def _reschedule(self, node):
      # A replacement worker still collecting has nothing to index its tests by yet; when both
      # workers crash, one replacement finishes collecting (and reschedules every node) first.
      # It is scheduled once its own collection arrives.
      if node.shutting_down or node not in self.registered_collections:
        return
      # More than two tests in hand, or no more to give: a worker with one test and no word
      # of what follows waits forever.
      while self.workqueue and self._pending_of(self.assigned_work.get(node, {})) <= 2:
        self._assign_work_unit(node)
      if not self.workqueue:
        node.shutdown()

else:
  CrashSafeLoadScope = None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  if CrashSafeLoadScope is not None and config.getvalue("dist") == "loadscope":
    return CrashSafeLoadScope(config, log)
  return None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
  _CRASHES[crashitem] = _CRASHES.get(crashitem, 0) + 1
  if (CrashSafeLoadScope is not None and isinstance(sched, CrashSafeLoadScope)
      and _CRASHES[crashitem] <= _RETRIES):
    # CrashSafeLoadScope.remove_node has put it back in the queue.
    report.outcome = "rerun"


def pytest_report_teststatus(report, config):
  if report.outcome == "rerun":
    return "rerun", "R", ("RERUN", {"yellow": True})
  return None
