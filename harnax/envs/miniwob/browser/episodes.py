"""Replaying semantic actions of a compiled harness on the real page.

An episode starts with `start_episode` (reset the page with a seed, read the
task it shows, compile it under the harness) and is played by `play_episode`
(execute each semantic action on the page as the harness does, and record per
step what the page did next to what the MDP predicts). `replay` does both.
Splitting them lets a caller build a policy from the compiled harness before
the first action (as `validate` does with the soft-optimal policy). How each
semantic action reaches the page: docs/browser.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob import tasks as tasks_lib
from harnax.envs.miniwob.browser import page as page_lib
from harnax.envs.miniwob.browser import session as session_lib


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


@dataclasses.dataclass(frozen=True)
class EpisodeStart:
  """A page just reset and read, its task compiled: the input of `play_episode`.

  It describes the page as it is right after `start_episode`, so it is played
  at once and once; `play_episode` refuses it after another reset of the
  family's page.

  Attributes:
    session: the `BrowserSession` whose page it is.
    family, seed: the episode.
    compiled: the `CompiledHarness` of the task the page shows.
    obs: the observation returned by the reset.
    resets: `session.resets(family)` right after that reset.
  """

  session: session_lib.BrowserSession
  family: str
  seed: int
  compiled: harnesses_lib.CompiledHarness
  obs: Any
  resets: int


def _harness_spec(harness: str | harnesses_lib.HarnessSpec) -> harnesses_lib.HarnessSpec:
  return harness if isinstance(harness, harnesses_lib.HarnessSpec) else (
      harnesses_lib.harness_spec(harness))


def _check_max_steps(max_steps):
  if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
    raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")


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


def start_episode(family: str, seed: int,
                  harness: str | harnesses_lib.HarnessSpec = "H0", *,
                  session: session_lib.BrowserSession,
                  discount: float = 0.9) -> EpisodeStart:
  """Resets the page of `(family, seed)`, reads its task and compiles it under `harness`.

  Args:
    family: one of `tasks.FAMILIES`.
    seed: the page's seed (`reset(seed=seed)`).
    harness: `"H0"` ... `"H5"` or a `HarnessSpec`.
    session: the started `BrowserSession` whose page to use.
    discount: passed to `compile_harness` (does not affect the comparison).

  Returns:
    `EpisodeStart`, to pass to `play_episode` before anything else resets
    the page.

  Raises:
    ValueError: unknown family or harness, or a bad seed.
    BrowserUnavailableError: no usable browser.
  """
  tasks_lib.task_type(family)
  spec = _harness_spec(harness)
  obs = session.reset(family, seed)
  task = page_lib.page_task(session, family)
  compiled = harnesses_lib.compile_harness(task, spec, discount=discount)
  return EpisodeStart(session=session, family=family, seed=int(seed), compiled=compiled,
                      obs=obs, resets=session.resets(family))


def play_episode(start: EpisodeStart, actions: Sequence[int | str] | Policy, *,
                 max_steps: int = 20) -> Replay:
  """Executes semantic actions on the page of a just-started episode.

  Each action is executed as the harness would: `wait` is one no-op step, a
  click is one `CLICK_ELEMENT` on the element (matched by its `id`, links by
  tab and order), a batch sends its clicks in order and stops when the
  episode ends, `verify` sends nothing. With the check (H2, H5) a finishing
  click that would fail is withheld, as the MDP models it (the batch stops
  there).

  Args:
    start: from `start_episode`, with no reset of the page since.
    actions: action ids or names of `start.compiled`, or a `Policy`
      choosing each next action from the MDP state the page is in.
    max_steps: most actions a `Policy` may take.

  Returns:
    `Replay`. It stops after the episode ends, when the page leaves the
    predicted path (so later steps would be meaningless), or when the actions
    run out.

  Raises:
    ValueError: an out-of-range or unknown action, an action the MDP says is
      unavailable in the state the page is in, a bad `max_steps`, or a `start`
      whose page has been reset since.
  """
  _check_max_steps(max_steps)
  session, family, compiled = start.session, start.family, start.compiled
  if session.resets(family) != start.resets:
    raise ValueError(f"start: the {family} page was reset after this episode started "
                     f"(seed {start.seed}); start it again with start_episode")
  task, spec, obs = compiled.task, compiled.spec, start.obs
  env = session.env(family)
  mdp = compiled.harness.mdp
  transitions = np.asarray(mdp.transitions)
  rewards = np.asarray(mdp.rewards)
  avail = np.asarray(compiled.harness.pi_ref) > 0
  page = page_lib.read_page_state(session, family)
  state = compiled.state_of(page)
  initial_state = state
  initial_visible = tuple(sorted(page_lib.visible_elements(task, obs)))

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
      obs, env_reward, done, _, info = page_lib.no_op(env)
      sent = 1
      page = page_lib.read_page_state(session, family)
    for e in act.clicks:
      if spec.check and page is not None and e in task.visible(page):
        # The harness's check, on the page as it is now.
        nxt, reward = task.click(page, e)
        if nxt is None and reward < tasks_lib.SUCCESS_REWARD:
          blocked = True
          break
      refs = page_lib.visible_elements(task, obs)
      if e not in refs:
        missing.append(e)
        break
      obs, env_reward, done, _, info = page_lib.click_element(env, refs[e])
      sent += 1
      page = page_lib.read_page_state(session, family)
      if done:
        break
    if sent == 0:  # verify or a blocked finish: the page may still have timed out
      page = page_lib.read_page_state(session, family)
    if page is None and not done:  # ended on its own (timer) between steps
      info = env.unwrapped.instance.get_metadata()
      done, env_reward = True, info["env_reward"]
    if done:
      raw = float(info["raw_reward"])
      reason = info.get("reason")
    verified = act.name == "verify"
    state = compiled.state_of(page, verified)
    visible = None if page is None else tuple(sorted(page_lib.visible_elements(task, obs)))
    steps.append(Step(action=k, name=act.name, sent=sent, blocked=blocked, state=state,
                      page=page, done=page is None, raw_reward=raw,
                      env_reward=float(env_reward), reason=reason, visible=visible,
                      missing=tuple(missing), expected_state=expected_state,
                      expected_page=(None if expected_state == compiled.done_state
                                     else int(compiled.page_of_state[expected_state])),
                      expected_reward=expected_reward))
    if state != expected_state:
      break
  return Replay(family=family, seed=start.seed, compiled=compiled, initial_state=initial_state,
                initial_visible=initial_visible, steps=tuple(steps))


def replay(family: str, seed: int, actions: Sequence[int | str] | Policy,
           harness: str | harnesses_lib.HarnessSpec = "H0", *,
           session: session_lib.BrowserSession | None = None, max_steps: int = 20,
           discount: float = 0.9) -> Replay:
  """Executes semantic actions on the real page of `(family, seed)`.

  `start_episode` then `play_episode`: the page is reset with `seed`, read as
  a `Task` and compiled under `harness`; each action is then executed on the
  page as the harness would (see `play_episode`).

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
  tasks_lib.task_type(family)
  spec = _harness_spec(harness)
  _check_max_steps(max_steps)
  if session is None:
    with session_lib.BrowserSession() as own:
      return replay(family, seed, actions, spec, session=own, max_steps=max_steps,
                    discount=discount)
  start = start_episode(family, seed, spec, session=session, discount=discount)
  return play_episode(start, actions, max_steps=max_steps)
