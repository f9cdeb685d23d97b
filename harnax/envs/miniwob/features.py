"""Text features of MiniWoB++ observations for the log-linear policy (harnax.policies).

The policy scores each candidate output `o` (a command string) from features
of the *encoded observation text* and `o` alone, so one weight vector reads
any harness's text: `log p(o | text) = log_softmax_o(phi(text, o) . theta)`.

For a click on element `[k]` the model finds the line that shows `[k]` and
fires one indicator for (line position, element named in the task line,
element status); it also has a position-free indicator per element kind and,
for clicks that finish a task (buttons, links), indicators for the harness's
check and verification notes. Because what the model knows about "named in
the task" is tied to line *positions*, weights trained on one field order read
the wrong lines under another: a readout drift with the optimum unchanged.
Batch commands sum their clicks' features and add a batch indicator.
"""

from __future__ import annotations

import re

import numpy as np

from harnax.envs.miniwob import harnesses as harnesses_lib

KINDS = ("checkbox", "radio", "button", "tab", "link")
FINISHING = ("button", "link")
NUM_POSITIONS = 24
_STATUS = {"": 0, "checked": 1, "selected": 1, "open": 1, "unchecked": 2, "unselected": 2,
           "closed": 2}
_NOTE = {"absent": 0, "pass": 1, "fail": 2}  # check / verify notes ("not run" = absent)

_POS = 0
_KIND = _POS + NUM_POSITIONS * 2 * 3
_FINISH = _KIND + len(KINDS)
_BATCH = _FINISH + 9
_UNSEEN = _BATCH + 1
_WAIT = _UNSEEN + 1
_VERIFY = _WAIT + 1
_SCROLL = _VERIFY + 3
_UNKNOWN = _SCROLL + 1
NUM_FEATURES = _UNKNOWN + 1
"""Feature dimension D."""


def _feature_names() -> tuple[str, ...]:
  names = [f"line {pos}, {'in task' if in_task else 'not in task'}, status {status}"
           for pos in range(NUM_POSITIONS) for in_task in (0, 1)
           for status in ("none", "on", "off")]
  names += [f"kind {k}" for k in KINDS]
  names += [f"finish, check {c}, verify {v}" for c in _NOTE for v in _NOTE]
  names += ["batch", "unseen element in batch", "wait"]
  names += [f"verify, note {v}" for v in _NOTE]
  names += ["unparsed output", "unknown element"]
  return tuple(names)


FEATURE_NAMES = _feature_names()
"""What each of the D features indicates, `FEATURE_NAMES[i]` for feature i."""

_ELEMENT = re.compile(r'\[(\d+)\]: (\w+) "(.*)"(?: \((\w+)\))?')
_CLICK = re.compile(r"click((?: \[\d+\])+)")


def _note(lines: dict[str, str], name: str) -> int:
  value = lines.get(name, "not run")
  return _NOTE[value.split(" ", 1)[0]] if value.split(" ", 1)[0] in _NOTE else 0


def text_features(text: str, output: str) -> np.ndarray:
  """Features `[NUM_FEATURES]` of candidate `output` given observation `text`."""
  phi = np.zeros(NUM_FEATURES)
  rows = [line.partition(": ") for line in text.split("\n")]
  named = {name: value for name, _, value in rows}
  task = named.get("task", "")
  check, verify = _note(named, "check"), _note(named, "verify")
  elements = {}
  for pos, (name, _, value) in enumerate(rows):
    m = _ELEMENT.fullmatch(f"{name}: {value}")
    if m:
      elements[int(m.group(1))] = (pos, m.group(2), m.group(3), m.group(4) or "")
  if output == "wait":
    phi[_WAIT] = 1.0
  elif output == "verify":
    phi[_VERIFY + verify] = 1.0
  elif (m := _CLICK.fullmatch(output)) is not None:
    ids = [int(x) for x in re.findall(r"\d+", m.group(1))]
    phi[_BATCH] = float(len(ids) > 1)
    for k in ids:
      if k not in elements:
        phi[_UNSEEN if len(ids) > 1 and k > 0 else _UNKNOWN] += 1.0
        continue
      pos, kind, label, status = elements[k]
      in_task = re.search(rf"(?<![\w#]){re.escape(label)}(?![\w])", task) is not None
      phi[_POS + (min(pos, NUM_POSITIONS - 1) * 2 + in_task) * 3 + _STATUS.get(status, 0)] += 1.0
      if kind in KINDS:
        phi[_KIND + KINDS.index(kind)] += 1.0
      if kind in FINISHING:
        phi[_FINISH + check * 3 + verify] += 1.0
  else:
    phi[_SCROLL] = 1.0
  return phi


def harness_features(compiled: harnesses_lib.CompiledHarness) -> np.ndarray:
  """`[S, O, NUM_FEATURES]`: features of every candidate output in every state."""
  return np.stack([
      np.stack([text_features(compiled.observation(s), o) for o in compiled.outputs])
      for s in range(compiled.harness.num_states)])
