"""Gymnasium environments over the compiled MiniWoB++ task families.

One environment per (family, harness), registered when `harnax.envs` is
imported:

  harnax/click-checkboxes-H0-v0 ... harnax/click-tab-2-H5-v0   (3 x 6 = 18 ids)

  env = gymnasium.make("harnax/click-option-H2-v0", reverse_fields=True)
  obs, info = env.reset(seed=7)     # the page tasks.sample_task(family, 7)

Each reset draws a task instance (a page) and compiles it under the harness;
a step executes one semantic action of that `CompiledHarness` exactly as its
MDP does and returns MiniWoB++'s raw reward.

* Observation: the harness's text (`CompiledHarness.observation`), a
  `gymnasium.spaces.Text` whose charset and `max_length` cover every instance
  of the family (computed from the largest pages the family can draw).
* Action: `Discrete(n)` with `n` the family's largest action count under the
  harness (`max_num_actions`); id `k` is the instance's semantic action
  `k` (`info["action_names"][k]`; 0 is `wait`). An id in `[0, n)` that is not
  available now (not offered in this state, or beyond this instance's actions)
  executes as the no-op `wait` and reports `info["valid"] = False`;
  `info["action_mask"]` (int8 `[n]`, gymnasium's convention) marks the
  available ids. An id outside `[0, n)` raises `ValueError`.
* Episodes terminate at the harness's end state and are truncated after
  `max_episode_steps` (registered as `MAX_EPISODE_STEPS`; `gymnasium.make`
  may override it).

Instances: with `task=` every episode uses that instance; with
`split="train"|"test"` resets draw from `tasks.task_split(family, num_train,
num_test, seed=split_seed)`, so held-out pages are usable; otherwise
`reset(seed=s)` uses `tasks.sample_task(family, s)` and an unseeded reset a
seed drawn from the environment's generator. `reset(options=...)` accepts
`{"task": Task}` or `{"task_index": i}` (into the split) for one episode.

`env.unwrapped.compiled` is the current `CompiledHarness` (its `.harness.mdp`
gives the exact ceiling and values for the episode's page).
"""

from __future__ import annotations

import functools
import string
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from harnax.envs.miniwob import harnesses as harness_lib
from harnax.envs.miniwob import tasks as tasks_lib

MAX_EPISODE_STEPS = 20
NAMESPACE = "harnax"
VERSION = 0
SPLITS = ("train", "test")
CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"
"""Characters of observation texts (labels are alphanumeric; the rest is ours)."""

_ENTRY_POINT = "harnax.envs.miniwob.gym_env:MiniWoBEnv"
# Longest label a sampled page draws (tasks._random_label: 2 to 8 characters).
_MAX_LABEL = "X" * 8


def env_id(family: str, harness: str) -> str:
  """The registered id of `family` under `harness`, e.g. `harnax/click-option-H1-v0`."""
  _check_names(family, harness)
  return f"{NAMESPACE}/{family}-{harness}-v{VERSION}"


ENV_IDS = tuple(f"{NAMESPACE}/{f}-{h}-v{VERSION}" for f in tasks_lib.FAMILIES
                for h in harness_lib.HARNESSES)
"""Every registered id, families outer, harnesses inner."""


def register_envs() -> tuple[str, ...]:
  """Registers every (family, harness) environment with gymnasium (idempotent).

  Returns:
    `ENV_IDS`.
  """
  for family in tasks_lib.FAMILIES:
    for harness in harness_lib.HARNESSES:
      name = env_id(family, harness)
      if name not in gymnasium.registry:
        gymnasium.register(id=name, entry_point=_ENTRY_POINT,
                           kwargs=dict(family=family, harness=harness),
                           max_episode_steps=MAX_EPISODE_STEPS)
  return ENV_IDS


def _check_names(family: str, harness: str) -> None:
  if family not in tasks_lib.FAMILIES:
    raise ValueError(f"family: expected one of {tasks_lib.FAMILIES}, got {family!r}")
  if harness not in harness_lib.HARNESSES:
    raise ValueError(f"harness: expected one of {harness_lib.HARNESSES}, got {harness!r}")


def _largest_pages(family: str) -> tuple[tasks_lib.Task, ...]:
  """Instances that attain the family's largest action count and observation.

  Every action count and observation length grows with the number of elements
  and the label lengths; what remains is which state maximizes the notes, and
  the observation bound takes the maximum over all states of these pages.
  """
  labels = tuple(_MAX_LABEL[:-1] + str(i) for i in range(6))
  if family == "click-checkboxes":
    # All boxes named: the longest instruction; state 0 then also has the
    # longest statuses ("unchecked") and check message ("6 boxes differ").
    return (tasks_lib.CheckboxesTask(labels=labels, targets=(True,) * 6),)
  if family == "click-option":
    return (tasks_lib.OptionTask(labels=labels, answer=0),)
  # click-tab-2: 20 links in every tab (two-digit ids in the last one). The
  # longest word is the only 6-letter one; a 5-letter target missing from the
  # open tab trades a shorter instruction for the longer "is not in" message.
  longest = max(tasks_lib._WORDS, key=len)
  shorter = max((w for w in tasks_lib._WORDS if len(w) < len(longest)), key=len)
  full = (longest,) * 20
  return (tasks_lib.TabsTask(links=(full, full, full), target=longest),
          tasks_lib.TabsTask(links=((shorter,) * 20, (shorter,) * 20, full), target=shorter))


@functools.cache
def max_num_actions(family: str, harness: str) -> int:
  """The largest number of semantic actions of any `family` instance under `harness`.

  E.g. click-checkboxes: `1 + 7` clicks (6 boxes and Submit) under H0, plus the
  57 batches of >= 2 boxes under H1, plus `verify` under H3 / H5.
  """
  _check_names(family, harness)
  return max(len(harness_lib.compile_harness(t, harness).actions)
             for t in _largest_pages(family))


@functools.cache
def max_observation_length(family: str, harness: str) -> int:
  """The longest observation text of any `family` instance under `harness` (characters).

  Field order does not change the length, so this holds for `reverse_fields` too.
  """
  _check_names(family, harness)
  return max(_longest_observation(harness_lib.compile_harness(t, harness))
             for t in _largest_pages(family))


def _longest_observation(compiled: harness_lib.CompiledHarness) -> int:
  return max(len(compiled.observation(s)) for s in range(compiled.done_state + 1))


class _Instance(NamedTuple):
  """A compiled page and its step tables."""

  compiled: harness_lib.CompiledHarness
  next_state: np.ndarray  # int [S, A]
  rewards: np.ndarray     # float64 [S, A], raw
  available: np.ndarray   # bool [S, A], pi_ref > 0
  action_names: tuple[str, ...]


@functools.lru_cache(maxsize=512)
def _load(task: tasks_lib.Task, harness: str, discount: float, reverse_fields: bool) -> _Instance:
  """A compiled page and its step tables, shared by every environment.

  Cached because compiling a large page (six boxes under H5) takes ~0.2 s.
  """
  compiled = harness_lib.compile_harness(task, harness, discount=discount,
                                         reverse_fields=reverse_fields)
  mdp = compiled.harness.mdp
  return _Instance(compiled, np.argmax(np.asarray(mdp.transitions), axis=-1),  # deterministic
                   np.asarray(mdp.rewards, np.float64), np.asarray(compiled.harness.pi_ref) > 0,
                   tuple(act.name for act in compiled.actions))


class MiniWoBEnv(gymnasium.Env):
  """A MiniWoB++ task family under one harness, as a gymnasium environment.

  See the module docstring for spaces, info and instance selection.

  Args:
    family: one of `tasks.FAMILIES`.
    harness: one of `harnesses.HARNESSES` (`"H0"` ... `"H5"`).
    reverse_fields: reverse the observation field order (representation only).
    discount: gamma of the compiled MDPs (informational here: rewards are
      raw; `info["discount"]` and `compiled.harness.mdp` carry it).
    task: a fixed instance of `family` for every episode.
    split: None, `"train"` or `"test"`: draw instances from that part of
      `tasks.task_split(family, num_train, num_test, seed=split_seed)`.
    num_train, num_test, split_seed: the split's sizes and first seed.
    render_mode: None or `"ansi"` (`render()` returns the observation text).
  """

  # Text rendering has no frame rate; declaring one keeps gymnasium's checker quiet.
  metadata = {"render_modes": ["ansi"], "render_fps": 1}

  def __init__(self, family: str = "click-checkboxes", harness: str = "H0", *,
               reverse_fields: bool = False, discount: float = 0.9,
               task: tasks_lib.Task | None = None, split: str | None = None,
               num_train: int = 100, num_test: int = 100, split_seed: int = 0,
               render_mode: str | None = None):
    _check_names(family, harness)
    if not isinstance(discount, (int, float, np.floating)) or not 0.0 <= float(discount) < 1.0:
      raise ValueError(f"discount: expected a float in [0, 1), got {discount!r}")
    if split is not None and split not in SPLITS:
      raise ValueError(f"split: expected None or one of {SPLITS}, got {split!r}")
    if task is not None and split is not None:
      raise ValueError("task: a fixed task excludes split (got both)")
    if render_mode is not None and render_mode not in self.metadata["render_modes"]:
      raise ValueError(f"render_mode: expected None or one of "
                       f"{self.metadata['render_modes']}, got {render_mode!r}")
    self.family, self.harness_name = family, harness
    self.reverse_fields, self.discount = bool(reverse_fields), float(discount)
    self.render_mode = render_mode
    self.split = split
    self._fixed = None if task is None else self._check_task(task, "task")
    self._instances: tuple[tasks_lib.Task, ...] = ()
    if split is not None:
      train, test = tasks_lib.task_split(family, num_train, num_test, seed=split_seed)
      self._instances = train if split == "train" else test
      if not self._instances:
        raise ValueError(f"num_{split}: expected at least one {split} instance, got 0")

    n = max_num_actions(family, harness)
    length = max_observation_length(family, harness)
    charset = set(CHARSET)
    if self._fixed is not None:
      # A page read from a real browser may exceed the sampled family's bounds.
      fixed = self._compile(self._fixed)
      n = max(n, len(fixed.actions))
      length = max(length, _longest_observation(fixed))
      charset |= {c for s in range(fixed.done_state + 1) for c in fixed.observation(s)}
    self.action_space = gymnasium.spaces.Discrete(n)
    self.observation_space = gymnasium.spaces.Text(max_length=length, min_length=1,
                                                   charset="".join(sorted(charset)))
    self._inst: _Instance | None = None
    self.compiled: harness_lib.CompiledHarness | None = None
    self.task: tasks_lib.Task | None = None
    self._state: int | None = None

  # -- instances ---------------------------------------------------------------

  def _check_task(self, task, field: str) -> tasks_lib.Task:
    if not isinstance(task, tasks_lib.Task) or task.family != self.family:
      raise ValueError(f"{field}: expected a {self.family} Task instance, got {task!r}")
    return task

  def _compile(self, task: tasks_lib.Task) -> harness_lib.CompiledHarness:
    return _load(task, self.harness_name, self.discount, self.reverse_fields).compiled

  def _load(self, task: tasks_lib.Task) -> _Instance:
    inst = _load(task, self.harness_name, self.discount, self.reverse_fields)
    a = len(inst.compiled.actions)
    if a > self.action_space.n:
      raise ValueError(f"options['task']: this page has {a} actions, more than the "
                       f"environment's {self.action_space.n}; pass it as task= at construction")
    return inst

  def _draw_task(self, seed: int | None, options: dict) -> tasks_lib.Task:
    unknown = set(options) - {"task", "task_index"}
    if unknown:
      raise ValueError(f"options: expected keys among ('task', 'task_index'), got "
                       f"{sorted(unknown)}")
    if "task" in options:
      return self._check_task(options["task"], "options['task']")
    if "task_index" in options:
      i = options["task_index"]
      if not self._instances or not isinstance(i, (int, np.integer)) or not (
          0 <= i < len(self._instances)):
        raise ValueError(f"options['task_index']: expected an index in "
                         f"[0, {len(self._instances)}) into the split, got {i!r}")
      return self._instances[int(i)]
    if self._fixed is not None:
      return self._fixed
    if self._instances:
      return self._instances[int(self.np_random.integers(len(self._instances)))]
    if seed is None:
      seed = int(self.np_random.integers(2**31 - 1))
    return tasks_lib.sample_task(self.family, int(seed))

  # -- gymnasium API -------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict | None = None):
    super().reset(seed=seed)
    options = dict(options or {})
    task = self._draw_task(seed, options)
    inst = self._load(task)
    if "task" in options and _longest_observation(inst.compiled) > (
        self.observation_space.max_length):
      raise ValueError("options['task']: this page's observations are longer than the "
                       "environment's Text space; pass it as task= at construction")
    self.task, self.compiled, self._inst = task, inst.compiled, inst
    self._state = task.initial_state
    return self._observation(), self._info()

  def step(self, action):
    if self._state is None:
      raise gymnasium.error.ResetNeeded("step: call reset() before step()")
    n = self.action_space.n
    if isinstance(action, np.ndarray) and action.ndim == 0:
      action = action.item()
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
      raise ValueError(f"action: expected an integer id in [0, {n}), got {action!r}")
    if not 0 <= action < n:
      raise ValueError(f"action: expected an id in [0, {n}) (Discrete({n}) of "
                       f"{self.family} under {self.harness_name}), got {int(action)}")
    inst = self._inst
    valid = action < len(inst.action_names) and bool(inst.available[self._state, action])
    executed = int(action) if valid else harness_lib.WAIT
    raw = float(inst.rewards[self._state, executed])
    self._state = int(inst.next_state[self._state, executed])
    terminated = self._state == self.compiled.done_state
    info = self._info()
    info.update(valid=valid, executed_action=executed, raw_reward=raw)
    return self._observation(), raw, terminated, False, info

  def render(self):
    if self.render_mode == "ansi" and self._state is not None:
      return self._observation()
    return None

  def _observation(self) -> str:
    return self.compiled.observation(self._state)

  def _mask(self, inst: _Instance) -> np.ndarray:
    mask = np.zeros(self.action_space.n, np.int8)
    mask[:len(inst.action_names)] = inst.available[self._state]
    return mask

  def _info(self) -> dict[str, Any]:
    inst = self._inst
    return dict(state=self._state, page=int(inst.compiled.page_of_state[self._state]),
                action_mask=self._mask(inst),
                action_names=inst.action_names, discount=self.discount, task=self.task)
