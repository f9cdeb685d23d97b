"""ScienceWorld (Wang et al., 2022) as a :class:`~harnax.envs.text.base.TextGame`.

ScienceWorld's simulator is a Scala program; the `scienceworld` package starts it in a Java VM
and talks to it through py4j. :class:`ScienceWorldGame` owns one JVM, started with a capped heap
(:data:`DEFAULT_HEAP_MB`), and calls the simulator's interface directly: the package's own
``ScienceWorldEnv.step`` asks the JVM for the look-around text, the inventory, the task text and
the whole valid-action list after every action; the action list is the costly one (about 55 ms
of a 60 ms step; docs/text_games.md has the measured times). Here a step asks only for what it
reports: the valid actions only where the game was made with ``admissible=True`` (about 8 ms a
step without them). A reset reloads the task (~70 ms; the simulator's own reset takes ~250 ms),
and the gold path is generated only when :meth:`ScienceWorldGame.expert_plan` asks for it
(~0.5 s, once per task and process).

One game object plays many tasks in its one JVM: ``reset(options={"task": other})`` loads another
task (rollout workers keep a game per worker and feed it tasks).

Tasks: :data:`TASK_NAMES` are ScienceWorld tasks whose gold paths are short (at most 17 actions
over all their train and test variations with the "easy" simplifications); ``tasks(split)`` lists
their variations from ScienceWorld's own split: "seen" its train variations, "unseen" its test
variations (its dev variations are not used here; :func:`variations` returns them).

Scores: ScienceWorld scores a task 0..100 (shown here /100, in [0, 1]) and -100 once the agent
did something that makes the task unwinnable (e.g. focusing on the wrong object); that ends the
episode with ``info["lost"] = True`` and score 0.

Java: a Java runtime (11+) must be installed; without one, :func:`make` raises
:class:`GameLoadError` before trying to start anything (``make java`` installs one).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
import weakref

from harnax.envs.text.base import SPLITS
from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask

__all__ = [
  "GAME", "TASK_NAMES", "ALL_TASK_NAMES", "SIMPLIFICATION", "DEFAULT_HEAP_MB", "ScienceWorldGame",
  "tasks", "make", "variations", "find_java",
]

GAME = "scienceworld"

# Tasks whose gold paths are short: the range of their lengths over every train and test
# variation with the "easy" simplifications (docs/text_games.md has the table).
TASK_NAMES = (
  "find-living-thing",          # 6-16 actions
  "find-non-living-thing",      # 3-11
  "find-plant",                 # 8-16
  "find-animal",                # 6-16
  "lifespan-longest-lived",     # 2-8
  "lifespan-shortest-lived",    # 2-8
  "lifespan-longest-lived-then-shortest-lived",  # 3-9
  "power-component",            # 9-15
  "identify-life-stages-2",     # 10-17
)

# All 30 ScienceWorld tasks (make() accepts any of them; their gold paths run to ~190 actions).
ALL_TASK_NAMES = (
  "boil", "melt", "freeze", "change-the-state-of-matter-of", "use-thermometer",
  "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
  "power-component", "power-component-renewable-vs-nonrenewable-energy", "test-conductivity",
  "test-conductivity-of-unknown-substances", "find-living-thing", "find-non-living-thing",
  "find-plant", "find-animal", "grow-plant", "grow-fruit", "chemistry-mix",
  "chemistry-mix-paint-secondary-color", "chemistry-mix-paint-tertiary-color",
  "lifespan-longest-lived", "lifespan-shortest-lived",
  "lifespan-longest-lived-then-shortest-lived", "identify-life-stages-1",
  "identify-life-stages-2", "inclined-plane-determine-angle",
  "inclined-plane-friction-named-surfaces", "inclined-plane-friction-unnamed-surfaces",
  "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant",
)

# ScienceWorld's "easy" = all its simplifications: teleport actions, doors and containers open,
# self-watering flower pots, no electrical actions (except in the electrical tasks, which keep
# them). It is the setting most agent papers report (SwiftSage, ReAct-style baselines).
SIMPLIFICATION = "easy"
_SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers",
                    "openDoors", "noElectricalAction")

# The simulator's heap cap (MiB). Every task of TASK_NAMES plays and generates its gold path
# with 64; some variations of the long tasks (boil, ...) need 192 (docs/text_games.md).
DEFAULT_HEAP_MB = 128

_JAVA_FIX = ("install a Java runtime: `make java` or `apt-get install default-jre-headless` "
             "(or point JAVA_HOME at one)")
_SPLIT_NAMES = ("train", "dev", "test")
_FOR_SPLIT = {"seen": "train", "unseen": "test"}
_TASK_DESC_PREFIX = "Task Description:\n"

# task name -> {"train": (...), "dev": (...), "test": (...), "max": int}, filled from the JVM.
_SPLIT_CACHE: dict[str, dict] = {}
# (task name, variation, simplification) -> the gold action sequence, filled on demand.
_GOLD_CACHE: dict[tuple[str, int, str], tuple[str, ...]] = {}


def find_java() -> str:
  """The `java` executable: $JAVA_HOME/bin/java if that exists, else `java` on PATH.

  Raises:
    GameLoadError: no Java runtime is found (the message says how to install one).
  """
  home = os.environ.get("JAVA_HOME")
  if home:
    path = os.path.join(home, "bin", "java")
    if os.path.isfile(path) and os.access(path, os.X_OK):
      return path
  path = shutil.which("java")
  if path is None:
    raise GameLoadError(f"ScienceWorld needs Java, and no `java` is on PATH "
                        f"(JAVA_HOME={home!r}): {_JAVA_FIX}")
  return path


def _check_task_name(name, field: str = "task name") -> str:
  if name not in ALL_TASK_NAMES:
    raise ValueError(f"{field}: expected a ScienceWorld task name (one of {ALL_TASK_NAMES}), "
                     f"got {name!r}")
  return name


def _check_simplification(simplification: str) -> str:
  if not isinstance(simplification, str):
    raise ValueError(f"simplification: expected a str, got {simplification!r}")
  bad = [s for s in simplification.split(",") if s and s not in _SIMPLIFICATIONS]
  if bad:
    raise ValueError(f"simplification: expected a comma-separated subset of {_SIMPLIFICATIONS} "
                     f"(or ''), got unknown {bad}")
  return simplification


class _Jvm:
  """One ScienceWorld simulator in its own Java VM, and the py4j connection to it."""

  def __init__(self, heap_mb: int = DEFAULT_HEAP_MB):
    java = find_java()
    from py4j.java_gateway import GatewayParameters
    from py4j.java_gateway import JavaGateway
    from py4j.java_gateway import launch_gateway
    from scienceworld.constants import BASEPATH
    from scienceworld.constants import JAR_PATH
    t0 = time.perf_counter()
    # Serial GC: the simulator is single-threaded and small; parallel GC threads only add
    # memory and start-up time on a machine shared by many workers.
    # Out of heap, the JVM exits (code 3) instead of limping on in an undefined state.
    self.heap_mb = int(heap_mb)
    opts = [f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError"]
    try:
      port, proc = launch_gateway(classpath=JAR_PATH, javaopts=opts, java_path=java,
                                  die_on_exit=True, cwd=BASEPATH, return_proc=True)
    except Exception as e:  # py4j raises a bare Py4JError when java exits before its port
      raise GameLoadError(f"ScienceWorld: the Java VM ({java}, {' '.join(opts)}) did not start: "
                          f"{e}. Check that `{java} -version` works (Java 11+); {_JAVA_FIX}"
                          ) from e
    self.proc = proc
    self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auto_field=True),
                               java_process=proc)
    self.server = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
    self.start_seconds = time.perf_counter() - t0
    self._finalizer = weakref.finalize(self, _shutdown, self.gateway, proc)

  def splits(self, name: str) -> dict:
    """The task's train/dev/test variation indices and variation count (cached per process)."""
    if name not in _SPLIT_CACHE:
      # The split lists belong to the loaded task; variation 0 always exists.
      self.server.load(name, 0, "", False)
      entry = {s: tuple(int(v) for v in getattr(self.server, f"getVariations{s.title()}")())
               for s in _SPLIT_NAMES}
      entry["max"] = int(self.server.getTaskMaxVariations(name))
      _SPLIT_CACHE[name] = entry
    return _SPLIT_CACHE[name]

  @property
  def alive(self) -> bool:
    return self._finalizer.alive and self.proc.poll() is None

  @contextlib.contextmanager
  def errors(self, what: str):
    """Turns a JVM that died or failed during `what` into a GameLoadError naming the cause."""
    from py4j.protocol import Py4JError
    try:
      yield
    except Py4JError as e:
      code = self.proc.poll()
      if code is None:
        raise GameLoadError(f"ScienceWorld failed during {what}: {type(e).__name__}") from e
      self.close()
      hint = (f"it ran out of its {self.heap_mb} MiB heap: pass a larger heap_mb (e.g. "
              f"{2 * self.heap_mb})" if code == 3 else "see `java -version` (Java 11+)")
      raise GameLoadError(f"ScienceWorld's JVM exited (code {code}) during {what}; {hint}"
                          ) from e

  def close(self) -> None:
    self._finalizer()


def _shutdown(gateway, proc: subprocess.Popen) -> None:
  with contextlib.suppress(Exception):
    if proc.poll() is None:
      gateway.shutdown()
    else:  # nobody to tell: just close the sockets (shutdown() would retry and log errors)
      gateway.close()
  if proc.poll() is None:
    # With die_on_exit the JVM exits when its stdin gets a line (or closes).
    with contextlib.suppress(Exception):
      proc.stdin.write(b"\n")
      proc.stdin.flush()
    try:
      proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def variations(task_name: str, which: str, *, game: ScienceWorldGame | None = None
               ) -> tuple[int, ...]:
  """ScienceWorld's own variation split of a task.

  Args:
    task_name: one of :data:`ALL_TASK_NAMES`.
    which: "train", "dev" or "test" (``tasks`` maps "seen" to train and "unseen" to test).
    game: a game whose JVM to ask (see :func:`tasks`); None starts a temporary JVM.

  Returns:
    The variation indices, ascending (cached per process after the first query).
  """
  _check_task_name(task_name, "task_name")
  if which not in _SPLIT_NAMES:
    raise ValueError(f"which: expected one of {_SPLIT_NAMES}, got {which!r}")
  return _splits([task_name], game)[task_name][which]


def _splits(names, game: ScienceWorldGame | None = None) -> dict[str, dict]:
  missing = [n for n in names if n not in _SPLIT_CACHE]
  if missing and game is not None:
    game._query_splits(missing)
  elif missing:
    jvm = _Jvm()
    try:
      for n in missing:
        jvm.splits(n)
    finally:
      jvm.close()
  return {n: _SPLIT_CACHE[n] for n in names}


def tasks(split: str, *, task_names=TASK_NAMES, per_task: int | None = None, seed: int = 0,
          game: ScienceWorldGame | None = None) -> list[GameTask]:
  """The task instances of a split: ScienceWorld variations of each task.

  Args:
    split: "seen" (ScienceWorld's train variations) or "unseen" (its test variations).
    task_names: a non-empty subset of :data:`ALL_TASK_NAMES` (default :data:`TASK_NAMES`).
    per_task: variations per task: None for all of the split's, else a seeded sample of that
      many (all of them where the split has fewer), listed in ascending order.
    seed: seed of the sample (unused when `per_task` is None).
    game: a game whose JVM to ask for the splits the process has not seen yet (asking loads
      tasks in it: its episode ends and it needs a reset); None starts a temporary JVM for
      them (about 2 s). The splits are cached per process.

  Returns:
    GameTask(game="scienceworld", task_type=<task name>, split,
    ident="scienceworld-<task name>-<variation>", params=(task name, variation)), grouped by
    task in the order of `task_names`.
  """
  if split not in SPLITS:
    raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
  if isinstance(task_names, str):
    task_names = (task_names,)
  task_names = tuple(task_names)
  if not task_names:
    raise ValueError("task_names: expected at least one ScienceWorld task name, got none")
  for name in task_names:
    _check_task_name(name, "task_names")
  if per_task is not None and (not isinstance(per_task, int) or per_task < 1):
    raise ValueError(f"per_task: expected None or a positive int, got {per_task!r}")
  splits = _splits(task_names, game)
  out = []
  for name in task_names:
    pool = list(splits[name][_FOR_SPLIT[split]])
    if per_task is not None and per_task < len(pool):
      pool = sorted(random.Random(f"scienceworld-tasks/{split}/{name}/{int(seed)}")
                    .sample(pool, per_task))
    out.extend(GameTask(game=GAME, task_type=name, split=split, ident=f"{GAME}-{name}-{v}",
                        params=(name, v)) for v in pool)
  return out


def _check_task(task) -> tuple[str, int]:
  if not isinstance(task, GameTask) or task.game != GAME:
    raise ValueError(f"task: expected a GameTask with game={GAME!r}, got {task!r}")
  params = task.params
  if (not isinstance(params, tuple) or len(params) != 2 or not isinstance(params[1], int)
      or isinstance(params[1], bool)):
    raise ValueError(f"task.params: expected (task name, variation index), got {params!r}")
  name, variation = params
  _check_task_name(name, "task.params[0] (task name)")
  if variation < 0:
    raise ValueError(f"task.params[1] (variation): expected an index >= 0, got {variation}")
  return name, variation


class ScienceWorldGame:
  """A ScienceWorld task in its own JVM, as a gymnasium-style text game.

  ``info`` carries the keys of :data:`harnax.envs.text.base.INFO_KEYS` plus ``"lost"`` (the
  task was failed: ScienceWorld's score -100) and ``"variation"``. Rewards are the change of
  ``score``; the first observation is the "look around" text and its score is the baseline
  (ScienceWorld gives a few points for the start state of some tasks). ``info["moves"]`` counts
  the step() calls since reset (ScienceWorld's own count skips free actions such as "look
  around"; truncation counts every action, so an agent cannot idle forever).

  Args:
    task: the first task to play (see :func:`tasks`); ``reset(options={"task": t})`` loads others.
    admissible: compute ``info["admissible"]`` (the valid-action list) at every step.
    max_steps: actions per episode before truncation (>= 1).
    simplification: ScienceWorld's simplification string (comma-separated; "" for none).
    heap_mb: the JVM's heap cap in MiB.

  Raises:
    GameLoadError: no Java runtime, or the JVM does not start.
    ValueError: a bad task, variation index, step limit or simplification string.
  """

  def __init__(self, task: GameTask, *, admissible: bool = False, max_steps: int = 50,
               simplification: str = SIMPLIFICATION, heap_mb: int = DEFAULT_HEAP_MB):
    _check_task(task)
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
      raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")
    if not isinstance(heap_mb, int) or isinstance(heap_mb, bool) or heap_mb < 32:
      raise ValueError(f"heap_mb: expected an int >= 32 (MiB), got {heap_mb!r}")
    self.simplification = _check_simplification(simplification)
    self.admissible = bool(admissible)
    self.max_steps = max_steps
    self.task = task
    self.goal = ""
    self._key = None           # (name, variation, simplification) of self.task
    self._actions: list[str] = []   # since reset, to restore the state after a gold-path load
    self._score = 0.0
    self._won = False
    self._done = True
    self._started = False
    self._jvm = _Jvm(heap_mb)
    try:
      self._set_task(task)
    except BaseException:
      self._jvm.close()
      raise

  @property
  def jvm_start_seconds(self) -> float:
    """Seconds the JVM took to start and answer."""
    return self._jvm.start_seconds

  @property
  def jvm_pid(self) -> int:
    """Process id of this game's JVM (to measure its memory)."""
    return self._jvm.proc.pid

  def _server(self, what: str):
    if not self._jvm.alive:
      raise RuntimeError(f"{what}: the game is closed")
    return self._jvm.server

  def _query_splits(self, names) -> None:
    """Fills the split cache for `names` from this JVM (the episode ends: reset() is due)."""
    self._server("tasks")
    self._started = False
    with self._jvm.errors("the variation lists"):
      for n in names:
        self._jvm.splits(n)

  def _set_task(self, task: GameTask) -> None:
    """Validates `task` against the simulator; it is loaded by the next reset()."""
    name, variation = _check_task(task)
    self._server("reset")
    with self._jvm.errors(f"the variation list of {name!r}"):
      n = self._jvm.splits(name)["max"]
    if variation >= n:
      raise ValueError(f"task.params[1] (variation): {name!r} has variations 0..{n - 1}, "
                       f"got {variation}")
    simplification = self.simplification
    if "power-component" in name or "conductivity" in name:
      # The electrical tasks need `connect` actions: ScienceWorld rejects noElectricalAction
      # for them (its "easy" leaves them in).
      simplification = ",".join(s for s in simplification.split(",")
                                if s != "noElectricalAction")
    self._key = (name, variation, simplification)
    self.task = task
    self._started = False

  def _info(self, lost: bool) -> dict:
    admissible = None
    if self.admissible:
      admissible = tuple(str(a) for a in self._jvm.server.getValidActionObjectCombinations())
    return {
      "goal": self.goal,
      "admissible": admissible,
      "won": self._won,
      "score": self._score,
      "moves": len(self._actions),
      "lost": lost,
      "variation": self._key[1],
    }

  def _read_score(self) -> tuple[float, bool, bool]:
    """(score in [0, 1], won, lost) of the simulator's current state."""
    server = self._jvm.server
    raw = float(server.getScore())
    if raw < 0:           # ScienceWorld's -100: the task can no longer be completed
      return 0.0, False, True
    completed = bool(server.getCompleted())
    return min(raw, 1.0), completed, False

  def reset(self, *, seed: int | None = None, options: dict | None = None
            ) -> tuple[str, dict]:
    """Starts an episode of the current task, or of ``options["task"]`` (in this JVM).

    `seed` is unused: a task's variation fixes its world.

    Returns:
      The "look around" text of the start state and the info dict.
    """
    del seed
    server = self._server("reset")
    options = dict(options or {})
    task = options.pop("task", None)
    if options:
      raise ValueError(f"options: expected only the key 'task', got {sorted(options)}")
    if task is not None:
      self._set_task(task)
    name, variation, simplification = self._key
    with self._jvm.errors(f"reset ({name!r} variation {variation})"):
      # A fresh load IS the start state, and costs ~80 ms where the simulator's reset()
      # (which rebuilds more than the world) costs ~250 ms.
      server.load(name, variation, simplification, False)
      self._actions = []
      self.goal = str(server.freeActionTaskDesc()).removeprefix(_TASK_DESC_PREFIX).strip()
      obs = str(server.step("look around"))   # a free action in ScienceWorld (no time passes)
      self._score, self._won, lost = self._read_score()
      info = self._info(lost)
    self._done = self._won or lost
    self._started = True
    return obs, info

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    """Executes one action.

    Returns:
      (observation, reward = change of score, terminated (won or lost), truncated (after
      `max_steps` actions), info).

    Raises:
      RuntimeError: before reset, after the episode ended, or after close.
      TypeError: `action` is not a string.
    """
    server = self._server("step")
    if not self._started:
      raise RuntimeError("step: call reset() first")
    if self._done:
      raise RuntimeError("step: the episode is over (won, lost or truncated); call reset()")
    if not isinstance(action, str):
      raise TypeError(f"action: expected a str, got {type(action).__name__}")
    with self._jvm.errors(f"step({action!r})"):
      obs = str(server.step(action))
      self._actions.append(action)
      previous = self._score
      self._score, self._won, lost = self._read_score()
      info = self._info(lost)
    terminated = self._won or lost
    truncated = not terminated and len(self._actions) >= self.max_steps
    self._done = terminated or truncated
    return obs, self._score - previous, terminated, truncated, info

  def expert_plan(self) -> list[str]:
    """ScienceWorld's gold action sequence for the current task.

    It wins from the task's START state (right after reset), whatever was played since:
    ScienceWorld derives it at load time only and cannot re-plan from a later state. The first
    call per task and process costs a load with the gold path (~0.5 s; cached after): the
    simulator plays the path, then this game reloads the task and replays this episode's
    actions so far, so the episode goes on where it was.
    """
    server = self._server("expert_plan")
    if self._key not in _GOLD_CACHE:
      name, variation, simplification = self._key
      with self._jvm.errors(f"the gold path of {name!r} variation {variation}"):
        server.load(name, variation, simplification, True)
        _GOLD_CACHE[self._key] = tuple(str(a) for a in server.getGoldActionSequence())
        if self._started:   # back to where the episode was (the simulator is deterministic)
          server.load(name, variation, simplification, False)
          server.step("look around")
          for action in self._actions:
            server.step(action)
    return list(_GOLD_CACHE[self._key])

  def close(self) -> None:
    """Shuts the JVM down (idempotent)."""
    jvm = getattr(self, "_jvm", None)
    if jvm is not None:
      jvm.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __del__(self):
    try:  # at interpreter exit module globals may be gone; weakref.finalize still stops the JVM
      self.close()
    except Exception:
      pass


def make(task: GameTask, *, admissible: bool = False, max_steps: int = 50,
         simplification: str = SIMPLIFICATION, heap_mb: int = DEFAULT_HEAP_MB
         ) -> ScienceWorldGame:
  """Starts a JVM and loads `task` in it (about a second; see :class:`ScienceWorldGame`)."""
  return ScienceWorldGame(task, admissible=admissible, max_steps=max_steps,
                          simplification=simplification, heap_mb=heap_mb)
