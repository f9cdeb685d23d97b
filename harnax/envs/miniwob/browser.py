"""Real-browser bridge: replays compiled harness actions on the MiniWoB++ pages.

The finite MDPs of `harnesses` are a model of the real task pages. This module
checks that model against the pages themselves, driven in headless Chromium by
the `miniwob` package (gymnasium ids `miniwob/<family>-v1`):

* `page_task` reads the task instance a page shows after `reset(seed=s)`;
* `read_page_state` reads its current page state (checked boxes, selected
  option, open tab);
* `replay` executes semantic actions of a `CompiledHarness` on the page and
  records, per step, what the page did next to what the MDP predicts;
* `validate` replays random and optimal action sequences under H0–H5 and
  returns every disagreement.

Rewards are compared as MiniWoB++'s *raw* reward (`info["raw_reward"]`); the
environment's reward is the raw one scaled down by elapsed time when positive,
so only its sign is compared. Setup and the mapping of actions:
docs/browser.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import threading
from typing import Any, Callable, Sequence

import numpy as np

from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob import tasks as tasks_lib

SETUP_HINT = ("Real-browser validation needs Debian's chromium and chromium-driver "
              "(`apt-get install -y chromium chromium-driver`, as root), the `miniwob` "
              "package (`pip install -e '.[browser]'`), and, when the binaries are not on "
              "PATH, MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER set together "
              "(docs/browser.md).")
START_TIMEOUT = 60.0
"""Seconds a browser start may take before it is reported as failed."""
COMMAND_TIMEOUT = 30.0
"""Seconds one page script may run (a hung page raises instead of hanging)."""


class BrowserUnavailableError(RuntimeError):
  """No usable browser: missing, mismatched versions, or a failed start."""


def _env_id(family: str) -> str:
  tasks_lib.task_type(family)  # ValueError naming `family` for an unknown one
  return f"miniwob/{family}-v1"


def _major(version_output: str, what: str) -> int:
  m = re.search(r"(\d+)\.\d+\.\d+", version_output)
  if m is None:
    raise BrowserUnavailableError(f"{what}: could not read a version from "
                                  f"{version_output.strip()!r}. {SETUP_HINT}")
  return int(m.group(1))


def _version(path: str, what: str) -> str:
  try:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                         check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise BrowserUnavailableError(f"{what}: {path} --version failed ({e}). {SETUP_HINT}") from e
  return out.stdout


def find_browser() -> tuple[str, str]:
  """The Chromium binary and matching ChromeDriver to use.

  `MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER` when set (together), else
  `chromium` and `chromedriver` on PATH.

  Returns:
    `(chrome_binary, chromedriver)` paths.

  Raises:
    BrowserUnavailableError: `miniwob` is not installed, a binary is missing,
      only one of the two variables is set, or the major versions differ (a
      stale driver cannot start the browser).
  """
  try:
    import miniwob  # noqa: F401
  except ImportError as e:
    raise BrowserUnavailableError(f"the `miniwob` package is not installed. {SETUP_HINT}") from e
  chrome, driver = os.environ.get("MINIWOB_CHROME_BINARY"), os.environ.get("MINIWOB_CHROMEDRIVER")
  if bool(chrome) != bool(driver):
    raise BrowserUnavailableError(
        "MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER: expected both set or both unset, got "
        f"{'only MINIWOB_CHROME_BINARY' if chrome else 'only MINIWOB_CHROMEDRIVER'}. "
        f"{SETUP_HINT}")
  chrome = chrome or shutil.which("chromium") or shutil.which("chromium-browser")
  driver = driver or shutil.which("chromedriver")
  for what, path in (("chromium", chrome), ("chromedriver", driver)):
    if not path or not os.access(path, os.X_OK):
      raise BrowserUnavailableError(f"{what}: not found{f' at {path}' if path else ''}. "
                                    f"{SETUP_HINT}")
  browser_major = _major(_version(chrome, "chromium"), "chromium")
  driver_major = _major(_version(driver, "chromedriver"), "chromedriver")
  if browser_major != driver_major:
    raise BrowserUnavailableError(
        f"chromedriver: version {driver_major} does not match chromium {browser_major} "
        f"({driver} vs {chrome}); install both from the same distribution. {SETUP_HINT}")
  return chrome, driver


class BrowserSession:
  """Headless Chromium running the task pages; one gymnasium env per family.

  A context manager. It checks the setup and starts each family's env on first
  use; a failed start is raised once as `BrowserUnavailableError` (and raised
  again, without a new attempt, on later use), never a hang: the start runs
  under `start_timeout`. Envs are reused across episodes (`reset` per seed).

  Starting sets `SE_OFFLINE=true` and, when both are unset,
  `MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER` in `os.environ`, so
  Selenium does not look drivers up over the network.
  """

  def __init__(self, *, start_timeout: float = START_TIMEOUT):
    if not start_timeout > 0:
      raise ValueError(f"start_timeout: expected seconds > 0, got {start_timeout!r}")
    self.start_timeout = float(start_timeout)
    self._envs: dict[str, Any] = {}
    self._error: BrowserUnavailableError | None = None
    self._closed = False

  def __enter__(self) -> "BrowserSession":
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    """Closes every browser this session started."""
    envs, self._envs = self._envs, {}
    for env in envs.values():
      try:
        env.close()
      except Exception:  # pylint: disable=broad-except
        pass  # a browser that already died has nothing left to close
    self._closed = True

  def env(self, family: str):
    """The gymnasium env of `family`, started on first use."""
    env_id = _env_id(family)
    if self._closed:
      raise RuntimeError("BrowserSession: used after close()")
    if family not in self._envs:
      self._envs[family] = self._start(env_id)
    return self._envs[family]

  def _start(self, env_id: str):
    if self._error is not None:
      raise self._error
    try:
      chrome, driver = find_browser()
      os.environ["SE_OFFLINE"] = "true"
      if not os.environ.get("MINIWOB_CHROME_BINARY"):
        os.environ["MINIWOB_CHROME_BINARY"] = chrome
        os.environ["MINIWOB_CHROMEDRIVER"] = driver
      import gymnasium as gym
      import miniwob
      gym.register_envs(miniwob)
      if gym.spec(env_id).nondeterministic:
        # Seeded replays would not be reproducible, so the comparison is void.
        raise BrowserUnavailableError(f"{env_id}: registered as nondeterministic; seeded "
                                      "replays cannot be compared with the MDP")
      result: dict[str, Any] = {}

      def start():
        try:
          result["env"] = gym.make(env_id)
        except BaseException as e:  # pylint: disable=broad-except
          result["error"] = e

      thread = threading.Thread(target=start, daemon=True, name=f"start {env_id}")
      thread.start()
      thread.join(self.start_timeout)
      if thread.is_alive():
        def reap():  # a start that completes late must not leave a browser behind
          thread.join()
          if "env" in result:
            result["env"].close()
        threading.Thread(target=reap, daemon=True, name=f"reap {env_id}").start()
        raise BrowserUnavailableError(
            f"{env_id}: the browser did not start within {self.start_timeout:.0f} s "
            f"({chrome}, {driver}). {SETUP_HINT}")
      if "error" in result:
        e = result["error"]
        raise BrowserUnavailableError(
            f"{env_id}: the browser failed to start ({chrome}, {driver}): "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}. "
            f"{SETUP_HINT}") from e
      env = result["env"]
      drv = env.unwrapped.instance.driver
      drv.set_script_timeout(COMMAND_TIMEOUT)
      drv.set_page_load_timeout(COMMAND_TIMEOUT)
      return env
    except BrowserUnavailableError as e:
      self._error = e
      raise

  def reset(self, family: str, seed: int) -> dict:
    """Starts the episode of `seed` on `family`'s page; returns the observation."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    # Screenshots are not compared and cost most of a step's time.
    obs, _ = self.env(family).reset(seed=int(seed), options={"record_screenshots": False})
    return obs


def _driver(source, family: str):
  if isinstance(source, BrowserSession):
    return source.env(family).unwrapped.instance.driver
  unwrapped = getattr(source, "unwrapped", source)
  if hasattr(unwrapped, "instance"):
    return unwrapped.instance.driver
  raise ValueError(f"source: expected a BrowserSession or a miniwob env, got "
                   f"{type(source).__name__}")


# Page scripts. They read the whole page (hidden tabs included), unlike the
# observation, which lists only visible elements.
_JS_UTTERANCE = ("var u = core.getUtterance();"
                 "return typeof u === 'string' ? u : u.utterance;")
_JS_INPUTS = ("return Array.from(document.querySelectorAll('#boxes label')).map(function(l){"
              "var i = l.querySelector('input');"
              "return [l.textContent.trim(), i ? i.id : '', i ? i.type : '',"
              " i ? i.checked : false];"
              "});")
_JS_LINKS = ("return [1, 2, 3].map(function(j){"
             "return Array.from(document.querySelectorAll('#tabs-' + j + ' .alink'))"
             ".map(function(e){ return e.textContent.trim(); }); });")
_JS_TABS = ("return Array.from(document.querySelectorAll('#area > ul > li')).map(function(li){"
            "return [li.classList.contains('ui-tabs-active'),"
            "li.getAttribute('aria-selected') === 'true',"
            "li.getAttribute('aria-controls')]; });")
_INPUT_TYPE = {"click-checkboxes": "checkbox", "click-option": "radio"}


def _check_inputs(rows, family: str):
  for i, (_, dom_id, kind, _) in enumerate(rows):
    if dom_id != f"ch{i}" or kind != _INPUT_TYPE[family]:
      raise RuntimeError(f"{family}: unexpected page layout: input {i} is "
                         f"{kind!r} with id {dom_id!r}")
  return rows


def _inputs(drv, family: str):
  return _check_inputs(drv.execute_script(_JS_INPUTS), family)


def page_task(source, family: str) -> tasks_lib.Task:
  """The task instance the real page currently shows (read after a reset).

  Args:
    source: a `BrowserSession` or a `miniwob` gymnasium env of `family`.
    family: one of `tasks.FAMILIES`.

  Returns:
    The `Task`, built by the family's `from_page` from the utterance and the
    labels (boxes, options) or every tab's link texts.
  """
  tasks_lib.task_type(family)
  drv = _driver(source, family)
  utterance = drv.execute_script(_JS_UTTERANCE)
  if family == "click-tab-2":
    return tasks_lib.TabsTask.from_page(utterance, drv.execute_script(_JS_LINKS))
  labels = [row[0] for row in _inputs(drv, family)]
  return tasks_lib.task_type(family).from_page(utterance, labels)


def read_page_state(source, family: str) -> int | None:
  """The real page's current page state, or None once the episode has ended.

  Page states as in `tasks`: the bitmask of checked boxes (click-checkboxes),
  0 for none or 1 + the selected option (click-option), the open tab
  (click-tab-2; from the tab's `ui-tabs-active` class, cross-checked with
  `aria-selected`).

  Raises:
    RuntimeError: the page is in a state the task model has no name for
      (e.g. two radios checked, no tab open).
  """
  tasks_lib.task_type(family)
  drv = _driver(source, family)
  # One round trip: the end flag and the family's page data.
  done, rows = drv.execute_script(
      "return [WOB_DONE_GLOBAL, (function(){"
      + (_JS_TABS if family == "click-tab-2" else _JS_INPUTS) + "})()];")
  if done:
    return None
  if family == "click-checkboxes":
    return sum(1 << i for i, row in enumerate(_check_inputs(rows, family)) if row[3])
  if family == "click-option":
    checked = [i for i, row in enumerate(_check_inputs(rows, family)) if row[3]]
    if len(checked) > 1:
      raise RuntimeError(f"click-option: several radios checked: {checked}")
    return checked[0] + 1 if checked else 0
  active = [j for j, (cls, _, _) in enumerate(rows) if cls]
  aria = [j for j, (_, sel, _) in enumerate(rows) if sel]
  if len(rows) != tasks_lib.NUM_TABS or len(active) != 1 or active != aria:
    raise RuntimeError(f"click-tab-2: expected one open tab of {tasks_lib.NUM_TABS}, got "
                       f"ui-tabs-active on {active}, aria-selected on {aria}")
  return active[0]


def visible_elements(task: tasks_lib.Task, obs: dict) -> dict[int, int]:
  """The task's elements listed in observation `obs`: `{element index: ref}`.

  The observation lists only rendered elements, so for click-tab-2 only the
  open tab's links appear. Links are matched by their tab panel and order
  (and must show the task's text); other elements by their `id`.
  """
  elements = task.elements
  by_id = {el.dom_id: e for e, el in enumerate(elements) if el.dom_id}
  dom = list(obs["dom_elements"])
  refs: dict[int, int] = {}
  panel_of = {}  # ref of a tab panel -> tab index
  parent = {}
  for d in dom:
    parent[int(d["ref"])] = int(d["parent"])
    m = re.fullmatch(r"tabs-(\d)", str(d["id"]))
    if m:
      panel_of[int(d["ref"])] = int(m.group(1)) - 1
  link_start = {}
  for e, el in enumerate(elements):
    if el.kind == "link":
      link_start.setdefault(el.group, e)
  seen_in_group: dict[int, int] = {}
  for d in dom:
    ref, dom_id, tag = int(d["ref"]), str(d["id"]), str(d["tag"])
    if dom_id in by_id and tag.lower() != "t":
      refs[by_id[dom_id]] = ref
    elif "alink" in str(d["classes"]).split():
      node, group = ref, None
      while node in parent and group is None:
        node = parent[node]
        group = panel_of.get(node)
      if group is None or group not in link_start:
        raise RuntimeError(f"link {d['text']!r} (ref {ref}) is in no known tab panel")
      k = seen_in_group.get(group, 0)
      seen_in_group[group] = k + 1
      e = link_start[group] + k
      if e >= len(elements) or elements[e].group != group:
        raise RuntimeError(f"tab {group}: more links on the page than in the task")
      if str(d["text"]) == elements[e].text:  # else left out: `compare` reports it
        refs[e] = ref
  return refs


# ---------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
  """One semantic action on the real page, next to the MDP's prediction.

  Attributes:
    action: the action id in the compiled harness.
    name: its name (`"wait"`, `"click [2]"`, `"verify"`, ...).
    sent: the page actions sent (clicks plus no-ops; 0 for verify or a
      blocked finish).
    blocked: True when H2's check withheld a failing finishing click.
    state: the observed harness state (page state and verified flag), or the
      end state.
    page: the observed page state (None once the episode has ended).
    done: the episode ended on the page.
    raw_reward: the page's raw reward of this step (0 while not done).
    env_reward: the env's (time-decayed) reward of this step.
    reason: the page's reason for ending (e.g. `"timed out"`), if any.
    visible: the element indices the observation lists (None once done).
    missing: elements the action clicks that the page did not show.
    expected_state, expected_page, expected_reward: what the compiled MDP
      predicts.
  """

  action: int
  name: str
  sent: int
  blocked: bool
  state: int
  page: int | None
  done: bool
  raw_reward: float
  env_reward: float
  reason: str | None
  visible: tuple[int, ...] | None
  missing: tuple[int, ...]
  expected_state: int
  expected_page: int | None
  expected_reward: float


@dataclasses.dataclass(frozen=True)
class Replay:
  """A replayed episode: the page's task, the compiled harness and the steps."""

  family: str
  seed: int
  compiled: harnesses_lib.CompiledHarness
  initial_state: int
  initial_visible: tuple[int, ...]
  steps: tuple[Step, ...]


Policy = Callable[[harnesses_lib.CompiledHarness, int, int], int]
"""`policy(compiled, state, t) -> action id`: picks the next action."""


def _action_id(compiled: harnesses_lib.CompiledHarness, action, i: int) -> int:
  names = [a.name for a in compiled.actions]
  if isinstance(action, str):
    if action not in names:
      raise ValueError(f"actions[{i}]: {action!r} is not an action of {compiled} "
                       f"(actions: {names})")
    return names.index(action)
  if not isinstance(action, (int, np.integer)) or isinstance(action, bool):
    raise ValueError(f"actions[{i}]: expected an action id or name, got {action!r}")
  if not 0 <= action < len(names):
    raise ValueError(f"actions[{i}]: action id {action} out of range [0, {len(names)}) "
                     f"for {compiled}")
  return int(action)


def _click(env, ref: int):
  from miniwob.action import ActionTypes
  return env.step(env.unwrapped.create_action(ActionTypes.CLICK_ELEMENT, ref=ref))


def _noop(env):
  from miniwob.action import ActionTypes
  return env.step(env.unwrapped.create_action(ActionTypes.NONE))


def replay(family: str, seed: int, actions: Sequence[int | str] | Policy,
           harness: str | harnesses_lib.HarnessSpec = "H0", *,
           session: BrowserSession | None = None, max_steps: int = 20,
           discount: float = 0.9) -> Replay:
  """Executes semantic actions on the real page of `(family, seed)`.

  The page is reset with `seed`, read as a `Task` and compiled under
  `harness`; each action is then executed on the page as the harness would:
  `wait` is one no-op step, a click is one `CLICK_ELEMENT` on the element
  (matched by its `id`, links by tab and order), a batch sends its clicks in
  order and stops when the episode ends, `verify` sends nothing. With the
  check (H2, H5) a finishing click that would fail is withheld, as the MDP
  models it (the batch stops there).

  Args:
    family: one of `tasks.FAMILIES`.
    seed: the page's seed (`reset(seed=seed)`).
    actions: action ids or names of the compiled harness, or a `Policy`
      choosing each next action from the MDP state the page is in.
    harness: `"H0"` ... `"H5"` or a `HarnessSpec`.
    session: a started `BrowserSession` to reuse (default: a new one, closed
      afterwards).
    max_steps: most actions a `Policy` may take.
    discount: passed to `compile_harness` (does not affect the comparison).

  Returns:
    `Replay`. It stops after the episode ends, when the page leaves the
    predicted path (so later steps would be meaningless), or when the actions
    run out.

  Raises:
    ValueError: unknown family or harness, an out-of-range or unknown action,
      or an action the MDP says is unavailable in the state the page is in.
    BrowserUnavailableError: no usable browser.
  """
  _env_id(family)
  spec = harness if isinstance(harness, harnesses_lib.HarnessSpec) else (
      harnesses_lib.harness_spec(harness))
  if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
    raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")
  if session is None:
    with BrowserSession() as own:
      return replay(family, seed, actions, spec, session=own, max_steps=max_steps,
                    discount=discount)

  obs = session.reset(family, seed)
  env = session.env(family)
  task = page_task(session, family)
  compiled = harnesses_lib.compile_harness(task, spec, discount=discount)
  mdp = compiled.harness.mdp
  transitions = np.asarray(mdp.transitions)
  rewards = np.asarray(mdp.rewards)
  avail = np.asarray(compiled.harness.pi_ref) > 0
  page = read_page_state(session, family)
  state = compiled.state_of(page)
  initial_state = state
  initial_visible = tuple(sorted(visible_elements(task, obs)))

  steps: list[Step] = []
  sequence = None if callable(actions) else list(actions)
  if sequence is not None:
    ids = [_action_id(compiled, a, i) for i, a in enumerate(sequence)]
  limit = len(sequence) if sequence is not None else int(max_steps)
  for t in range(limit):
    if state == compiled.done_state:
      break
    k = ids[t] if sequence is not None else _action_id(compiled, actions(compiled, state, t), t)
    if not avail[state, k]:
      raise ValueError(f"actions[{t}]: {compiled.actions[k].name!r} is not available in state "
                       f"{state} (page state {compiled.page_of_state[state]}) of {compiled}")
    expected_state = int(np.argmax(transitions[state, k]))
    expected_reward = float(rewards[state, k])
    act = compiled.actions[k]
    sent, blocked, done, raw, env_reward, reason, missing = 0, False, False, 0.0, 0.0, None, []
    if act.name == "wait":
      obs, env_reward, done, _, info = _noop(env)
      sent = 1
      page = read_page_state(session, family)
    for e in act.clicks:
      if spec.check and page is not None and e in task.visible(page):
        # The harness's check, on the page as it is now.
        nxt, reward = task.click(page, e)
        if nxt is None and reward < tasks_lib.SUCCESS_REWARD:
          blocked = True
          break
      refs = visible_elements(task, obs)
      if e not in refs:
        missing.append(e)
        break
      obs, env_reward, done, _, info = _click(env, refs[e])
      sent += 1
      page = read_page_state(session, family)
      if done:
        break
    if sent == 0:  # verify or a blocked finish: the page may still have timed out
      page = read_page_state(session, family)
    if page is None and not done:  # ended on its own (timer) between steps
      info = env.unwrapped.instance.get_metadata()
      done, env_reward = True, info["env_reward"]
    if done:
      raw = float(info["raw_reward"])
      reason = info.get("reason")
    verified = act.name == "verify"
    state = compiled.state_of(page, verified)
    visible = None if page is None else tuple(sorted(visible_elements(task, obs)))
    steps.append(Step(action=k, name=act.name, sent=sent, blocked=blocked, state=state,
                      page=page, done=page is None, raw_reward=raw,
                      env_reward=float(env_reward), reason=reason, visible=visible,
                      missing=tuple(missing), expected_state=expected_state,
                      expected_page=(None if expected_state == compiled.done_state
                                     else int(compiled.page_of_state[expected_state])),
                      expected_reward=expected_reward))
    if state != expected_state:
      break
  return Replay(family=family, seed=int(seed), compiled=compiled, initial_state=initial_state,
                initial_visible=initial_visible, steps=tuple(steps))


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Disagreement:
  """A place where the real page and the compiled MDP differ.

  Attributes:
    family, seed, harness: the episode.
    sequence: `"random-<k>"` or `"optimal"`.
    step: index of the semantic action (-1: the initial page).
    actions: the action names executed up to and including `step`.
    field: what differs (`"state"`, `"raw_reward"`, `"env_reward_sign"`,
      `"visible"`, `"clickable"`, `"reachable"`, `"timed_out"`).
    expected, observed: the MDP's and the page's values.
  """

  family: str
  seed: int
  harness: str
  sequence: str
  step: int
  actions: tuple[str, ...]
  field: str
  expected: Any
  observed: Any

  def __str__(self):
    return (f"{self.family} seed={self.seed} {self.harness} {self.sequence} step {self.step} "
            f"after {list(self.actions)}: {self.field} expected {self.expected!r}, observed "
            f"{self.observed!r}")


def reachable_states(compiled: harnesses_lib.CompiledHarness) -> frozenset[int]:
  """States of the compiled MDP reachable from its initial state."""
  p = np.asarray(compiled.harness.mdp.transitions)
  avail = np.asarray(compiled.harness.pi_ref) > 0
  start = compiled.state_of(compiled.task.initial_state)
  seen, frontier = {start}, [start]
  while frontier:
    s = frontier.pop()
    for k in np.flatnonzero(avail[s]):
      for s2 in np.flatnonzero(p[s, k] > 0):
        if int(s2) not in seen:
          seen.add(int(s2))
          frontier.append(int(s2))
  return frozenset(seen)


def compare(result: Replay, *, sequence: str = "") -> list[Disagreement]:
  """The disagreements between a `Replay` and its compiled MDP."""
  compiled, task = result.compiled, result.compiled.task
  reachable = reachable_states(compiled)
  out: list[Disagreement] = []

  def report(step, field, expected, observed):
    names = tuple(s.name for s in result.steps[:step + 1])
    out.append(Disagreement(result.family, result.seed, compiled.spec.name, sequence, step,
                            names, field, expected, observed))

  start = compiled.state_of(task.initial_state)
  if result.initial_state != start:
    report(-1, "state", start, result.initial_state)
  if result.initial_visible != task.visible(task.initial_state):
    report(-1, "visible", task.visible(task.initial_state), result.initial_visible)
  for t, s in enumerate(result.steps):
    if s.reason == "timed out":
      # MiniWoB++ ends an episode after 10 s of wall time: a slow machine, not the model.
      report(t, "timed_out", "episode within 10 s", s.reason)
    if s.missing:
      report(t, "clickable", "every clicked element on the page", f"missing {list(s.missing)}")
    if s.state not in reachable:
      report(t, "reachable", sorted(reachable), s.state)
    if s.state != s.expected_state:
      report(t, "state", (s.expected_page, s.expected_state), (s.page, s.state))
    if abs(s.raw_reward - s.expected_reward) > 1e-6:
      report(t, "raw_reward", s.expected_reward, s.raw_reward)
    if np.sign(s.env_reward) != np.sign(s.raw_reward):
      report(t, "env_reward_sign", float(np.sign(s.raw_reward)), s.env_reward)
    if s.page is not None and s.visible != task.visible(s.page):
      report(t, "visible", task.visible(s.page), s.visible)
  return out


def random_policy(rng: np.random.Generator) -> Policy:
  """Uniform over the actions available in the current MDP state."""
  def policy(compiled, state, t):
    del t
    avail = np.flatnonzero(np.asarray(compiled.harness.pi_ref)[state] > 0)
    return int(rng.choice(avail))
  return policy


def _bucket(n: int) -> int:
  return max(8, 1 << (int(n) - 1).bit_length())


def soft_optimal_policy(compiled: harnesses_lib.CompiledHarness, tau: float) -> np.ndarray:
  """`hx.solve_soft_bellman(mdp, pi_ref, tau).policy` of a compiled harness, `[S, A]`.

  The MDP is padded to power-of-two sizes first (extra states absorbing and
  unreachable, extra actions unavailable), which leaves the policy on the
  real states unchanged and lets the solver's compiled loop be reused across
  task instances instead of compiled once per shape.
  """
  from harnax.core import mdp as mdp_lib
  from harnax.core import solvers
  mdp = compiled.harness.mdp
  p = np.asarray(mdp.transitions)
  r = np.asarray(mdp.rewards)
  pi_ref = np.asarray(compiled.harness.pi_ref)
  s, a = r.shape
  s_pad, a_pad = _bucket(s), _bucket(a)
  p_big = np.zeros((s_pad, a_pad, s_pad), p.dtype)
  p_big[:s, :a, :s] = p
  for st in range(s_pad):  # padded actions and states: self-loops
    p_big[st, a if st < s else 0:, st] = 1.0
  r_big = np.zeros((s_pad, a_pad), r.dtype)
  r_big[:s, :a] = r
  ref_big = np.zeros((s_pad, a_pad), pi_ref.dtype)
  ref_big[:s, :a] = pi_ref
  ref_big[s:, 0] = 1.0
  mu0 = np.zeros(s_pad, r.dtype)
  mu0[:s] = np.asarray(mdp.initial)
  big = mdp_lib.TabularMDP(transitions=p_big, rewards=r_big, discount=mdp.discount, initial=mu0)
  # Value iteration: its loop compiles faster than policy iteration's, which
  # dominates here (one compile per padded shape).
  sol = solvers.solve_soft_bellman(big, ref_big, tau, method="value_iteration")
  return np.asarray(sol.policy)[:s, :a]


def optimal_policy(tau: float = 0.05) -> Policy:
  """Greedy in the soft-optimal policy at temperature `tau` (`soft_optimal_policy`)."""
  cache: dict[int, np.ndarray] = {}

  def policy(compiled, state, t):
    del t
    if id(compiled) not in cache:
      cache.clear()
      cache[id(compiled)] = soft_optimal_policy(compiled, tau)
    return int(np.argmax(cache[id(compiled)][state]))
  return policy


def validate(family: str, seeds: Sequence[int], num_random_sequences: int = 2, *,
             harnesses: Sequence[str] = harnesses_lib.HARNESSES, sequence_seed: int = 0,
             max_steps: int = 8, tau: float = 0.05, session: BrowserSession | None = None,
             replays: list | None = None) -> list[Disagreement]:
  """Replays random and optimal action sequences and lists every disagreement.

  For each seed and harness: `num_random_sequences` episodes choosing
  uniformly among the available actions (NumPy generator seeded by
  `[sequence_seed, seed, harness index, k]`) for at most `max_steps` actions,
  and one episode greedy in the soft-optimal policy at temperature `tau`.
  Compared per step (`compare`): the harness state (page state and verified
  flag), the raw reward, the sign of the env reward, the elements the page
  shows, and that every observed state is reachable in the MDP.

  Args:
    family: one of `tasks.FAMILIES`.
    seeds: page seeds.
    num_random_sequences: random episodes per seed and harness.
    harnesses: harness names.
    sequence_seed: seed of the random sequences.
    max_steps: most actions per episode.
    tau: temperature of the optimal policy.
    session: a `BrowserSession` to reuse (default: one for this call).
    replays: if given, every `Replay` is appended to it (for counting).

  Returns:
    A list of `Disagreement` (empty: page and MDP agree).
  """
  tasks_lib.task_type(family)
  names = [harnesses_lib.harness_spec(h).name for h in harnesses]
  if not isinstance(num_random_sequences, (int, np.integer)) or num_random_sequences < 0:
    raise ValueError(f"num_random_sequences: expected a non-negative int, got "
                     f"{num_random_sequences!r}")
  if session is None:
    with BrowserSession() as own:
      return validate(family, seeds, num_random_sequences, harnesses=names,
                      sequence_seed=sequence_seed, max_steps=max_steps, tau=tau, session=own,
                      replays=replays)
  out: list[Disagreement] = []
  for seed in seeds:
    for h in names:
      runs = [(f"random-{k}", random_policy(np.random.default_rng(
          [sequence_seed, int(seed), harnesses_lib.HARNESSES.index(h), k])))
              for k in range(num_random_sequences)]
      runs.append(("optimal", optimal_policy(tau)))
      for label, policy in runs:
        result = replay(family, seed, policy, h, session=session, max_steps=max_steps)
        if replays is not None:
          replays.append(result)
        out += compare(result, sequence=label)
  return out
