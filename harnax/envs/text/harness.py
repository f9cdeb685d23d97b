"""The text-game harness of HAD: state tracking and action monitoring around a `TextGame`.

Two components, each switchable (docs/text_harness.md):

* **State tracking**: a :class:`~harnax.envs.text.record.Record` of what the agent has observed,
  rendered into its context.
* **Action monitoring**: an action the game would not accept is rejected with feedback instead
  of being executed; unproductive loops are detected and reported.

The harness always computes everything (the record, the verdict on every action, the loop
status): switching a component off only changes what the agent's context shows and, for
monitoring, whether a rejected action is executed. So the per-turn quantities of the HAD
metrics (accepted, consistent with the record, stalled; `harnax.studies.text_metrics`) exist in
every evaluation setting.

  game = HarnessedGame(alfworld.make(task), HarnessConfig(action_monitoring=True))
  obs, info = game.reset()
  obs, reward, terminated, truncated, info = game.step("go to countertop 1")
  info["harness"]["accepted"], info["harness"]["stalled"]
  game.context()                                        # with the enabled components
  game.context(state_tracking=False, action_monitoring=False)   # the same state, bare
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from harnax.envs.text import observers
from harnax.envs.text.record import GAMES
from harnax.envs.text.record import Record

FEEDBACK_OPEN, FEEDBACK_CLOSE = "<harness_feedback>", "</harness_feedback>"
STATE_OPEN, STATE_CLOSE = "<harness_state>", "</harness_state>"
# Removing every match of this pattern from a context rendered with the harness gives the same
# context rendered without it.
HARNESS_BLOCK = re.compile(r"<harness_(feedback|state)>.*?</harness_\1>\n", re.S)


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
  """Which harness components the agent gets, and the loop detector's windows.

  Attributes:
    state_tracking: render the record into the context.
    action_monitoring: reject invalid actions (not executed) and show the monitor's feedback
      (rejections, loop reports) in the context.
    loop_window: turns (>= 2) in which the same transition — same record and location, same
      action, same outcome — seen again counts as a cycle.
    stall_window: consecutive turns (>= 2) without progress (nothing newly observed, no score
      gain, no new game text) that count as stalled.
    max_suggestions: admissible actions listed in a rejection's feedback (>= 0).
    max_turns: end the episode (truncated) after this many turns, rejected ones included;
      None: only the game's own limit.
  """

  state_tracking: bool = True
  action_monitoring: bool = True
  loop_window: int = 20
  stall_window: int = 10
  max_suggestions: int = 8
  max_turns: int | None = None

  def __post_init__(self):
    for name in ("state_tracking", "action_monitoring"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
    for name, low in (("loop_window", 2), ("stall_window", 2), ("max_suggestions", 0)):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    if self.max_turns is not None and (not isinstance(self.max_turns, int)
                                       or self.max_turns < 1):
      raise ValueError(f"max_turns: expected None or a positive int, got {self.max_turns!r}")


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The action monitor's decision on one action.

  Attributes:
    accepted: the game would accept the action here.
    reason: why not (None when accepted).
    feedback: the text shown to the agent when it is rejected (None when accepted).
  """

  accepted: bool
  reason: str | None = None
  feedback: str | None = None


@dataclasses.dataclass(frozen=True)
class LoopStatus:
  """The loop detector after a turn.

  Attributes:
    stalled: the agent is in an unproductive loop now.
    kind: "cycle" (a transition repeated within the loop window), "no_progress" (nothing new
      for the stall window), or None.
    report: the sentence shown to the agent (None when not stalled).
  """

  stalled: bool = False
  kind: str | None = None
  report: str | None = None


class Harness:
  """The harness of one game: record, action monitor, loop detector.

  Args:
    game: "alfworld" or "scienceworld" (selects the text parsers).
    config: the :class:`HarnessConfig`.
  """

  def __init__(self, game: str, config: HarnessConfig | None = None):
    if game not in GAMES:
      raise ValueError(f"game: expected one of {GAMES}, got {game!r}")
    config = HarnessConfig() if config is None else config
    if not isinstance(config, HarnessConfig):
      raise ValueError(f"config: expected a HarnessConfig, got {type(config).__name__}")
    self.game = game
    self.config = config
    self.record = Record(game)
    self.admissible: tuple[str, ...] | None = None
    self.status = LoopStatus()
    self._transitions: list[tuple] = []
    self._outcomes: set[str] = set()
    self._last = ""
    self._idle = 0
    self._score = 0.0

  def reset(self, observation: str, info: dict | None = None):
    """Starts an episode from the game's opening `observation` and `info`."""
    info = info or {}
    self.record = Record(self.game, goal=str(info.get("goal") or ""))
    observers.update(self.record, None, observation)
    self.status = LoopStatus()
    self._transitions = []
    self._outcomes = {_squash(observation)}
    self._last = _squash(observation)
    self._idle = 0
    self._score = float(info.get("score", 0.0))
    self.admissible = _admissible(info)

  def check(self, action: str) -> Verdict:
    """The monitor's verdict on `action` in the current state.

    With the game's admissible commands known, ALFWorld's list is authoritative; ScienceWorld's
    engine also accepts phrasings its list does not hold, so an action outside it is checked
    against the grammar (:func:`observers.parse_check`). Without the list, the grammar check
    decides.
    """
    text = observers.normalize(action)
    if not text:
      return self._reject(action, "the action is empty")
    vocabulary = None
    if self.admissible is not None:
      if text in {observers.normalize(a) for a in self.admissible}:
        return Verdict(True)
      if self.game == "alfworld":
        reason = (self.record.contradiction(text)
                  or observers.parse_check(self.game, text, self.record)
                  or "it is not a valid command in this state")
        return self._reject(action, reason)
      vocabulary = frozenset(w for a in self.admissible for w in observers.normalize(a).split())
    reason = observers.parse_check(self.game, text, self.record, vocabulary)
    return Verdict(True) if reason is None else self._reject(action, reason)

  def _reject(self, action: str, reason: str) -> Verdict:
    feedback = f'Rejected "{action.strip()}": {reason}. It was not executed.'
    suggestions = self.suggestions(action)
    if suggestions:
      feedback += " Valid actions here include: " + "; ".join(suggestions) + "."
    return Verdict(False, reason, feedback)

  def suggestions(self, action: str) -> list[str]:
    """Up to `max_suggestions` admissible actions, those sharing most words with `action` first."""
    if not self.admissible or not self.config.max_suggestions:
      return []
    words = set(observers.normalize(action).split())
    ranked = sorted(enumerate(self.admissible),
                    key=lambda ia: (-len(words & set(observers.normalize(ia[1]).split())), ia[0]))
    return [a for _, a in ranked[:self.config.max_suggestions]]

  def observe(self, action: str, observation: str, info: dict | None = None, *,
              executed: bool = True) -> LoopStatus:
    """Takes in one turn: `action` and the game's `observation` (or, when the monitor rejected
    the action and it was not `executed`, the game's answer to an invalid command)."""
    info = info or {}
    before = self.record.fingerprint()
    knowledge = self.record.fingerprint(with_location=False)
    self.record.turn += 1
    if executed:
      observers.update(self.record, action, observation)
    outcome = _squash(observation)
    score = float(info.get("score", self._score))
    progress = (self.record.fingerprint(with_location=False) != knowledge
                or score > self._score or outcome not in self._outcomes)
    self._score = max(self._score, score)
    self._outcomes.add(outcome)
    self._idle = 0 if progress else self._idle + 1
    # The situation an action is taken in is the record and the text the agent just read
    # (a thermometer's changing reading makes "examine water" a new situation each time).
    key = (before, self._last, observers.normalize(action), outcome)
    self._last = outcome
    turn = self.record.turn
    recent = [t for k, t in self._transitions if k == key and turn - t < self.config.loop_window]
    self._transitions.append((key, turn))
    if executed:
      self.admissible = _admissible(info) if "admissible" in info else self.admissible
      self.record.see_commands(self.admissible)
    if recent:
      report = (f'Loop detected: "{action.strip()}" in the same situation gave the same result '
                f"at turn {recent[-1]}; repeating it will not help.")
      self.status = LoopStatus(True, "cycle", report + self._hint())
    elif self._idle >= self.config.stall_window:
      report = (f"No progress in the last {self._idle} turns: nothing new was observed and "
                f"the score did not rise.")
      self.status = LoopStatus(True, "no_progress", report + self._hint())
    else:
      self.status = LoopStatus()
    return self.status

  def _hint(self) -> str:
    rec = self.record
    unvisited = sorted(p for p, v in rec.places.items() if not v.visited)
    closed = sorted(n for n, s in rec.openness.items() if s == "closed")
    parts = []
    if unvisited:
      parts.append("not visited yet: " + ", ".join(unvisited[:6]))
    if closed:
      parts.append("closed, not looked into: " + ", ".join(closed[:6]))
    return (" Try something new (" + "; ".join(parts) + ").") if parts else " Try something new."


def _squash(text: str) -> str:
  return " ".join(text.split())


def _admissible(info: dict) -> tuple[str, ...] | None:
  admissible = info.get("admissible")
  return None if admissible is None else tuple(admissible)


@dataclasses.dataclass(frozen=True)
class Turn:
  """One turn of a harnessed episode.

  Attributes:
    action: the agent's action, as written.
    observation: what the game showed: its answer when the action was executed, its answer to
      an invalid command when the monitor rejected it (the game never saw it).
    feedback: the action monitor's text for this turn (a rejection's explanation and/or a loop
      report), or None. Shown only with action monitoring on.
    accepted: the monitor's verdict.
    executed: the action reached the game.
    contradiction: why the action contradicted the record before it, or None.
    stalled: the loop detector's status after the turn.
  """

  action: str
  observation: str
  feedback: str | None = None
  accepted: bool = True
  executed: bool = True
  contradiction: str | None = None
  stalled: bool = False

  @property
  def consistent(self) -> bool:
    return self.contradiction is None


def render_context(goal: str, turns: Sequence[Turn], record: Record | None, *,
                   opening: str = "", state_tracking: bool = True,
                   action_monitoring: bool = True, window: int | None = None) -> str:
  """The agent's context: task, opening text, turns, and the enabled harness parts.

  A pure function of its arguments. Harness parts are whole blocks: each turn's monitor feedback
  in ``<harness_feedback>…</harness_feedback>\\n`` after its observation, the record in
  ``<harness_state>…</harness_state>\\n`` at the end. With a component off its blocks are left
  out and nothing else changes, so deleting the blocks (:data:`HARNESS_BLOCK`) from a rendering
  with the harness gives the rendering without it.

  Args:
    goal: the task text.
    turns: the episode so far.
    record: the harness record at this point (needed when `state_tracking`).
    opening: the game's opening observation.
    state_tracking: render the record.
    action_monitoring: render the monitor's feedback.
    window: show only the last `window` turns (None: all). A small model's context stays
      short; the record keeps what the earlier turns showed.
  """
  if state_tracking and record is None:
    raise ValueError("record: expected a Record when state_tracking is on, got None")
  if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                             or window < 0):
    raise ValueError(f"window: expected None or an int >= 0, got {window!r}")
  parts = []
  opening = opening.strip()
  if goal and goal not in opening:
    parts.append(f"Your task is to: {goal}\n")
  if opening:
    parts.append(opening + "\n")
  for i, turn in enumerate(turns):
    if not isinstance(turn, Turn):
      raise ValueError(f"turns[{i}]: expected a Turn, got {type(turn).__name__}")
  shown = list(turns) if window is None else (list(turns)[-window:] if window else [])
  for turn in shown:
    parts.append(f"> {turn.action.strip()}\n{turn.observation.strip()}\n")
    if action_monitoring and turn.feedback:
      parts.append(f"{FEEDBACK_OPEN}{turn.feedback}{FEEDBACK_CLOSE}\n")
  if state_tracking:
    parts.append(f"{STATE_OPEN}\n{record.render()}\n{STATE_CLOSE}\n")
  return "".join(parts)


class HarnessedGame:
  """A :class:`~harnax.envs.text.base.TextGame` played through the harness.

  `step` asks the monitor first; with action monitoring on, a rejected action is not executed
  (the game's state does not change) but still counts as a turn, and its observation is the
  game's own answer to an invalid command. `info["harness"]` carries the turn's verdict
  (``accepted``, ``reason``, ``feedback``), ``executed``, ``consistent`` and ``contradiction``
  (against the record before the action), ``stalled``, ``loop`` (the kind) and
  ``loop_report``. `turns` and `records` (the record after the reset and after every turn)
  keep the episode, so the context of any past state can be rendered (`context_at`).

  Args:
    env: the game (`env.task.game` selects the parsers).
    config: the :class:`HarnessConfig`.
  """

  def __init__(self, env, config: HarnessConfig | None = None):
    game = getattr(getattr(env, "task", None), "game", None)
    if game not in GAMES:
      raise ValueError(f"env: expected a TextGame whose task.game is one of {GAMES}, got "
                       f"{game!r}")
    self.env = env
    self.task = env.task
    self.harness = Harness(game, config)
    self.config = self.harness.config
    self.goal = ""
    self.opening = ""
    self.turns: list[Turn] = []
    self.records: list[Record] = []
    self._info: dict = {}
    self._done = False

  @property
  def record(self) -> Record:
    return self.harness.record

  def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
    obs, info = self.env.reset(seed=seed, options=options)
    self.harness.reset(obs, info)
    self.goal = info.get("goal", "")
    self.opening = obs
    self.turns = []
    self.records = [self.record.copy()]
    self._info = dict(info)
    self._done = False
    return obs, dict(info, harness=None)

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    if not self.records:
      raise RuntimeError("step: call reset() first")
    if self._done:
      raise RuntimeError("step: the episode is over; call reset()")
    if not isinstance(action, str):
      raise ValueError(f"action: expected a str command, got {type(action).__name__}")
    verdict = self.harness.check(action)
    contradiction = self.record.contradiction(action)
    executed = verdict.accepted or not self.config.action_monitoring
    if executed:
      obs, reward, terminated, truncated, info = self.env.step(action)
    else:
      obs, reward, terminated, truncated = observers.INVALID_RESPONSE[self.harness.game], 0.0, \
          False, False
      info = dict(self._info)
    status = self.harness.observe(action, obs, info, executed=executed)
    feedback = " ".join(t for t in (verdict.feedback, status.report) if t) or None
    self.turns.append(Turn(action, obs, feedback, verdict.accepted, executed, contradiction,
                           status.stalled))
    self.records.append(self.record.copy())
    if self.config.max_turns is not None and len(self.turns) >= self.config.max_turns:
      truncated = truncated or not terminated
    self._done = terminated or truncated
    self._info = dict(info)
    info = dict(info, harness={
        "accepted": verdict.accepted, "reason": verdict.reason, "feedback": feedback,
        "executed": executed, "consistent": contradiction is None,
        "contradiction": contradiction, "stalled": status.stalled, "loop": status.kind,
        "loop_report": status.report})
    return obs, float(reward), bool(terminated), bool(truncated), info

  def context(self, *, state_tracking: bool | None = None,
              action_monitoring: bool | None = None, window: int | None = None) -> str:
    """The agent's context now (components default to the config's; `window`: the last
    turns shown, None for all)."""
    return self.context_at(len(self.turns), state_tracking=state_tracking,
                           action_monitoring=action_monitoring, window=window)

  def context_at(self, t: int, *, state_tracking: bool | None = None,
                 action_monitoring: bool | None = None, window: int | None = None) -> str:
    """The agent's context before turn `t` (0: right after the reset)."""
    if not isinstance(t, int) or not 0 <= t <= len(self.turns):
      raise ValueError(f"t: expected an int in [0, {len(self.turns)}], got {t!r}")
    st = self.config.state_tracking if state_tracking is None else state_tracking
    am = self.config.action_monitoring if action_monitoring is None else action_monitoring
    return render_context(self.goal, self.turns[:t], self.records[t], opening=self.opening,
                          state_tracking=st, action_monitoring=am, window=window)

  def expert_plan(self) -> list[str]:
    return self.env.expert_plan()

  def close(self) -> None:
    self.env.close()
