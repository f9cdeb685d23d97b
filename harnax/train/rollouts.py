"""Batched agent rollouts in text games, logged turn by turn to JSONL.

A rollout plays a queue of :class:`~harnax.envs.text.base.GameTask` s with a fixed number of
live games (``batch_size``). Each turn:

1. every live game's context (rendered by the ``render`` callable from the game and its
   history) becomes a prompt (:func:`harnax.policies.text_agent.format_prompt`);
2. one batched generation answers all of them (:class:`LMGenerator`: one jit-compiled
   KV-cache prefill + decode over left-padded prompts, the prompt length and the batch
   rounded up to a few static buckets so it compiles a few times only);
3. each output is parsed (:func:`harnax.policies.text_agent.parse_output`); a parsable action
   is stepped in its game, an unparsable output is counted, answered with
   :data:`PARSE_ERROR_OBSERVATION` and executes nothing (the turn still counts);
4. a game that is won, lost, truncated or out of turns is closed and its slot refilled from
   the queue, so the batch stays full until the queue runs dry.

With a ``retry`` generator, a game whose last turn went wrong (the monitor rejected the
action, the harness reported a loop, or the output had no action) is answered by ``retry``
instead of ``generator`` on its next turn: a greedy agent that erred in a state answers the
same way when it sees nearly the same context again, a sampling ``retry`` may not.

Games live in worker processes (``workers > 0``; multiprocessing ``spawn`` or ``forkserver``,
one game engine, e.g. one JVM, per game in its worker) built from the picklable ``make_game``
callable; the workers of one turn step their games in parallel and the turn waits for all
of them, so the schedule, hence the log, does not depend on timing: with greedy decoding a
run with workers logs exactly what ``workers=0`` (everything in this process) logs.

The log (:func:`read_log`) has one JSON object per line: a ``"run"`` header, then per
episode a ``"reset"`` record, one ``"turn"`` record per turn (context, output, parsed action,
parse error, harness verdict, observation, reward, score, won, done, and ``batch``: the index
of the batched generation it was part of) and an ``"episode"`` summary. :func:`replay`
re-executes an episode's logged actions on a fresh game and checks that the game answers as
logged.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import multiprocessing
import pickle
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from harnax.envs.text.base import GameTask
from harnax.policies import text_agent

PARSE_ERROR_OBSERVATION = ("Your output had no action. Answer in the format:\n"
                           "Think: <reasoning>\nAction: <one command>")
"""What the agent is told after an output without a parsable action (nothing is executed)."""

START_METHODS = ("spawn", "forkserver")
LOG_FORMAT = "harnax-text-rollouts/1"


# -- history and context ---------------------------------------------------------------------


@dataclasses.dataclass
class Step:
  """One turn of a game's history.

  Attributes:
    output: the model's output text.
    action: the parsed action, or None (nothing was executed).
    parse_error: why no action was parsed (None when ``action`` is set).
    observation: the game's answer (:data:`PARSE_ERROR_OBSERVATION` without an action).
    reward: the step's reward (0 without an action).
    info: the game's info after the step (the previous one without an action).
  """

  output: str
  action: str | None
  parse_error: str | None
  observation: str
  reward: float
  info: dict


@dataclasses.dataclass
class History:
  """What a game has shown so far: the reset observation and info, then the turns."""

  task: GameTask
  observation: str
  info: dict
  steps: list[Step] = dataclasses.field(default_factory=list)

  @property
  def goal(self) -> str:
    return str(self.info.get("goal", ""))

  @property
  def last_info(self) -> dict:
    return self.steps[-1].info if self.steps else self.info


@dataclasses.dataclass(frozen=True)
class PlainContext:
  """The context without any harness part: the reset observation (the goal prepended when it
  does not already contain it), then the last ``window`` turns as ``> action`` and the
  game's answer. A renderer is any picklable ``(game, history) -> str``; harnessed renderers
  add the harness's record and feedback."""

  window: int = 10

  def __post_init__(self):
    if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
      raise ValueError(f"window: expected an int >= 0, got {self.window!r}")

  def __call__(self, game, history: History) -> str:
    del game
    parts = [history.observation.strip()]
    if history.goal and history.goal not in history.observation:
      parts.insert(0, f"Your task is to: {history.goal}")
    steps = history.steps[-self.window:] if self.window else []
    for step in steps:
      shown = step.action if step.action is not None else "(no action)"
      parts.append(f"> {shown}\n{step.observation.strip()}")
    return "\n\n".join(parts)


@dataclasses.dataclass(frozen=True)
class GameContext:
  """The context a harnessed game renders itself: ``game.context(**components)`` (e.g.
  :class:`harnax.envs.text.harness.HarnessedGame`; None leaves a component at the game's
  config). Turns without a parsable action never reach the game, so they are not shown."""

  state_tracking: bool | None = None
  action_monitoring: bool | None = None

  def __call__(self, game, history: History) -> str:
    del history
    kw = {k: v for k, v in (("state_tracking", self.state_tracking),
                            ("action_monitoring", self.action_monitoring)) if v is not None}
    return game.context(**kw)


# -- generation ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Generated:
  """One generated output: its text (special tokens removed), number of generated tokens
  (the stop token included), prompt tokens, and whether the prompt was cut on the left."""

  text: str
  num_tokens: int
  prompt_tokens: int
  prompt_cut: bool = False


def _buckets(value, name: str) -> tuple[int, ...] | None:
  if value is None:
    return None
  out = tuple(sorted(set(int(v) for v in value)))
  if not out or out[0] < 1:
    raise ValueError(f"{name}: expected positive ints, got {value!r}")
  return out


def _round_up(n: int, buckets: tuple[int, ...] | None, *, name: str) -> int:
  """The smallest bucket >= n (the next power of two without buckets)."""
  if buckets is None:
    return 1 << max(0, (n - 1).bit_length())
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{name}: {n} exceeds the largest bucket {buckets[-1]}")


class LMGenerator:
  """Batched generation with a :class:`harnax.models.CausalLM` and its tokenizer.

  ``__call__(contexts)`` formats each context as a prompt, left-pads the batch to static
  shapes (rows: the next power of two or the next of ``batch_buckets``, padding rows repeat
  the first prompt; columns: the next of ``length_buckets``, by default powers of two from
  64), runs :func:`harnax.models.prefill` and :func:`harnax.models.decode` once, and decodes
  each row. Each (rows, columns) shape compiles once. A prompt longer than
  ``max_prompt_tokens`` keeps its last tokens (``Generated.prompt_cut``).

  Sampling is greedy at ``temperature=0``; otherwise the key of call ``i`` is
  ``fold_in(key(seed), i)``, so a run is reproducible from its seed.

  Attributes:
    stats: totals over calls: ``calls``, ``rows`` (real prompts), ``generated_tokens``,
      ``prompt_tokens``, ``seconds`` (wall time of the calls, compilation included) and
      ``shapes`` (the set of (rows, columns) compiled).
  """

  def __init__(self, model, tokenizer, *, max_new_tokens: int = 128, temperature: float = 0.0,
               top_p: float | None = None, top_k: int | None = None, seed: int = 0,
               chat: bool | None = None, system: str | None = text_agent.SYSTEM_PROMPT,
               enable_thinking: bool | None = None,
               length_buckets: Sequence[int] | None = None,
               batch_buckets: Sequence[int] | None = None,
               max_prompt_tokens: int | None = None):
    from flax import nnx
    import jax

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
        max_new_tokens < 1):
      raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    if not temperature >= 0:
      raise ValueError(f"temperature: expected >= 0, got {temperature!r}")
    if top_p is not None and not 0 < top_p <= 1:
      raise ValueError(f"top_p: expected in (0, 1], got {top_p!r}")
    vocab = model.config.vocab_size
    if top_k is not None and not 0 < top_k <= vocab:
      raise ValueError(f"top_k: expected in [1, {vocab}], got {top_k!r}")
    self.model = model
    self.tokenizer = tokenizer
    self.max_new_tokens = max_new_tokens
    self.temperature = float(temperature)
    self.top_p = top_p
    self.top_k = top_k
    self.seed = int(seed)
    self.chat = chat
    self.system = system
    self.enable_thinking = enable_thinking
    self.batch_buckets = _buckets(batch_buckets, "batch_buckets")
    limit = getattr(model.config, "max_position_embeddings", None) or 1 << 30
    if max_prompt_tokens is None:
      max_prompt_tokens = limit - max_new_tokens
    if max_prompt_tokens < 1 or max_prompt_tokens + max_new_tokens > limit:
      raise ValueError(f"max_prompt_tokens: expected 1..{limit - max_new_tokens} (the model's "
                       f"{limit} positions minus max_new_tokens), got {max_prompt_tokens}")
    self.max_prompt_tokens = int(max_prompt_tokens)
    if length_buckets is None:
      length_buckets = [64 << i for i in range(32) if 64 << i < self.max_prompt_tokens]
      length_buckets.append(self.max_prompt_tokens)
    self.length_buckets = _buckets(length_buckets, "length_buckets")
    if self.length_buckets[-1] < self.max_prompt_tokens:
      self.length_buckets += (self.max_prompt_tokens,)
    stops = {int(t) for t in (model.config.eos_token_id or ())}
    if tokenizer.eos_token_id is not None:
      stops.add(int(tokenizer.eos_token_id))
    self.stop_tokens = tuple(sorted(stops))
    pad = tokenizer.pad_token_id
    self.pad_id = int(pad if pad is not None else (model.config.pad_token_id or 0))
    self._graphdef, self._state = nnx.split(model)
    self._key = jax.random.key(self.seed)
    self.stats = dict(calls=0, rows=0, generated_tokens=0, prompt_tokens=0, seconds=0.0,
                      shapes=set())

  def describe(self) -> dict:
    """The settings, for a log header."""
    return dict(kind="lm", max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                top_p=self.top_p, top_k=self.top_k, seed=self.seed, chat=self.chat,
                enable_thinking=self.enable_thinking, length_buckets=list(self.length_buckets),
                batch_buckets=None if self.batch_buckets is None else list(self.batch_buckets),
                max_prompt_tokens=self.max_prompt_tokens,
                params=int(sum(np.prod(x.shape) for x in _param_leaves(self.model))))

  def prompt(self, context: str) -> str:
    return text_agent.format_prompt(self.tokenizer, context, chat=self.chat, system=self.system,
                                    enable_thinking=self.enable_thinking)

  def encode(self, contexts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[int],
                                                     list[bool]]:
    """Left-padded ``(ids [R, T], mask [R, T], prompt lengths, cut flags)`` at bucket shapes."""
    rows = [self.tokenizer.encode(self.prompt(c), add_special_tokens=False) for c in contexts]
    cut = [len(r) > self.max_prompt_tokens for r in rows]
    rows = [r[-self.max_prompt_tokens:] for r in rows]
    n = _round_up(len(rows), self.batch_buckets, name="batch size")
    t = _round_up(max(len(r) for r in rows), self.length_buckets, name="prompt length")
    ids = np.full((n, t), self.pad_id, np.int32)
    mask = np.zeros((n, t), np.int32)
    for i in range(n):
      r = rows[i] if i < len(rows) else rows[0]  # padding rows repeat a real prompt
      ids[i, t - len(r):] = r
      mask[i, t - len(r):] = 1
    return ids, mask, [len(r) for r in rows], cut

  def __call__(self, contexts: Sequence[str]) -> list[Generated]:
    import jax
    import jax.numpy as jnp

    from harnax.models import decoding

    if not contexts:
      return []
    t0 = time.perf_counter()
    ids, mask, lengths, cut = self.encode(contexts)
    n, t = ids.shape
    cache = self.model.init_cache(n, t + self.max_new_tokens)
    logits, cache = decoding.prefill(self._graphdef, self._state, jnp.asarray(ids),
                                     jnp.asarray(mask), cache)
    key = jax.random.fold_in(self._key, self.stats["calls"])
    out, _ = decoding.decode(key, self._graphdef, self._state, cache, logits,
                             max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                             top_k=self.top_k, top_p=self.top_p, stop_tokens=self.stop_tokens,
                             pad_token_id=self.pad_id)
    tokens = np.asarray(out.tokens)
    counts = np.asarray(out.lengths)
    results = []
    for i in range(len(contexts)):
      row = [int(x) for x in tokens[i, :counts[i]]]
      text = self.tokenizer.decode(row, skip_special_tokens=True)
      results.append(Generated(text=text, num_tokens=int(counts[i]), prompt_tokens=lengths[i],
                               prompt_cut=cut[i]))
    s = self.stats
    s["calls"] += 1
    s["rows"] += len(contexts)
    s["generated_tokens"] += int(counts[:len(contexts)].sum())
    s["prompt_tokens"] += int(sum(lengths))
    s["shapes"].add((n, t))
    s["seconds"] += time.perf_counter() - t0
    return results


def _param_leaves(model):
  from flax import nnx
  import jax
  return jax.tree.leaves(nnx.state(model, nnx.Param))


# -- games: in this process or in workers ----------------------------------------------------


def _jsonable(x):
  """``x`` as JSON data: dataclasses as dicts, tuples and sets as lists, numpy as Python."""
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
  if isinstance(x, Mapping):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (set, frozenset)):
    return sorted(_jsonable(v) for v in x)
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  if x is None or isinstance(x, (bool, int, float, str)):
    return x
  return str(x)


class _Games:
  """The games of some slots and their histories; executes commands (one process)."""

  def __init__(self, make_game, render):
    self.make_game = make_game
    self.render = render
    self.games: dict[int, Any] = {}
    self.histories: dict[int, History] = {}

  def run(self, commands: list[tuple]) -> list[dict]:
    return [getattr(self, "_" + c[0])(*c[1:]) for c in commands]

  def _reset(self, slot: int, task: GameTask, seed: int | None) -> dict:
    game = self.make_game(task)
    self.games[slot] = game
    obs, info = game.reset(seed=seed)
    history = self.histories[slot] = History(task=task, observation=obs, info=dict(info))
    return dict(observation=obs, info=dict(info), context=self.render(game, history))

  def _step(self, slot: int, output: str, action: str | None, error: str | None,
            last: bool) -> dict:
    game, history = self.games[slot], self.histories[slot]
    if action is None:
      obs, reward, terminated, truncated = PARSE_ERROR_OBSERVATION, 0.0, False, False
      info = {k: v for k, v in history.last_info.items() if k != "harness"}
    else:
      obs, reward, terminated, truncated, info = game.step(action)
      info = dict(info)
    history.steps.append(Step(output=output, action=action, parse_error=error, observation=obs,
                              reward=float(reward), info=info))
    done = bool(terminated or truncated or last)
    context = None if done else self.render(game, history)
    return dict(observation=obs, reward=float(reward), terminated=bool(terminated),
                truncated=bool(truncated), info=info, context=context)

  def _close(self, slot: int) -> dict:
    game = self.games.pop(slot)
    self.histories.pop(slot)
    game.close()
    return {}

  def close_all(self):
    for slot in list(self.games):
      self._close(slot)


def _worker_main(conn, make_game, render) -> None:
  """A worker process: runs batches of commands until it receives None."""
  games = _Games(make_game, render)
  try:
    while True:
      commands = conn.recv()
      if commands is None:
        break
      try:
        conn.send(("ok", games.run(commands)))
      except Exception:  # shipped to the parent, which raises it with the slot's task
        conn.send(("error", traceback.format_exc()))
  finally:
    try:
      games.close_all()
    finally:
      conn.close()


class _Executor:
  """Runs per-slot commands in this process (``workers=0``) or in worker processes (slot
  ``s`` lives in worker ``s % workers``), in parallel across workers; results in order."""

  def __init__(self, make_game, render, workers: int, start_method: str):
    self.workers = workers
    if workers == 0:
      self.local = _Games(make_game, render)
      return
    ctx = multiprocessing.get_context(start_method)
    self.conns, self.procs = [], []
    for _ in range(workers):
      parent, child = ctx.Pipe()
      proc = ctx.Process(target=_worker_main, args=(child, make_game, render), daemon=True)
      proc.start()
      child.close()
      self.conns.append(parent)
      self.procs.append(proc)

  def run(self, commands: list[tuple]) -> list[dict]:
    if self.workers == 0:
      return self.local.run(commands)
    groups = collections.defaultdict(list)
    for i, c in enumerate(commands):
      groups[c[1] % self.workers].append(i)
    for w, idx in groups.items():
      self.conns[w].send([commands[i] for i in idx])
    results: list = [None] * len(commands)
    errors = []
    for w, idx in groups.items():
      status, payload = self.conns[w].recv()
      if status == "error":
        errors.append(f"worker {w}:\n{payload}")
        continue
      for i, r in zip(idx, payload):
        results[i] = r
    if errors:
      raise RuntimeError("a game failed in a worker process:\n" + "\n".join(errors))
    return results

  def close(self) -> None:
    if self.workers == 0:
      self.local.close_all()
      return
    for conn in self.conns:
      try:
        conn.send(None)
      except (BrokenPipeError, OSError):
        pass
    for proc in self.procs:
      proc.join(timeout=30)
      if proc.is_alive():
        proc.terminate()
        proc.join()
    for conn in self.conns:
      conn.close()


# -- the rollout -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EpisodeSummary:
  """One finished episode.

  Attributes:
    episode: its id (its position in the task queue).
    task: the task ident.
    seed: the reset seed.
    won: the task was solved; score: the last score; ret: the sum of rewards.
    turns: turns played (parse failures included).
    end: "won", "lost" (terminated without a win), "truncated" (the game's step limit) or
      "max_turns".
    parse_failures: turns whose output had no parsable action.
    rejected: turns whose action the harness's monitor rejected (verdict ``accepted`` False).
    stalled: turns after which the harness reported a loop (verdict ``stalled`` True).
    generated_tokens: tokens the model generated in the episode.
    prompt_cuts: turns whose prompt was cut to ``max_prompt_tokens``.
  """

  episode: int
  task: str
  seed: int | None
  won: bool
  score: float
  ret: float
  turns: int
  end: str
  parse_failures: int
  rejected: int
  stalled: int
  generated_tokens: int
  prompt_cuts: int


@dataclasses.dataclass
class RolloutResult:
  """What :func:`rollout` returns.

  Attributes:
    episodes: the summaries, ordered by episode id.
    batch_sizes: live games at each batched turn (the batch stays full while tasks remain).
    generated_tokens: tokens generated over the run.
    seconds: wall time of the whole run; generate_seconds: of the generator calls;
      env_seconds: of the game commands (resets, steps, closes; workers' time as waited for).
  """

  episodes: list[EpisodeSummary]
  batch_sizes: list[int]
  generated_tokens: int
  seconds: float
  generate_seconds: float
  env_seconds: float

  @property
  def turns(self) -> int:
    return sum(self.batch_sizes)

  @property
  def tokens_per_second(self) -> float:
    return self.generated_tokens / self.seconds if self.seconds else math.nan

  @property
  def turns_per_second(self) -> float:
    return self.turns / self.seconds if self.seconds else math.nan


def _flag(verdict, name: str) -> bool | None:
  if verdict is None:
    return None
  value = verdict.get(name) if isinstance(verdict, Mapping) else getattr(verdict, name, None)
  return None if value is None else bool(value)


def task_record(task: GameTask) -> dict:
  """The task as JSON data (``params`` as lists; :func:`task_from_record` inverts it)."""
  return dict(game=task.game, task_type=task.task_type, split=task.split, ident=task.ident,
              params=_jsonable(task.params))


def _tuples(x):
  return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def task_from_record(record: Mapping) -> GameTask:
  """The :class:`GameTask` of a ``"reset"`` record (or of its ``"task"`` field)."""
  data = record.get("task", record) if isinstance(record.get("task"), Mapping) else record
  try:
    return GameTask(game=data["game"], task_type=data["task_type"], split=data["split"],
                    ident=data["ident"], params=_tuples(list(data.get("params", []))))
  except KeyError as e:
    raise ValueError(f"record: no task field {e} (expected a 'reset' record)") from None


def rollout(tasks: Iterable[GameTask], make_game: Callable[[GameTask], Any], generator, *,
            render: Callable[[Any, History], str] = PlainContext(), batch_size: int = 8,
            max_turns: int = 30, workers: int = 0, start_method: str = "spawn",
            seed: int | None = 0, pick: str = "first", log_path: str | None = None,
            log_admissible: bool = False, meta: Mapping | None = None,
            retry=None) -> RolloutResult:
  """Plays every task once with the agent ``generator``; see the module docstring.

  Args:
    tasks: the queue of tasks; episode ``i`` plays ``tasks[i]`` (repeat a task to play it
      several times).
    make_game: picklable ``GameTask -> game`` (a :class:`~harnax.envs.text.base.TextGame`,
      harnessed or not). It decides which harness components are on.
    generator: ``contexts -> [Generated]`` (:class:`LMGenerator`); it may have ``prompt``
      and ``describe`` methods (the log header records ``describe()``).
    render: picklable ``(game, history) -> context``; runs where the game lives.
    batch_size: live games at once.
    max_turns: turns per episode at most (parse failures count).
    workers: 0 to play the games in this process, else the number of worker processes.
    start_method: "spawn" or "forkserver" (never fork: the parent runs jax threads).
    seed: reset seed of episode 0; episode ``i`` resets with ``seed + i`` (None: no seed).
    pick: which of several ``Action:`` lines counts (:func:`text_agent.parse_output`).
    log_path: the JSONL file to write (replaced), or None.
    log_admissible: also log the admissible commands of each turn (long in ALFWorld).
    meta: extra JSON data for the log header (the harness configuration, say).
    retry: a second generator (same interface) for the turn after one that went wrong: a
      rejected action (harness verdict ``accepted`` False), a reported loop (``stalled``) or
      no parsable action. None: ``generator`` answers every turn. Turn records say which
      answered (``retry``).
  Returns:
    a :class:`RolloutResult`.
  Raises:
    ValueError: a bad option, a task that is not a GameTask, or unpicklable callables with
      ``workers > 0``. RuntimeError: a game raised (the message carries its traceback).
  """
  tasks = list(tasks)
  for i, task in enumerate(tasks):
    if not isinstance(task, GameTask):
      raise ValueError(f"tasks[{i}]: expected a GameTask, got {type(task).__name__}")
  for name, value, low in (("batch_size", batch_size, 1), ("max_turns", max_turns, 1),
                           ("workers", workers, 0)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
  if start_method not in START_METHODS:
    raise ValueError(f"start_method: expected one of {START_METHODS}, got {start_method!r}")
  if pick not in text_agent.PICKS:
    raise ValueError(f"pick: expected one of {text_agent.PICKS}, got {pick!r}")
  if retry is not None and not callable(retry):
    raise ValueError(f"retry: expected a generator (contexts -> outputs) or None, got "
                     f"{type(retry).__name__}")
  if workers:
    for name, fn in (("make_game", make_game), ("render", render)):
      try:
        pickle.dumps(fn)
      except Exception as e:
        raise ValueError(f"{name}: must be picklable to reach worker processes (a module-level "
                         f"function or class, or functools.partial of one): {e}") from None
  started = time.perf_counter()
  log = open(log_path, "w", encoding="utf-8") if log_path else None
  executor = _Executor(make_game, render, workers, start_method) if tasks else None
  gen_s = env_s = 0.0
  episodes: list[EpisodeSummary] = []
  batch_sizes: list[int] = []
  generated = 0

  def write(record: dict) -> None:
    if log:
      log.write(json.dumps(record, ensure_ascii=False) + "\n")

  def run(commands):
    nonlocal env_s
    t0 = time.perf_counter()
    out = executor.run(commands)
    env_s += time.perf_counter() - t0
    return out

  def info_fields(info: dict) -> dict:
    fields = dict(score=float(info.get("score", 0.0)), won=bool(info.get("won", False)),
                  moves=info.get("moves"))
    if log_admissible:
      fields["admissible"] = _jsonable(info.get("admissible"))
    return fields

  def described(g):
    describe = getattr(g, "describe", None)
    return describe() if describe else type(g).__name__

  write(dict(kind="run", format=LOG_FORMAT, tasks=len(tasks), batch_size=batch_size,
             max_turns=max_turns, workers=workers, seed=seed, pick=pick,
             generator=described(generator),
             retry=None if retry is None else described(retry),
             meta=_jsonable(dict(meta or {}))))
  queue = collections.deque(enumerate(tasks))
  live: dict[int, dict] = {}

  def start(slots: list[int], closing: list[int]) -> None:
    """Closes the games of ``closing`` and starts the next queued tasks in ``slots``."""
    commands = [("close", s) for s in closing]
    starting = []
    for s in slots:
      if not queue:
        break
      episode, task = queue.popleft()
      reset_seed = None if seed is None else seed + episode
      commands.append(("reset", s, task, reset_seed))
      starting.append((s, episode, task, reset_seed))
    if not commands:
      return
    results = run(commands)[len(closing):]
    for (s, episode, task, reset_seed), res in zip(starting, results):
      info = res["info"]
      write(dict(kind="reset", episode=episode, task=task_record(task), seed=reset_seed,
                 observation=res["observation"], goal=str(info.get("goal", "")),
                 **info_fields(info)))
      live[s] = dict(episode=episode, task=task, seed=reset_seed, context=res["context"],
                     turn=0, ret=0.0, parse_failures=0, rejected=0, stalled=0, tokens=0,
                     cuts=0, score=float(info.get("score", 0.0)), won=bool(info.get("won")),
                     went_wrong=False)

  try:
    start(list(range(batch_size)), [])
    while live:
      slots = sorted(live)
      batch_sizes.append(len(slots))
      retried = [retry is not None and live[s]["went_wrong"] for s in slots]
      outputs = [None] * len(slots)
      t0 = time.perf_counter()
      for name, gen, flag in (("generator", generator, False), ("retry", retry, True)):
        rows = [i for i, r in enumerate(retried) if r == flag]
        if not rows:
          continue
        answered = gen([live[slots[i]]["context"] for i in rows])
        if len(answered) != len(rows):
          raise RuntimeError(f"{name}: returned {len(answered)} outputs for {len(rows)} "
                             "contexts")
        for i, o in zip(rows, answered):
          outputs[i] = o
      gen_s += time.perf_counter() - t0
      parsed = [text_agent.parse_output(o.text, pick=pick) for o in outputs]
      results = run([("step", s, o.text, p.action, p.error, live[s]["turn"] + 1 >= max_turns)
                     for s, o, p in zip(slots, outputs, parsed)])
      finished = []
      for s, out, p, res, again in zip(slots, outputs, parsed, results, retried):
        g = live[s]
        info = res["info"]
        verdict = info.get("harness") if p.action is not None else None
        g["turn"] += 1
        g["ret"] += res["reward"]
        g["tokens"] += out.num_tokens
        generated += out.num_tokens
        g["cuts"] += bool(out.prompt_cut)
        g["parse_failures"] += p.action is None
        g["rejected"] += _flag(verdict, "accepted") is False
        g["stalled"] += bool(_flag(verdict, "stalled"))
        g["went_wrong"] = (p.action is None or _flag(verdict, "accepted") is False
                           or bool(_flag(verdict, "stalled")))
        g["score"], g["won"] = float(info.get("score", g["score"])), bool(info.get("won"))
        done = res["terminated"] or res["truncated"] or g["turn"] >= max_turns
        write(dict(kind="turn", episode=g["episode"], task=g["task"].ident, turn=g["turn"] - 1,
                   batch=len(batch_sizes) - 1, context=g["context"],
                   prompt_tokens=out.prompt_tokens, prompt_cut=out.prompt_cut,
                   output=out.text, output_tokens=out.num_tokens, retry=again,
                   reasoning=p.reasoning, action=p.action, parse_error=p.error,
                   harness=_jsonable(verdict), observation=res["observation"],
                   reward=res["reward"], **info_fields(info), terminated=res["terminated"],
                   truncated=res["truncated"], done=bool(done)))
        if done:
          end = ("won" if g["won"] else "lost" if res["terminated"] else
                 "truncated" if res["truncated"] else "max_turns")
          summary = EpisodeSummary(
              episode=g["episode"], task=g["task"].ident, seed=g["seed"], won=g["won"],
              score=g["score"], ret=g["ret"], turns=g["turn"], end=end,
              parse_failures=g["parse_failures"], rejected=g["rejected"], stalled=g["stalled"],
              generated_tokens=g["tokens"], prompt_cuts=g["cuts"])
          episodes.append(summary)
          write(dict(kind="episode", **dataclasses.asdict(summary)))
          finished.append(s)
        else:
          g["context"] = res["context"]
      for s in finished:
        del live[s]
      start(finished, finished)
      if log:
        log.flush()
  finally:
    if executor is not None:
      executor.close()
    if log:
      log.close()
  episodes.sort(key=lambda e: e.episode)
  return RolloutResult(episodes=episodes, batch_sizes=batch_sizes, generated_tokens=generated,
                       seconds=time.perf_counter() - started, generate_seconds=gen_s,
                       env_seconds=env_s)


# -- logs and replay -------------------------------------------------------------------------


def read_log(path: str) -> list[dict]:
  """The records of a rollout log, in order (a truncated last line is dropped)."""
  records = []
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if i == len(lines) - 1:  # a run killed mid-write
        break
      raise ValueError(f"{path}: line {i + 1} is not JSON") from None
  if records and records[0].get("format") != LOG_FORMAT:
    raise ValueError(f"{path}: expected a '{LOG_FORMAT}' log, got format "
                     f"{records[0].get('format')!r}")
  return records


def episodes(records: Iterable[dict]) -> dict[int, list[dict]]:
  """``{episode id: its records}`` (reset, turns, episode summary) in log order."""
  out: dict[int, list[dict]] = collections.defaultdict(list)
  for r in records:
    if "episode" in r and r.get("kind") in ("reset", "turn", "episode"):
      out[int(r["episode"])].append(r)
  return dict(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class ReplayResult:
  """What :func:`replay` found: ``mismatches`` lists ``(turn, field, logged, replayed)``
  (turn -1: the reset); ``steps`` counts the actions re-executed."""

  episode: int
  task: str
  steps: int
  mismatches: list

  @property
  def ok(self) -> bool:
    return not self.mismatches


def replay(episode_records: Sequence[dict], make_game: Callable[[GameTask], Any]
           ) -> ReplayResult:
  """Re-executes one episode's logged actions on a fresh game and compares its answers.

  The game is ``make_game(task)`` reset with the logged seed; each turn with an action is
  stepped (turns without one executed nothing and must show
  :data:`PARSE_ERROR_OBSERVATION`), and the observation, reward, score, won and terminated
  flags are compared with the log.

  Raises:
    ValueError: the records hold no ``"reset"`` record, or turns of several episodes.
  """
  resets = [r for r in episode_records if r.get("kind") == "reset"]
  if len(resets) != 1:
    raise ValueError(f"episode_records: expected one 'reset' record, got {len(resets)}")
  reset = resets[0]
  turns = sorted((r for r in episode_records if r.get("kind") == "turn"), key=lambda r: r["turn"])
  if any(r["episode"] != reset["episode"] for r in turns):
    raise ValueError("episode_records: turns of several episodes")
  task = task_from_record(reset)
  game = make_game(task)
  mismatches = []
  steps = 0
  try:
    obs, info = game.reset(seed=reset["seed"])
    if obs != reset["observation"]:
      mismatches.append((-1, "observation", reset["observation"], obs))
    for r in turns:
      if r["action"] is None:
        if r["observation"] != PARSE_ERROR_OBSERVATION:
          mismatches.append((r["turn"], "observation", r["observation"], PARSE_ERROR_OBSERVATION))
        continue
      obs, reward, terminated, _, info = game.step(r["action"])
      steps += 1
      replayed = dict(observation=obs, reward=float(reward), score=float(info.get("score", 0.0)),
                      won=bool(info.get("won", False)), terminated=bool(terminated))
      for name, value in replayed.items():
        if r[name] != value:
          mismatches.append((r["turn"], name, r[name], value))
  finally:
    game.close()
  return ReplayResult(episode=int(reset["episode"]), task=task.ident, steps=steps,
                      mismatches=mismatches)
