"""The compiled MiniWoB++ MDPs against the real task pages in headless Chromium.

Browser tests are `slow`. Outside CI they skip (one line) when no usable
browser is installed; with CI=true a missing browser fails them. The error
cases that need no browser run everywhere.
"""

import os
import stat
import time

import numpy as np
import pytest

from harnax.envs.miniwob import browser
from harnax.envs.miniwob import harnesses
from harnax.envs.miniwob import tasks

SEEDS = tuple(range(8))
NUM_RANDOM = 1  # per seed and harness, beside the optimal sequence
MAX_STEPS = 8


def _in_ci() -> bool:
  return os.environ.get("CI", "").strip().lower() in ("true", "1")


@pytest.fixture(scope="module")
def session():
  """One browser session for the module (an env per family, reset per episode)."""
  try:
    browser.find_browser()
  except browser.BrowserUnavailableError as e:
    if _in_ci():
      pytest.fail(f"CI=true requires the browser: {e}")
    pytest.skip(f"no usable browser ({str(e).split('. ')[0]}); see docs/browser.md")
  with browser.BrowserSession() as s:
    yield s


# ---------------------------------------------------------------------------
# Agreement (the spec of the bridge)
# ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_pages_agree_with_compiled_mdp(session, family):
  """Random and optimal sequences under H0-H5: states, rewards, ends all agree.

  `compare` checks per step the harness state (so the page state and the
  end of the episode), the raw reward, the sign of the time-decayed reward,
  the elements shown, and that the observed state is reachable in the MDP.
  """
  start = time.perf_counter()
  result = browser.validate(family, SEEDS, NUM_RANDOM, session=session, max_steps=MAX_STEPS)
  elapsed = time.perf_counter() - start
  found, replays = result.disagreements, result.replays
  assert not found, "\n".join(str(d) for d in found)
  assert len(replays) == len(SEEDS) * len(harnesses.HARNESSES) * (NUM_RANDOM + 1)
  per_episode = [f"random-{k}" for k in range(NUM_RANDOM)] + ["optimal"]
  assert result.sequences == tuple(per_episode * (len(SEEDS) * len(harnesses.HARNESSES)))
  assert [(r.seed, r.compiled.spec.name) for r in replays[::NUM_RANDOM + 1]] == [
      (seed, h) for seed in SEEDS for h in harnesses.HARNESSES]
  steps = sum(len(r.steps) for r in replays)
  print(f"{family}: {len(replays)} episodes, {steps} steps, {elapsed:.1f} s")

  # Every observed state is a state of the compiled MDP, reachable from its start.
  for r in replays:
    reachable = browser.reachable_states(r.compiled)
    assert {r.initial_state} | {s.state for s in r.steps} <= reachable

  # The optimal sequences end in success on the page, with the MDP's reward.
  optimal = [r for r, label in zip(replays, result.sequences) if label == "optimal"]
  for r in optimal:
    assert r.steps[-1].done and r.steps[-1].raw_reward == tasks.SUCCESS_REWARD, r
    assert r.steps[-1].env_reward > 0
  # The random ones also reach failing ends, so both reward signs are compared.
  assert any(r.steps and r.steps[-1].done and r.steps[-1].raw_reward < 0 for r in replays)


@pytest.mark.slow
@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_page_task_is_reproducible(session, family):
  for seed in SEEDS[:3]:
    obs = session.reset(family, seed)
    task = browser.page_task(session, family)
    assert task.utterance == obs["utterance"]
    assert browser.read_page_state(session, family) == task.initial_state
    assert tuple(sorted(browser.visible_elements(task, obs))) == task.visible(task.initial_state)
    session.reset(family, seed + 100)
    session.reset(family, seed)
    assert browser.page_task(session, family) == task


@pytest.mark.slow
def test_checkbox_value_encoding(session):
  """A checked box's observation `value` is the string 'True', unchecked ''."""
  obs = session.reset("click-checkboxes", 0)
  task = browser.page_task(session, "click-checkboxes")
  refs = browser.visible_elements(task, obs)
  env = session.env("click-checkboxes")
  obs, *_ = browser.page.click_element(env, refs[0])
  values = {d["id"]: d["value"] for d in obs["dom_elements"] if d["tag"] == "input_checkbox"}
  assert values["ch0"] == "True" and values["ch1"] == ""
  assert browser.read_page_state(session, "click-checkboxes") == 1


@pytest.mark.slow
def test_replay_by_name_and_blocked_finish(session):
  session.reset("click-option", 3)
  task = browser.page_task(session, "click-option")
  submit = f"click [{len(task.labels) + 1}]"
  right = f"click [{task.answer + 1}]"
  wrong = f"click [{(task.answer + 1) % len(task.labels) + 1}]"

  r = browser.replay("click-option", 3, ["wait", right, submit], "H0", session=session)
  assert [s.sent for s in r.steps] == [1, 1, 1]
  assert r.steps[-1].done and r.steps[-1].raw_reward == 1.0
  assert not browser.compare(r)

  # H2 withholds a failing Submit: nothing is sent, the page stays as it is.
  r = browser.replay("click-option", 3, [wrong, submit, right, submit],
                     "H2", session=session)
  assert [s.blocked for s in r.steps] == [False, True, False, False]
  assert r.steps[1].sent == 0 and not r.steps[1].done
  assert r.steps[1].page == (task.answer + 1) % len(task.labels) + 1
  assert r.steps[-1].raw_reward == 1.0
  assert not browser.compare(r)

  # H0 sends it: the page ends the episode with -1.
  r = browser.replay("click-option", 3, [wrong, submit], "H0", session=session)
  assert r.steps[-1].done and r.steps[-1].raw_reward == -1.0 and r.steps[-1].env_reward == -1.0
  assert not browser.compare(r)

  # H3's verify sends nothing and only sets the verified flag.
  r = browser.replay("click-option", 3, ["verify"], "H3", session=session)
  assert r.steps[0].sent == 0
  assert r.steps[0].state == r.compiled.state_of(0, verified=True)
  assert not browser.compare(r)


@pytest.mark.slow
def test_started_episode_is_played_before_another_reset(session):
  """`replay` is `start_episode` then `play_episode`; a start outlived by a reset is refused."""
  start = browser.episodes.start_episode("click-option", 3, "H0", session=session)
  task = start.compiled.task
  assert task == browser.page_task(session, "click-option")
  right, submit = f"click [{task.answer + 1}]", f"click [{len(task.labels) + 1}]"
  r = browser.episodes.play_episode(start, [right, submit])
  assert r.compiled is start.compiled and [s.sent for s in r.steps] == [1, 1]
  assert r.steps[-1].done and r.steps[-1].raw_reward == tasks.SUCCESS_REWARD
  assert not browser.compare(r)

  start = browser.episodes.start_episode("click-option", 3, "H0", session=session)
  session.reset("click-option", 4)
  with pytest.raises(ValueError, match="start: the click-option page was reset"):
    browser.episodes.play_episode(start, [right])


@pytest.mark.slow
def test_replay_rejects_bad_actions(session):
  with pytest.raises(ValueError, match=r"actions\[1\].*out of range"):
    browser.replay("click-tab-2", 0, [0, 10_000], "H0", session=session)
  with pytest.raises(ValueError, match=r"actions\[0\].*not an action"):
    browser.replay("click-tab-2", 0, ["scroll down"], "H0", session=session)
  with pytest.raises(ValueError, match=r"actions\[0\]"):
    browser.replay("click-tab-2", 0, [-1], "H0", session=session)


# ---------------------------------------------------------------------------
# Errors that need no browser
# ---------------------------------------------------------------------------

def test_unknown_family_names_the_field():
  with pytest.raises(ValueError, match="family"):
    browser.replay("click-nothing", 0, [0])
  with pytest.raises(ValueError, match="family"):
    browser.validate("click-nothing", [0])
  with pytest.raises(ValueError, match="family"):
    browser.page_task(browser.BrowserSession(), "click-nothing")
  with pytest.raises(ValueError, match="family"):
    browser.BrowserSession().env("click-nothing")


def test_bad_arguments_name_the_field():
  with pytest.raises(ValueError, match="harness"):
    browser.replay("click-option", 0, [0], "H9")
  with pytest.raises(ValueError, match="start_timeout"):
    browser.BrowserSession(start_timeout=0)
  with pytest.raises(ValueError, match="num_random_sequences"):
    browser.validate("click-option", [0], -1)
  with pytest.raises(ValueError, match="max_steps"):
    browser.validate("click-option", [0], max_steps=0)
  with pytest.raises(ValueError, match="compiled"):
    browser.optimal_policy(0.05)


def _script(path, body):
  path.write_text("#!/bin/sh\n" + body + "\n")
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return str(path)


@pytest.fixture
def fake_browser(tmp_path, monkeypatch):
  """Points the bridge at shell scripts posing as chromium and chromedriver."""
  pytest.importorskip("miniwob")

  def make(browser_version, driver_version, driver_body="exit 1"):
    chrome = _script(tmp_path / "chromium", f'echo "Chromium {browser_version} built on test"')
    log = tmp_path / "starts"
    driver = _script(tmp_path / "chromedriver",
                     f'if [ "$1" = "--version" ]; then echo "ChromeDriver {driver_version} (x)";'
                     f' exit 0; fi\necho start >> {log}\n{driver_body}')
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", chrome)
    monkeypatch.setenv("MINIWOB_CHROMEDRIVER", driver)
    return log
  return make


def test_missing_browser_names_the_setup(monkeypatch, tmp_path):
  pytest.importorskip("miniwob")
  monkeypatch.setenv("MINIWOB_CHROME_BINARY", str(tmp_path / "no-chromium"))
  monkeypatch.setenv("MINIWOB_CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
  with pytest.raises(browser.BrowserUnavailableError,
                     match="chromium: not found.*apt-get install -y chromium chromium-driver"):
    browser.find_browser()


def test_one_variable_alone_is_an_error(monkeypatch):
  pytest.importorskip("miniwob")
  monkeypatch.setenv("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
  monkeypatch.delenv("MINIWOB_CHROMEDRIVER", raising=False)
  with pytest.raises(browser.BrowserUnavailableError, match="MINIWOB_CHROMEDRIVER.*together"):
    browser.find_browser()


def test_stale_driver_is_reported(fake_browser):
  fake_browser("120.0.6099.1", "119.0.6045.2")
  with pytest.raises(browser.BrowserUnavailableError,
                     match="chromedriver: version 119 does not match chromium 120"):
    browser.find_browser()


def test_failed_start_is_reported_once(fake_browser):
  """A driver that dies: one clear error, raised again without a second start."""
  log = fake_browser("120.0.6099.1", "120.0.6099.1")
  with browser.BrowserSession(start_timeout=60) as s:
    with pytest.raises(browser.BrowserUnavailableError, match="failed to start.*apt-get") as e:
      s.env("click-option")
    with pytest.raises(browser.BrowserUnavailableError) as again:
      s.env("click-tab-2")
    assert again.value is e.value
  assert log.read_text().count("start") == 1


def test_hung_start_times_out(fake_browser):
  fake_browser("120.0.6099.1", "120.0.6099.1", driver_body="sleep 20")
  start = time.perf_counter()
  with browser.BrowserSession(start_timeout=3) as s:
    with pytest.raises(browser.BrowserUnavailableError, match="did not start within 3 s"):
      s.env("click-option")
  assert time.perf_counter() - start < 15


def test_random_policy_uses_available_actions():
  c = harnesses.compile_harness(tasks.sample_task("click-tab-2", 0), "H1")
  policy = browser.random_policy(np.random.default_rng(0))
  avail = np.asarray(c.harness.pi_ref) > 0
  assert all(avail[0, policy(c, 0, t)] for t in range(50))


def test_optimal_policy_solves_the_padded_mdp():
  """Padding to shared shapes leaves the soft-optimal policy unchanged."""
  from harnax.core import solvers
  c = harnesses.compile_harness(tasks.sample_task("click-option", 1), "H5")
  ref = solvers.solve_soft_bellman(c.harness.mdp, c.harness.pi_ref, 0.05).policy
  np.testing.assert_allclose(browser.soft_optimal_policy(c, 0.05), np.asarray(ref), atol=1e-4)


def test_reachable_states_of_tabs():
  c = harnesses.compile_harness(tasks.sample_task("click-tab-2", 0), "H3")
  assert browser.reachable_states(c) == frozenset(range(c.done_state + 1))


def test_optimal_policy_is_solved_once_for_its_harness(monkeypatch):
  """One solve when the policy is built, none per step; it serves only its own harness."""
  from harnax.core import solvers
  c = harnesses.compile_harness(tasks.sample_task("click-option", 1), "H5")
  solves = []
  solve = browser.policies.soft_optimal_policy

  def counting_solve(*args, **kwargs):
    solves.append(args)
    return solve(*args, **kwargs)

  monkeypatch.setattr(browser.policies, "soft_optimal_policy", counting_solve)
  policy = browser.optimal_policy(c, tau=0.05)
  # Greedy in the unpadded solution (ties within the solver's tolerance allowed).
  ref = np.asarray(solvers.solve_soft_bellman(c.harness.mdp, c.harness.pi_ref, 0.05).policy)
  for state in range(c.done_state + 1):
    for t in range(2):
      a = policy(c, state, t)
      assert ref[state, a] >= ref[state].max() - 1e-4
  assert len(solves) == 1
  # An equal harness compiled again is another object: refused, never answered from the policy
  # of whatever object once had its id.
  with pytest.raises(ValueError, match="compiled: this policy was solved for"):
    policy(harnesses.compile_harness(c.task, "H5"), 0, 0)
