"""MiniWoB++ task families compiled under H0–H5: validity, semantics, harness properties.

References are independent: rewards recomputed from the task pages' own
formulas, shortest click counts derived by hand, reachability by a plain BFS.
"""

import collections

import jax
import numpy as np
import pytest

import harnax as hx
from harnax.envs import miniwob as mw

SEEDS = range(6)
CASES = [(f, s) for f in mw.FAMILIES for s in SEEDS]
TAU = 0.1
GAMMA = 0.9


pytestmark = pytest.mark.x64


@pytest.fixture(scope="module")
def compiled():
  with jax.enable_x64(True):
    return {(f, s): mw.compile_all(mw.sample_task(f, s), discount=GAMMA) for f, s in CASES}


def _reachable(mdp, pi_ref):
  p, avail = np.asarray(mdp.transitions), np.asarray(pi_ref) > 0
  seen = set(np.flatnonzero(np.asarray(mdp.initial)))
  queue = collections.deque(seen)
  while queue:
    s = queue.popleft()
    for a in np.flatnonzero(avail[s]):
      for t in np.flatnonzero(p[s, a]):
        if t not in seen:
          seen.add(int(t))
          queue.append(int(t))
  return seen


# ---------------------------------------------------------------------------
# Task semantics (the pages' own rules, written out independently).
# ---------------------------------------------------------------------------

def test_checkbox_reward_is_the_page_formula():
  task = mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(True, False, True))
  assert task.utterance == "Select ab, ef and click Submit."
  submit = 3
  for state in range(8):
    checked = [(state >> i) & 1 == 1 for i in range(3)]
    # page: r += checked == toclick ? 1 : -1, reward r / n
    r = sum(1.0 if c == t else -1.0 for c, t in zip(checked, task.targets)) / 3
    nxt, reward = task.click(state, submit)
    assert nxt is None and reward == pytest.approx(r)
  assert task.click(0b000, 1) == (0b010, 0.0)
  assert task.click(0b010, 1) == (0b000, 0.0)


def test_checkbox_nothing_named():
  task = mw.CheckboxesTask(labels=("ab", "cd"), targets=(False, False))
  assert task.utterance == "Select nothing and click Submit."
  assert task.click(0, 2) == (None, 1.0)
  assert mw.CheckboxesTask.from_page(task.utterance, task.labels) == task


def test_option_and_tabs_rewards():
  opt = mw.OptionTask(labels=("x1", "y2", "z3"), answer=1)
  assert opt.click(0, 3) == (None, -1.0)        # nothing selected
  assert opt.click(opt.click(0, 1)[0], 3) == (None, 1.0)
  assert opt.click(opt.click(0, 2)[0], 3) == (None, -1.0)
  tabs = mw.TabsTask(links=(("a", "b"), (), ("b", "c")), target="b")
  # elements: 3 tabs, then links a, b (tab 0) and b, c (tab 2)
  assert [e.kind for e in tabs.elements] == ["tab"] * 3 + ["link"] * 4
  assert tabs.visible(0) == (0, 1, 2, 3, 4) and tabs.visible(2) == (0, 1, 2, 5, 6)
  assert tabs.visible(1) == (0, 1, 2)
  assert tabs.click(0, 4) == (None, 1.0) and tabs.click(2, 5) == (None, 1.0)  # both "b"
  assert tabs.click(2, 6) == (None, -1.0)
  assert tabs.click(0, 2) == (2, 0.0)
  with pytest.raises(ValueError, match="element: 5 is not a visible element"):
    tabs.click(0, 5)


@pytest.mark.parametrize("family", mw.FAMILIES)
def test_sampling_is_deterministic_and_round_trips(family):
  for seed in SEEDS:
    t = mw.sample_task(family, seed)
    assert t == mw.sample_task(family, seed)
    if family == "click-tab-2":
      assert mw.TabsTask.from_page(t.utterance, t.links) == t
    else:
      assert type(t).from_page(t.utterance, t.labels) == t
  assert len({mw.sample_task(family, s) for s in range(40)}) > 30


def test_task_split_is_disjoint_and_deterministic():
  train, test = mw.task_split("click-option", 12, 5, seed=3)
  assert len(train) == 12 and len(test) == 5
  assert not set(train) & set(test)
  assert (train, test) == mw.task_split("click-option", 12, 5, seed=3)


# ---------------------------------------------------------------------------
# Compiled MDPs.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_compiled_mdps_are_valid(compiled, case):
  for name, c in compiled[case].items():
    h = c.harness
    p, r = np.asarray(h.mdp.transitions), np.asarray(h.mdp.rewards)
    np.testing.assert_allclose(p.sum(-1), 1.0)
    assert np.all(p >= 0)
    done = c.done_state
    assert np.all(p[done, :, done] == 1.0) and np.all(r[done] == 0.0)    # absorbing
    assert np.all(np.asarray(h.pi_ref).sum(-1) > 0)
    assert _reachable(h.mdp, h.pi_ref) == set(range(h.num_states)), name
    # Deterministic pages: every available transition is a point mass.
    avail = np.asarray(h.pi_ref) > 0
    assert np.all(p[avail].max(-1) == 1.0)
    assert np.all(np.abs(r) <= 1.0)


def test_compilation_is_deterministic(compiled):
  for (f, s), hs in list(compiled.items())[::5]:
    again = mw.compile_all(mw.sample_task(f, s), discount=GAMMA)
    for name in mw.HARNESSES:
      a, b = hs[name].harness, again[name].harness
      np.testing.assert_array_equal(a.mdp.transitions, b.mdp.transitions)
      np.testing.assert_array_equal(a.mdp.rewards, b.mdp.rewards)
      np.testing.assert_array_equal(a.decode_table, b.decode_table)
      assert [a.encode(st) for st in range(a.num_states)] == [
          b.encode(st) for st in range(b.num_states)]


def _hard_value(c):
  """V*(s0) of the unregularized problem by float64 NumPy value iteration."""
  h = c.harness
  p, r = np.asarray(h.mdp.transitions), np.asarray(h.mdp.rewards)
  avail = np.asarray(h.pi_ref) > 0
  v = np.zeros(h.num_states)
  for _ in range(400):
    v = np.where(avail, r + GAMMA * p @ v, -np.inf).max(-1)
  return float(v[0])


def test_shortest_paths_match_hand_counts():
  # Checkboxes: H0 needs one click per named box, then Submit; H1 clicks all
  # named boxes in one batch (when there are at least two).
  task = mw.CheckboxesTask(labels=("ab", "cd", "ef", "gh"), targets=(True, False, True, True))
  assert _hard_value(mw.compile_harness(task, "H0")) == pytest.approx(GAMMA ** 3)
  assert _hard_value(mw.compile_harness(task, "H1")) == pytest.approx(GAMMA ** 1)
  # Option: select then submit; H1's (select, submit) batch does it in one step.
  opt = mw.OptionTask(labels=("x1", "y2"), answer=0)
  assert _hard_value(mw.compile_harness(opt, "H0")) == pytest.approx(GAMMA)
  assert _hard_value(mw.compile_harness(opt, "H1")) == pytest.approx(1.0)
  # Tabs: the link behind tab 3 needs a tab click first (H0), one batch in H1.
  tabs = mw.TabsTask(links=(("a",), (), ("b",)), target="b")
  assert _hard_value(mw.compile_harness(tabs, "H0")) == pytest.approx(GAMMA)
  assert _hard_value(mw.compile_harness(tabs, "H1")) == pytest.approx(1.0)
  # Verification never helps an optimal hard policy, and never hurts it.
  for t in (task, opt, tabs):
    assert _hard_value(mw.compile_harness(t, "H3")) == pytest.approx(
        _hard_value(mw.compile_harness(t, "H0")))


@pytest.mark.parametrize("family", mw.FAMILIES)
def test_batch_clicks_change_the_ceiling_where_they_save_steps(family):
  changed = 0
  for s in range(20):
    task = mw.sample_task(family, s)
    h0, h1 = (mw.compile_harness(task, h, discount=GAMMA) for h in ("H0", "H1"))
    if _hard_value(h1) > _hard_value(h0) + 1e-9:
      c0 = float(hx.ceiling(h0.harness.mdp, h0.harness.pi_ref, TAU))
      c1 = float(hx.ceiling(h1.harness.mdp, h1.harness.pi_ref, TAU))
      assert abs(c1 - c0) > 1e-3
      changed += 1
      if changed == 2:  # each new shape compiles the solver: two cases suffice
        break
  assert changed > 0


def test_field_order_flag_leaves_the_optimum_and_decisions_unchanged(compiled):
  for (f, s), hs in compiled.items():
    for name in ("H0", "H5"):
      base = hs[name]
      flip = mw.compile_harness(base.task, name, discount=GAMMA, reverse_fields=True)
      b, r = base.harness, flip.harness
      np.testing.assert_array_equal(b.mdp.transitions, r.mdp.transitions)
      np.testing.assert_array_equal(b.mdp.rewards, r.mdp.rewards)
      np.testing.assert_array_equal(b.pi_ref, r.pi_ref)
      np.testing.assert_array_equal(b.decode_table, r.decode_table)
      if s != 0:
        continue  # equal arrays give equal optima; solve one instance per family
      sb = hx.solve_soft_bellman(b.mdp, b.pi_ref, TAU)
      sr = hx.solve_soft_bellman(r.mdp, r.pi_ref, TAU)
      np.testing.assert_array_equal(sb.policy, sr.policy)
      np.testing.assert_array_equal(np.argmax(sb.q, -1), np.argmax(sr.q, -1))
      # ... while the text the model reads does change (lines reversed).
      for st in range(b.num_states):
        lines = b.encode(st).split("\n")
        assert r.encode(st).split("\n") == lines[::-1]
        if len(lines) > 1:
          assert r.encode(st) != b.encode(st)


def test_instructions_are_representation_only(compiled):
  for hs in compiled.values():
    h0, h4 = hs["H0"].harness, hs["H4"].harness
    np.testing.assert_array_equal(h0.mdp.transitions, h4.mdp.transitions)
    np.testing.assert_array_equal(h0.mdp.rewards, h4.mdp.rewards)
    np.testing.assert_array_equal(h0.decode_table, h4.decode_table)
    assert "instructions: " in h4.encode(0) and "instructions: " not in h0.encode(0)


def test_automatic_checking_blocks_every_failing_finish(compiled):
  for hs in compiled.values():
    for name in ("H2", "H5"):
      c = hs[name]
      p, r = np.asarray(c.harness.mdp.transitions), np.asarray(c.harness.mdp.rewards)
      avail = np.asarray(c.harness.pi_ref) > 0
      finish = avail & (p[:, :, c.done_state] == 1.0)
      finish[c.done_state] = False
      assert np.all(r[finish] == 1.0)
      assert finish.any()
    # Without the check, some finish fails.
    assert np.any(np.asarray(hs["H0"].harness.mdp.rewards) < 0)


def test_verification_tool_marks_states(compiled):
  for hs in compiled.values():
    c = hs["H3"]
    task, h = c.task, c.harness
    assert h.num_states == 2 * task.num_page_states + 1
    k = h.action_names.index("verify")
    p = np.asarray(h.mdp.transitions)
    for page in range(task.num_page_states):
      for flag in (False, True):
        st = c.state_of(page, flag)
        assert p[st, k, c.state_of(page, True)] == 1.0
        assert ("verify: not run" in h.encode(st)) == (not flag)
        # any other action clears the flag (wait keeps the page)
        assert p[st, 0, c.state_of(page, False)] == 1.0


def test_decode_table_is_shared_and_harness_specific(compiled):
  task = mw.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(True, True, False))
  hs = mw.compile_all(task)
  outs = hs["H0"].outputs
  assert all(c.outputs == outs for c in hs.values())
  o_batch = outs.index("click [1] [2]")
  o_verify = outs.index("verify")
  assert hs["H0"].harness.decode_table[0, o_batch] == -1
  assert hs["H1"].harness.action_names[hs["H1"].harness.decode_table[0, o_batch]] == (
      "click [1] [2]")
  assert hs["H0"].harness.decode_table[0, o_verify] == -1
  assert hs["H3"].harness.action_names[hs["H3"].harness.decode_table[0, o_verify]] == "verify"
  for c in hs.values():
    for d in mw.harnesses.DISTRACTORS:
      assert np.all(np.asarray(c.harness.decode_table)[:, outs.index(d)] == -1)


def test_observation_text_shows_element_state():
  task = mw.OptionTask(labels=("x1", "y2"), answer=1)
  c = mw.compile_harness(task, "H2")
  text = c.observation(c.state_of(2))
  assert text.split("\n")[0] == "task: Select y2 and click Submit."
  assert '[2]: radio "y2" (selected)' in text and '[1]: radio "x1" (unselected)' in text
  assert "check: pass (the selected option is the one the task names)" in text
  assert c.observation(c.done_state) == "task: done"


# ---------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------

def test_bad_input_is_named():
  with pytest.raises(ValueError, match="family: expected one of"):
    mw.sample_task("click-everything", 0)
  with pytest.raises(ValueError, match="harness: expected one of"):
    mw.compile_harness(mw.sample_task("click-option", 0), "H9")
  with pytest.raises(ValueError, match="seed: expected a non-negative int"):
    mw.sample_task("click-option", -1)
  with pytest.raises(ValueError, match="labels: expected distinct labels"):
    mw.OptionTask(labels=("a", "a"), answer=0)
  with pytest.raises(ValueError, match="labels: expected 2 to 6 labels"):
    mw.CheckboxesTask(labels=("a",), targets=(True,))
  with pytest.raises(ValueError, match="answer: expected an option index"):
    mw.OptionTask(labels=("a", "b"), answer=2)
  with pytest.raises(ValueError, match="targets: expected 2 booleans"):
    mw.CheckboxesTask(labels=("a", "b"), targets=(True,))
  with pytest.raises(ValueError, match="target: expected the text of one of the links"):
    mw.TabsTask(links=(("a",), (), ()), target="b")
  with pytest.raises(ValueError, match="links: expected at least one link"):
    mw.TabsTask(links=((), (), ()), target="b")
  with pytest.raises(ValueError, match="utterance: names"):
    mw.CheckboxesTask.from_page("Select zz and click Submit.", ("a", "b"))
  with pytest.raises(ValueError, match="field_order: expected a permutation"):
    mw.harness_spec("H0", field_order=("task", "notes"))
  c = mw.compile_harness(mw.sample_task("click-option", 0), "H0")
  with pytest.raises(ValueError, match="state: expected a state id"):
    c.observation(c.done_state + 1)
  with pytest.raises(ValueError, match="discount: expected a float in"):
    mw.compile_harness(mw.sample_task("click-option", 0), "H0", discount=1.0)
  with pytest.raises(ValueError, match="state: expected a page state"):
    mw.sample_task("click-option", 0).click(99, 0)
