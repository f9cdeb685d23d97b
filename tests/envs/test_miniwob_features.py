"""Text features of MiniWoB++ observations (harnax.envs.miniwob.features)."""

import numpy as np

from harnax.envs import miniwob as mw
from harnax.envs.miniwob import features as fe


def _lit(phi):
  """The names of the features that fire, with their counts."""
  return {fe.FEATURE_NAMES[i]: float(phi[i]) for i in np.flatnonzero(phi)}


def test_every_feature_has_a_distinct_name():
  assert len(fe.FEATURE_NAMES) == fe.NUM_FEATURES == len(set(fe.FEATURE_NAMES))


def test_features_read_positions_and_sum_over_batches():
  task = mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(True, False, True))
  c = mw.compile_harness(task, "H1")
  flip = mw.compile_harness(task, "H1", reverse_fields=True)
  text, text_r = c.observation(0), flip.observation(0)
  one = fe.text_features(text, "click [1]")
  assert not np.array_equal(one, fe.text_features(text_r, "click [1]"))  # position moved
  np.testing.assert_array_equal(fe.text_features(text, "wait"),
                                fe.text_features(text_r, "wait"))
  assert _lit(fe.text_features(text, "wait")) == {"wait": 1.0}
  # Element [1] is the checkbox "ab", named in the task and unchecked, on some line.
  lit = _lit(one)
  assert lit.pop("kind checkbox") == 1.0
  ((line, count),) = lit.items()
  assert count == 1.0 and line.endswith("in task, status off") and "not" not in line
  # A batch click is the sum of its clicks plus the batch indicator.
  diff = fe.text_features(text, "click [1] [3]") - one - fe.text_features(text, "click [3]")
  assert _lit(diff) == {"batch": 1.0}
  assert _lit(fe.text_features(text, "click [0]")) == {"unknown element": 1.0}
  assert _lit(fe.text_features(text, "scroll down")) == {"unparsed output": 1.0}


def test_the_check_note_is_read_by_finishing_clicks():
  task = mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(True, False, True))
  h2 = mw.compile_harness(task, "H2")
  submit = "click [4]"
  fail = _lit(fe.text_features(h2.observation(h2.state_of(0)), submit))
  ok = _lit(fe.text_features(h2.observation(h2.state_of(0b101)), submit))
  finish = lambda lit: {k for k in lit if k.startswith("finish")}  # noqa: E731
  assert finish(fail) == {"finish, check fail, verify absent"}
  assert finish(ok) == {"finish, check pass, verify absent"}
