"""Teachers and students for the text games, built locally, and their evaluation.

`build_agent(cfg, directory)` makes, without any download, a small Qwen3-architecture agent
that plays ALFWorld through the harness (config: `configs/text_agents.py`; docs/text_agents.md):

1. walkthroughs of the record-based expert (`harnax.envs.text.experts`) on the **seen** tasks,
   played through the harness with both components on; every turn is one example: the prompt
   is the context the agent sees (`HarnessedGame.context(window=...)`, in the chat template),
   the output the expert's `Think: <reasoning from the record>\\nAction: <command>`;
2. a byte-level BPE tokenizer trained on those prompts and outputs;
3. a Qwen3 model of the config's size (teacher or student), trained by supervised next-token
   learning on the outputs (`harnax.train.train_sft`);
4. the model, the tokenizer and `manifest.json` in one Hugging Face directory (loadable by
   harnax and transformers). A config that names an existing HF directory instead
   (`cfg.checkpoint`) skips all of this: any Qwen3 / Gemma 3 checkpoint can be the teacher.

`evaluate(model_dir, tasks, setting)` plays tasks with batched LM rollouts
(`harnax.train.rollouts`) under one harness setting of docs/text_eval.md and returns the
per-episode traces the HAD metrics read (`harnax.studies.text_metrics`).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
import random
import re
import shutil
import tempfile
import time
from typing import Callable, Sequence

import numpy as np

from harnax import models
from harnax import train as train_lib
from harnax.envs.text import HarnessConfig
from harnax.envs.text import HarnessedGame
from harnax.envs.text import alfworld
from harnax.envs.text import experts
from harnax.envs.text import scienceworld
from harnax.envs.text.base import GameTask
from harnax.models import tokenizer as tokenizer_lib
from harnax.policies import text_agent
from harnax.studies import base_model
from harnax.studies import text_metrics
from harnax.train import rollouts

Log = Callable[[str], None]
MANIFEST = "manifest.json"
FORMAT = "harnax-text-agent/1"

# The evaluation settings of the HAD paper (docs/text_eval.md): which components are on.
SETTINGS = {
    "with_harness": (True, True),
    "harness_removed": (False, False),
    "state_tracking_hidden": (False, True),
    "action_monitoring_hidden": (True, False),
}


GAMES = {"alfworld": alfworld, "scienceworld": scienceworld}


@dataclasses.dataclass(frozen=True)
class HarnessedGameMaker:
  """Picklable ``GameTask -> HarnessedGame`` for rollouts (worker processes build games).

  ALFWorld games list their admissible commands (the monitor's authority). ScienceWorld's
  list is incomplete and costs a JVM round trip per step (docs/text_games.md), but without it
  the monitor knows only the words the agent has read and rejects valid commands (a door in
  a room not yet looked at), so it is on by default.
  """

  state_tracking: bool = True
  action_monitoring: bool = True
  max_steps: int = 50
  admissible: bool = True

  def __call__(self, task: GameTask) -> HarnessedGame:
    config = HarnessConfig(state_tracking=self.state_tracking,
                           action_monitoring=self.action_monitoring, max_turns=self.max_steps)
    if task.game == "alfworld":
      env = alfworld.make(task, max_steps=self.max_steps)
    elif task.game == "scienceworld":
      env = scienceworld.make(task, max_steps=self.max_steps, admissible=self.admissible)
    else:
      raise ValueError(f"task.game: expected one of {tuple(GAMES)}, got {task.game!r}")
    return HarnessedGame(env, config)


@dataclasses.dataclass(frozen=True)
class WindowContext:
  """Picklable renderer: the harnessed game's own context with the last ``window`` turns."""

  window: int = 2

  def __call__(self, game, history) -> str:
    context = game.context(window=self.window)
    if history.steps and history.steps[-1].action is None:
      # An output without an action never reaches the game; say so, or a greedy agent would
      # see the same context, write the same output and never leave.
      context += rollouts.PARSE_ERROR_OBSERVATION + "\n"
    return context


def _known_types(game: str) -> tuple[str, ...]:
  return alfworld.TASK_TYPES if game == "alfworld" else scienceworld.ALL_TASK_NAMES


def check_config(cfg) -> None:
  """Raises ValueError naming the first config field out of range."""
  if cfg.game not in GAMES:
    raise ValueError(f"game: expected one of {tuple(GAMES)}, got {cfg.game!r}")
  for field in ("per_type", "max_steps", "window"):
    value = cfg[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if field == "window"
                                                                          else 1):
      raise ValueError(f"{field}: expected a positive int, got {value!r}")
  aug = cfg.get("augment", None)
  if aug is not None:
    copies = aug.copies
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
      raise ValueError(f"augment.copies: expected an int >= 0, got {copies!r}")
    if copies and cfg.game != "alfworld":
      raise ValueError(f"augment.copies: relabeling knows ALFWorld's instance names only; "
                       f"expected 0 for {cfg.game!r}, got {copies}")
    repeats = aug.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
      raise ValueError(f"augment.repeats: expected an int >= 1, got {repeats!r}")
    verbs = aug.get("repeat_verbs", ())
    if isinstance(verbs, str) or not all(isinstance(v, str) and v for v in verbs):
      raise ValueError(f"augment.repeat_verbs: expected a tuple of verbs, got {verbs!r}")
    rejections = aug.get("rejections", 0.0)
    if isinstance(rejections, bool) or not isinstance(rejections, (int, float)) or not (
        0 <= rejections <= 1):
      raise ValueError(f"augment.rejections: expected a probability in [0, 1], got "
                       f"{rejections!r}")
    if rejections and cfg.game != "alfworld":
      raise ValueError(f"augment.rejections: mistaken commands are written for ALFWorld only; "
                       f"expected 0 for {cfg.game!r}, got {rejections}")
    bare = aug.get("bare", 0.0)
    if isinstance(bare, bool) or not isinstance(bare, (int, float)) or not 0 <= bare <= 1:
      raise ValueError(f"augment.bare: expected a probability in [0, 1], got {bare!r}")
  for field in ("temperature", "retry_temperature"):
    temperature = cfg.eval.get(field, 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        0 <= temperature < float("inf")):
      raise ValueError(f"eval.{field}: expected a finite number >= 0, got {temperature!r}")
  init_dir = cfg.get("init_dir", None)
  if init_dir and not os.path.isfile(os.path.join(init_dir, "config.json")):
    raise ValueError(f"init_dir: expected a Hugging Face model directory (with config.json), "
                     f"got {init_dir!r}")
  data_dir = cfg.get("data_dir", None)
  if data_dir and not os.path.isfile(os.path.join(data_dir, DATA_MANIFEST)):
    raise ValueError(f"data_dir: expected a directory written by prepare_data (with "
                     f"{DATA_MANIFEST}), got {data_dir!r}")
  steps = cfg.sft.num_steps
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < (0 if init_dir else 1):
    raise ValueError(f"sft.num_steps: expected an int >= 1 (>= 0 with init_dir), got {steps!r}")
  d = cfg.dagger
  for field, low in (("rounds", 0), ("num_steps", 1), ("batch_size", 1), ("repeats", 1)):
    value = d.get(field, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"dagger.{field}: expected an int >= {low}, got {value!r}")
  dagger_lr = d.get("learning_rate", None)
  if dagger_lr is not None and (isinstance(dagger_lr, bool) or not isinstance(
      dagger_lr, (int, float)) or not 0 < dagger_lr < float("inf")):
    raise ValueError(f"dagger.learning_rate: expected None (sft.learning_rate) or a finite "
                     f"number > 0, got {dagger_lr!r}")
  dagger_per_type = d.get("per_type", None)
  if dagger_per_type is not None and (isinstance(dagger_per_type, bool) or not isinstance(
      dagger_per_type, int) or dagger_per_type < 1):
    raise ValueError(f"dagger.per_type: expected None or an int >= 1, got {dagger_per_type!r}")
  rooms = cfg.get("rooms", None)
  if rooms is not None and (cfg.game != "alfworld" or isinstance(rooms, str) or not rooms
                            or any(r not in alfworld.ROOM_TYPES for r in rooms)):
    raise ValueError(f"rooms: expected None or a non-empty tuple of ALFWorld's room types "
                     f"{tuple(alfworld.ROOM_TYPES)} (ALFWorld only), got {rooms!r}")
  known = _known_types(cfg.game)
  bad = [t for t in cfg.task_types if t not in known]
  if bad or not cfg.task_types:
    raise ValueError(f"task_types: expected a non-empty subset of {cfg.game}'s task types "
                     f"{known}, got {tuple(cfg.task_types)!r}")


def game_tasks(game: str, split: str, *, per_type: int, task_types, seed: int,
               rooms=None) -> list[GameTask]:
  """`per_type` instances of each task type of `game` in `split` (deterministic per seed;
  ALFWorld: from the floor plans of `rooms`, None for every room type)."""
  if game == "alfworld":
    return alfworld.tasks(split, per_type=per_type, task_types=tuple(task_types), seed=seed,
                          rooms=tuple(rooms or alfworld.ROOM_TYPES))
  if rooms is not None:
    raise ValueError(f"rooms: room types are ALFWorld's; expected None for {game!r}")
  return scienceworld.tasks(split, task_names=tuple(task_types), per_task=per_type, seed=seed)


def _expert(game: HarnessedGame, info: dict):
  """The expert's next-step function for one episode: ALFWorld's record-based expert, or
  ScienceWorld's gold path without the steps the harness would reject (no-ops such as opening
  an open door: the game ignores them too)."""
  if game.task.game == "alfworld":
    goal = experts.parse_alfworld_goal(info["goal"])
    return lambda info: experts.alfworld_step(goal, game.record, info["admissible"])
  plan = list(game.expert_plan())

  def next_step(info):
    while plan and not game.harness.check(plan[0]).accepted:
      plan.pop(0)
    action = plan.pop(0) if plan else "look around"
    return experts.ExpertStep(action, experts.scienceworld_thought(game.record, action))
  return next_step


def walkthroughs(tasks, *, window: int, max_steps: int, rejections: float = 0.0,
                 bare: float = 0.0, seed: int = 0) -> tuple[list[dict], dict]:
  """The expert's turns on `tasks`, through the full harness.

  Args:
    tasks: the games to play.
    window: recent turns shown in each example's context.
    max_steps: the expert's actions per episode.
    rejections: ALFWorld: before each expert action, with this probability, a mistaken command
      (:func:`experts.alfworld_mistakes`) is played first. The monitor rejects it (the game
      does not see it) and the expert's action follows with the rejection and its feedback in
      the context. The mistake is never a training target; the turn after it is. 0: off.
    bare: with this probability, an expert turn is also given as a second example in the
      context without the harness (the harness-removed rendering: no record, no monitor
      feedback), its output the expert's action after a thought that cites no record
      (:func:`bare_output`). A teacher that has seen such turns answers HAD's
      without-harness query (a⁻) with an action instead of a record of its own. 0: off.
    seed: the draws of `rejections` and of `bare`.

  Returns:
    (examples, summary): one ``{"task", "context", "output", "action"}`` per expert turn,
    and one more with ``"bare": True`` per turn drawn by `bare`; the summary counts
    episodes, wins, turns (rejected ones included), rejections and bare examples.
  """
  if not 0.0 <= rejections <= 1.0:
    raise ValueError(f"rejections: expected a probability in [0, 1], got {rejections!r}")
  if not 0.0 <= bare <= 1.0:
    raise ValueError(f"bare: expected a probability in [0, 1], got {bare!r}")
  if rejections and any(t.game != "alfworld" for t in tasks):
    raise ValueError("rejections: mistaken commands are written for ALFWorld only")
  rng = random.Random(seed)
  # Its own stream, so that turning `bare` on leaves the draws of `rejections` as they were.
  bare_rng = random.Random(f"bare-{seed}")
  examples, wins, turns, rejected, bare_examples = [], 0, 0, 0, 0
  for task in tasks:
    # Rejected turns count against the harness's turn limit; leave room for them.
    game = HarnessedGameMaker(max_steps=2 * max_steps if rejections else max_steps)(task)
    _, info = game.reset()
    expert = _expert(game, info)
    for _ in range(max_steps):
      if rejections and rng.random() < rejections:
        wrong = experts.alfworld_mistakes(game.record, info["admissible"])
        if wrong:
          _, _, _, _, after = game.step(rng.choice(wrong))
          if after["harness"]["accepted"]:
            raise RuntimeError(f"walkthroughs: the monitor accepted a mistaken command in "
                               f"{task.ident}; alfworld_mistakes must write inadmissible ones")
          rejected += 1
      step = expert(info)
      examples.append({"task": task.ident, "context": game.context(window=window),
                       "output": text_agent.format_output(step.thought, step.action),
                       "action": step.action})
      if bare and bare_rng.random() < bare:
        context = game.context(window=window, state_tracking=False, action_monitoring=False)
        examples.append({"task": task.ident, "context": context,
                         "output": bare_output(step.action), "action": step.action,
                         "bare": True})
        bare_examples += 1
      _, _, terminated, truncated, info = game.step(step.action)
      if terminated or truncated:
        break
    wins += bool(info.get("won"))
    turns += len(game.turns)
    game.close()
  summary = {"episodes": len(tasks), "won": wins, "turns": turns, "rejected": rejected}
  if bare:
    summary["bare"] = bare_examples
  return examples, summary


def bare_output(action: str) -> str:
  """The output of a walkthrough turn shown without the harness: the action, after a thought
  that only states it (there is no record to cite), e.g. ``Think: I go to cabinet 3.\nAction:
  go to cabinet 3``. Short, so the bare answer ends well inside the generation budget."""
  return text_agent.format_output(f"I {action}.", action)


def dagger_examples(model, tokenizer, tasks, *, window: int, max_steps: int,
                    batch_size: int = 8, max_new_tokens: int = 64, expert_prob: float = 0.0,
                    seed: int = 0) -> tuple[list[dict], dict]:
  """Expert labels on the states the model itself reaches (DAgger, Ross et al. 2011).

  The model plays `tasks` greedily through the full harness, a batch of games at a time (one
  batched generation per turn). At every turn the record-based expert labels the state; the
  model's action is executed, or the expert's with probability `expert_prob` and whenever the
  model's output has no parsable action. ALFWorld only: ScienceWorld's expert is a gold path
  from the start state and cannot label other states.

  Returns:
    (examples, summary) as :func:`walkthroughs` (examples labelled by the expert; the summary
    counts the episodes the MODEL's play won).
  """
  if any(t.game != "alfworld" for t in tasks):
    raise ValueError("tasks: DAgger needs an expert for any state, which only ALFWorld has")
  if not 0.0 <= expert_prob <= 1.0:
    raise ValueError(f"expert_prob: expected a probability, got {expert_prob!r}")
  generator = rollouts.LMGenerator(model, tokenizer, max_new_tokens=max_new_tokens)
  rng = random.Random(seed)
  examples, wins, turns, parse_failures = [], 0, 0, 0
  tasks = list(tasks)
  for start in range(0, len(tasks), batch_size):
    live = []
    for task in tasks[start:start + batch_size]:
      game = HarnessedGameMaker(max_steps=max_steps)(task)
      _, info = game.reset()
      live.append([game, info, _expert(game, info)])
    while live:
      contexts = [game.context(window=window) for game, _, _ in live]
      outputs = generator(contexts)
      still = []
      for (game, info, expert), context, out in zip(live, contexts, outputs):
        step = expert(info)
        examples.append({"task": game.task.ident, "context": context,
                         "output": text_agent.format_output(step.thought, step.action),
                         "action": step.action})
        action = text_agent.parse_output(out.text).action
        parse_failures += action is None
        if action is None or rng.random() < expert_prob:
          action = step.action
        _, _, terminated, truncated, info = game.step(action)
        if terminated or truncated:
          wins += bool(info.get("won"))
          turns += len(game.turns)
          game.close()
        else:
          still.append([game, info, expert])
      live = still
  return examples, {"episodes": len(tasks), "won": wins, "turns": turns,
                    "parse_failures": parse_failures}


_INSTANCE = re.compile(r"\b([a-z]+) (\d+)\b")


def _instance_types() -> frozenset[str]:
  from alfworld.gen import constants  # ALFWorld's object and receptacle classes
  return frozenset(x.lower() for x in (*constants.OBJECTS, *constants.RECEPTACLES))


def relabel_instances(texts: Sequence[str], rng: random.Random, *, max_number: int = 20,
                      types: frozenset[str] | None = None) -> list[str]:
  """The texts of one example with every instance number renamed consistently.

  In ALFWorld an instance is "<class> <number>" ("cabinet 10", "apple 2"). For each class
  that occurs, its numbers are mapped one-to-one onto numbers drawn at random from
  ``1..max(max_number, largest number present)``, the same mapping in every text of the
  example (context and output), so the example stays self-consistent: the expert's action
  still names the instance its thought and the record point at. Numbers after words that are
  not classes ("turn 3") are left alone. Why: the games number instances from 1, so a small
  model learns that "1" is the likely number instead of copying the one in the record; with
  relabeled copies the number can only come from the context.

  Args:
    texts: the example's texts (e.g. ``[context, output]``).
    rng: the random source.
    max_number: the largest number drawn (>= 1).
    types: the class names (default: ALFWorld's objects and receptacles, lower case).
  Returns:
    the relabeled texts, in order.
  """
  if isinstance(max_number, bool) or not isinstance(max_number, int) or max_number < 1:
    raise ValueError(f"max_number: expected an int >= 1, got {max_number!r}")
  types = _instance_types() if types is None else types
  present: dict[str, set[int]] = {}
  for text in texts:
    for m in _INSTANCE.finditer(text):
      if m.group(1) in types:
        present.setdefault(m.group(1), set()).add(int(m.group(2)))
  mapping = {}
  for cls in sorted(present):
    old = sorted(present[cls])
    new = rng.sample(range(1, max(max_number, old[-1]) + 1), len(old))
    mapping.update({(cls, o): n for o, n in zip(old, new)})

  def rename(m):
    key = (m.group(1), int(m.group(2)))
    return f"{key[0]} {mapping[key]}" if key in mapping else m.group(0)
  return [_INSTANCE.sub(rename, text) for text in texts]


def augment(examples: Sequence[dict], *, copies: int, max_number: int = 20, seed: int = 0
            ) -> list[dict]:
  """`examples` followed by `copies` relabeled copies of each (:func:`relabel_instances`;
  context, output and action renamed together)."""
  if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
    raise ValueError(f"copies: expected an int >= 0, got {copies!r}")
  rng = random.Random(seed)
  types = _instance_types()
  out = list(examples)
  for _ in range(copies):
    for e in examples:
      context, output, action = relabel_instances(
          [e["context"], e["output"], e["action"]], rng, max_number=max_number, types=types)
      out.append(dict(e, context=context, output=output, action=action))
  return out


def repeat_verbs(examples: Sequence[dict], *, verbs: Sequence[str], repeats: int) -> list[dict]:
  """`examples` with each example whose action starts with one of `verbs` present `repeats`
  times (the copies follow the originals, in order).

  Why: in an ALFWorld walkthrough most turns are "go to" and "open"; the turns that finish a
  task ("take", "move", "heat", "cool", "clean", "use") are one or two per episode, so a small
  model learns them last and an episode fails at them. Repeating those examples raises their
  share of the gradient without changing any example.
  """
  if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats: expected an int >= 1, got {repeats!r}")
  if isinstance(verbs, str):
    raise ValueError(f"verbs: expected a sequence of verbs, got the string {verbs!r}")
  chosen = frozenset(verbs)
  rare = [e for e in examples if e["action"].split(" ", 1)[0] in chosen]
  return list(examples) + rare * (repeats - 1)


def config_dict(cfg) -> dict:
  return json.loads(cfg.to_json())


# Config fields that do not change what a build makes: how it is evaluated and where things go
# (a build on prepared data equals the one that plays the walkthroughs itself).
_NOT_BUILD_FIELDS = ("eval", "output_dir", "checkpoint", "agent_dir", "data_dir")


# Fields added to the config after builds were committed, with the value that makes what
# those builds made: a manifest without the field reads as having that value.
_LATER_FIELDS = {("augment", "bare"): 0.0}


def _with_later_fields(config: dict) -> dict:
  config = json.loads(json.dumps(config))
  for path, value in _LATER_FIELDS.items():
    node = config
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.setdefault(path[-1], value)
  return config


def build_key(config: dict) -> dict:
  """The part of a config (as `config_dict` gives it) that determines a build."""
  config = _with_later_fields(config)
  return {k: v for k, v in config.items() if k not in _NOT_BUILD_FIELDS}


def is_built(directory: str, cfg) -> bool:
  """Whether `directory` holds a build of `cfg` (equal in every field but the evaluation's and
  the paths')."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return False
  return manifest.get("format") == FORMAT and build_key(manifest.get("config") or {}) == (
      build_key(config_dict(cfg)))


def build_agent(cfg, directory: str, *, log: Log | None = None) -> str:
  """Builds (or reuses) the agent of `cfg` in `directory` (see the module docstring).

  The directory appears atomically (built beside it, renamed into place); one that holds a
  build of an identical config is reused; anything else there is an error.
  """
  check_config(cfg)
  say = log or (lambda line: None)
  directory = os.path.abspath(directory)
  if is_built(directory, cfg):
    say(f"text agent: reusing {directory} (identical config)")
    return directory

  def write(tmp):
    summary = _build(cfg, tmp, say)
    with open(os.path.join(tmp, MANIFEST), "w") as f:
      json.dump({"format": FORMAT, "config": config_dict(cfg), **summary}, f, indent=2,
                sort_keys=True)
    return summary

  summary = _replace_atomically(directory, MANIFEST, "text-agent", write)
  say(f"text agent: wrote {directory} in {summary['seconds']:.1f} s")
  return directory


def _replace_atomically(directory: str, marker: str, kind: str, write: Callable[[str], dict]
                        ) -> dict:
  """`write(tmp)` into a fresh directory beside `directory`, which is then renamed into place,
  so a reader never sees a half-written one. An existing non-empty `directory` is replaced
  only if it holds `marker` (it is one of ours). Returns what `write` returns."""
  if os.path.exists(directory) and os.listdir(directory) and not os.path.exists(
      os.path.join(directory, marker)):
    raise ValueError(f"directory: {directory} exists and is not a {kind} directory (no "
                     f"{marker}); refusing to replace it")
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.{kind}-", dir=parent)
  try:
    result = write(tmp)
    if os.path.exists(directory):
      shutil.rmtree(directory)
    os.rename(tmp, directory)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return result


def train_tasks(cfg) -> list[GameTask]:
  return game_tasks(cfg.game, "seen", per_type=int(cfg.per_type), task_types=cfg.task_types,
                    seed=int(cfg.task_seed), rooms=cfg.get("rooms", None))


def _expert_examples(cfg, say: Log) -> tuple[list[dict], dict, list[GameTask]]:
  """The training examples of `cfg` (steps 1 of the module docstring, with the repeats and the
  relabeled copies of `cfg.augment`), their walkthrough summary and the tasks played."""
  t0 = time.time()
  tasks = train_tasks(cfg)
  aug = cfg.get("augment", None)
  rejections = float(aug.get("rejections", 0.0)) if aug is not None else 0.0
  bare = float(aug.get("bare", 0.0)) if aug is not None else 0.0
  examples, walk = walkthroughs(tasks, window=int(cfg.window), max_steps=int(cfg.max_steps),
                                rejections=rejections, bare=bare, seed=int(cfg.seed))
  say(f"text agent: {len(examples)} expert turns from {walk['episodes']} seen tasks "
      f"({walk['won']} won, {walk['rejected']} after a rejected mistake, "
      f"{walk.get('bare', 0)} also without the harness, {time.time() - t0:.1f} s)")
  if aug is not None and int(aug.get("repeats", 1)) > 1:
    before = len(examples)
    examples = repeat_verbs(examples, verbs=tuple(aug.repeat_verbs), repeats=int(aug.repeats))
    say(f"text agent: {len(examples) - before} repeats of the turns whose verb is one of "
        f"{tuple(aug.repeat_verbs)}")
  if aug is not None and int(aug.copies):
    examples = augment(examples, copies=int(aug.copies), max_number=int(aug.max_number),
                       seed=int(cfg.seed))
    say(f"text agent: {len(examples)} examples with {int(aug.copies)} relabeled copies")
  return examples, walk, tasks


def _train_tokenizer(cfg, examples: Sequence[dict], path: str):
  texts = [e["context"] for e in examples] + [e["output"] for e in examples]
  texts.append(text_agent.SYSTEM_PROMPT)
  return tokenizer_lib.train_tokenizer(
      texts, path, vocab_size=int(cfg.tokenizer.vocab_size),
      min_frequency=int(cfg.tokenizer.min_frequency),
      pre_tokenize=str(cfg.tokenizer.get("pre_tokenize", "runs")))


DATA_FORMAT = "harnax-text-agent-data/1"
DATA_EXAMPLES = "examples.jsonl.gz"
DATA_MANIFEST = "data.json"
# The config fields that determine the prepared data (`prepare_data`); a build that reads a
# data directory must agree with it on each.
DATA_FIELDS = ("game", "task_types", "per_type", "task_seed", "rooms", "max_steps", "window",
               "seed", "tokenizer", "augment")


def _data_key(config: dict) -> dict:
  config = _with_later_fields(config)
  return {k: config.get(k) for k in DATA_FIELDS}


def prepare_data(cfg, directory: str, *, log: Log | None = None) -> str:
  """Plays the walkthroughs of `cfg` and writes its training data to `directory`.

  The directory holds the expert's examples (augmented as `cfg.augment` says; gzipped JSON
  lines), the tokenizer trained on them (Hugging Face files) and ``data.json`` (the data's
  config fields, `DATA_FIELDS`, the walkthrough summary and the training tasks). A build with
  ``cfg.data_dir = directory`` then trains on it without the games: prepare on a machine that
  has the game engines, train on an accelerator that does not. It appears atomically; an
  existing directory is replaced only if it holds prepared data.
  """
  check_config(cfg)
  if cfg.get("init_dir", None):
    raise ValueError("init_dir: prepared data carry their own tokenizer; expected None when "
                     "preparing data")
  say = log or (lambda line: None)
  directory = os.path.abspath(directory)

  def write(tmp):
    examples, walk, tasks = _expert_examples(cfg, say)
    _train_tokenizer(cfg, examples, tmp)
    with gzip.open(os.path.join(tmp, DATA_EXAMPLES), "wt", encoding="utf-8") as f:
      for e in examples:
        f.write(json.dumps(e) + "\n")
    with open(os.path.join(tmp, DATA_MANIFEST), "w") as f:
      json.dump({"format": DATA_FORMAT, "config": _data_key(config_dict(cfg)),
                 "walkthroughs": walk, "train_tasks": [t.ident for t in tasks],
                 "num_examples": len(examples)}, f, indent=2, sort_keys=True)
    return {"num_examples": len(examples)}

  written = _replace_atomically(directory, DATA_MANIFEST, "prepared-data", write)
  say(f"text agent: prepared {written['num_examples']} examples in {directory}")
  return directory


def load_data(cfg, directory: str) -> tuple[list[dict], dict, tokenizer_lib.Tokenizer]:
  """(examples, data manifest, tokenizer) of a `prepare_data` directory made from a config
  that agrees with `cfg` on every field of `DATA_FIELDS` (else ValueError naming the field)."""
  path = os.path.join(directory, DATA_MANIFEST)
  try:
    with open(path) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"data_dir: expected a directory written by prepare_data, with "
                     f"{DATA_MANIFEST}; could not read {path} ({e})") from e
  if manifest.get("format") != DATA_FORMAT:
    raise ValueError(f"data_dir: {path} has format {manifest.get('format')!r}, expected "
                     f"{DATA_FORMAT!r}")
  want, have = _data_key(config_dict(cfg)), manifest.get("config") or {}
  for field in DATA_FIELDS:
    if want[field] != have.get(field):
      raise ValueError(f"{field}: the config says {want[field]!r} but the data in {directory} "
                       f"were prepared with {have.get(field)!r}; prepare them again or use "
                       f"the same value")
  with gzip.open(os.path.join(directory, DATA_EXAMPLES), "rt", encoding="utf-8") as f:
    examples = [json.loads(line) for line in f]
  if len(examples) != manifest.get("num_examples"):
    raise ValueError(f"data_dir: {DATA_EXAMPLES} in {directory} holds {len(examples)} examples,"
                     f" its manifest {manifest.get('num_examples')!r}; the directory is damaged")
  return examples, manifest, tokenizer_lib.Tokenizer.from_dir(directory)


def _build(cfg, path: str, say: Log) -> dict:
  t0 = time.time()
  data_dir = cfg.get("data_dir", None)
  tok = None
  if data_dir:
    # Prepared elsewhere (prepare_data): no game is played unless a DAgger round needs one.
    examples, data, tok = load_data(cfg, data_dir)
    _copy_tokenizer_files(data_dir, path)
    walk, task_idents, tasks = data["walkthroughs"], data["train_tasks"], None
    say(f"text agent: {len(examples)} prepared examples from {data_dir}")
  else:
    examples, walk, tasks = _expert_examples(cfg, say)
    task_idents = [t.ident for t in tasks]
  init_dir = cfg.get("init_dir", None)
  if init_dir:
    # Fine-tune an existing HF directory (a pretrained checkpoint, or an earlier build to
    # continue): its model and its tokenizer, whose files the new directory carries over.
    model, tok = load_agent(init_dir)
    _copy_tokenizer_files(init_dir, path)
    say(f"text agent: starting from {init_dir}")
  else:
    tok = tok or _train_tokenizer(cfg, examples, path)
    model = base_model.init_model(
        base_model.model_config(cfg, tok), seed=int(cfg.seed),
        init_std=float(cfg.model.init_std),
        qk_norm_init=float(cfg.model.get("qk_norm_init", 1.0)))
  model_cfg = model.config
  data = _encode(tok, examples, model_cfg)
  say(f"text agent: {models.param_count(model)} parameters, {data.num_examples} examples of at "
      f"most {data.ids.shape[1]} tokens, vocabulary {tok.vocab_size}")
  s = cfg.sft
  t_sft = time.time()
  trained, losses, rounds = model, [], []
  if int(s.num_steps):
    result = train_lib.train_sft(
        model, data, num_steps=int(s.num_steps), batch_size=int(s.batch_size),
        learning_rate=float(s.learning_rate), warmup_steps=int(s.warmup_steps),
        weight_decay=float(s.weight_decay), clip_norm=s.clip_norm, seed=int(cfg.seed), log=say,
        log_every=max(1, int(s.num_steps) // 5), length_bucket=int(s.length_bucket),
        prompt_weight=float(s.get("prompt_weight", 0.0)))
    trained, losses = result.model, list(result.losses)
  d = cfg.dagger
  if int(d.rounds) and tasks is None:
    tasks = train_tasks(cfg)
  played = _first_per_type(tasks or [], d.get("per_type", None))
  dagger_lr = float(d.get("learning_rate", None) or s.learning_rate)
  for r in range(int(d.rounds)):
    more, summary = dagger_examples(trained, tok, played, window=int(cfg.window),
                                    max_steps=int(cfg.max_steps), expert_prob=float(d.expert_prob),
                                    seed=int(cfg.seed) + r,
                                    batch_size=int(d.get("batch_size", 8)))
    # The model's own states are few beside the walkthroughs (a few % of the data);
    # `dagger.repeats` gives them a larger share of the gradient.
    examples += more * int(d.get("repeats", 1))
    say(f"text agent: DAgger round {r + 1}: the model won {summary['won']}/{summary['episodes']}"
        f" ({summary['parse_failures']} outputs without an action); {len(examples)} examples")
    data = _encode(tok, examples, model_cfg)
    step = train_lib.train_sft(
        trained, data, num_steps=int(d.num_steps), batch_size=int(s.batch_size),
        learning_rate=dagger_lr, warmup_steps=int(s.warmup_steps),
        weight_decay=float(s.weight_decay), clip_norm=s.clip_norm, seed=int(cfg.seed) + r + 1,
        log=say, log_every=max(1, int(d.num_steps) // 2), length_bucket=int(s.length_bucket),
        prompt_weight=float(s.get("prompt_weight", 0.0)))
    trained = step.model
    losses += list(step.losses)
    rounds.append({**summary, "examples": len(more) * int(d.get("repeats", 1)),
                   "learning_rate": dagger_lr})
  models.save_pretrained(trained, path)
  losses = np.asarray(losses)
  tail = losses[-max(1, len(losses) // 10):]
  return {"walkthroughs": walk, "dagger": rounds, "train_tasks": task_idents,
          "init": _init_summary(init_dir),
          "model": {"num_params": int(models.param_count(trained)),
                    "vocab_size": model_cfg.vocab_size},
          "training": {"num_examples": data.num_examples, "max_length": int(data.ids.shape[1]),
                       "num_steps": len(losses),
                       "initial_loss": float(losses[0]) if len(losses) else None,
                       "final_loss": float(np.mean(tail)) if len(losses) else None,
                       "seconds": time.time() - t_sft},
          "seconds": time.time() - t0}


def _first_per_type(tasks: Sequence[GameTask], per_type: int | None) -> list[GameTask]:
  """The first `per_type` tasks of each task type, in order (None: all of them)."""
  if per_type is None:
    return list(tasks)
  seen = collections.Counter()
  out = []
  for t in tasks:
    seen[t.task_type] += 1
    if seen[t.task_type] <= per_type:
      out.append(t)
  return out


def _encode(tok, examples: Sequence[dict], model_cfg) -> train_lib.SFTData:
  prompts = [text_agent.format_prompt(tok, e["context"]) for e in examples]
  data = train_lib.encode_examples(tok, prompts, [e["output"] for e in examples])
  if data.ids.shape[1] > model_cfg.max_position_embeddings:
    raise ValueError(f"model.max_position_embeddings: {model_cfg.max_position_embeddings} is "
                     f"shorter than the longest example ({data.ids.shape[1]} tokens)")
  return data


# What a Hugging Face directory keeps of its tokenizer (the fast tokenizer, its config, the
# special tokens, a chat template saved apart, and the slow tokenizer's vocabularies).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
                    "added_tokens.json", "generation_config.json")


def _copy_tokenizer_files(source: str, target: str) -> None:
  for name in _TOKENIZER_FILES:
    if os.path.isfile(os.path.join(source, name)):
      shutil.copy2(os.path.join(source, name), os.path.join(target, name))


def _init_summary(init_dir: str | None) -> dict | None:
  """What the build started from: the directory and, for one of our builds, its manifest's
  config and training summary (so a continued build names its whole lineage)."""
  if not init_dir:
    return None
  try:
    with open(os.path.join(init_dir, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    manifest = {}
  return {"dir": os.path.abspath(init_dir), "config": manifest.get("config"),
          "training": manifest.get("training"), "init": manifest.get("init")}


def load_agent(directory: str):
  """(model, tokenizer) of an agent directory (ours or any HF checkpoint directory)."""
  return models.load_pretrained(directory), tokenizer_lib.Tokenizer.from_dir(directory)


def traces_from_log(records) -> list[text_metrics.EpisodeTrace]:
  """Per-episode harness traces from a rollout log (`rollouts.read_log`). A turn without a
  parsable action counts as an action the monitor would not accept."""
  out = []
  for _, recs in sorted(rollouts.episodes(records).items()):
    turns = [r for r in recs if r.get("kind") == "turn"]
    verdicts = [r.get("harness") or {} for r in turns]
    won = any(r.get("won") for r in turns)
    out.append(text_metrics.EpisodeTrace(
        won=bool(won),
        accepted=np.array([bool(v.get("accepted", False)) for v in verdicts], bool),
        consistent=np.array([bool(v.get("consistent", True)) for v in verdicts], bool),
        stalled=np.array([bool(v.get("stalled", False)) for v in verdicts], bool)))
  return out


def evaluate(model, tokenizer, tasks, setting: str, *, window: int, max_steps: int,
             batch_size: int = 8, max_new_tokens: int = 64, workers: int = 0,
             log_path: str | None = None, temperature: float = 0.0,
             retry_temperature: float = 0.0,
             seed: int = 0) -> tuple[list[text_metrics.EpisodeTrace], dict]:
  """Plays `tasks` under one setting of :data:`SETTINGS`; returns (traces, stats).

  Greedy at ``temperature=0`` (the default); otherwise sampled at that temperature, the draws
  a function of `seed` (`rollouts.LMGenerator`). With ``retry_temperature > 0`` and action
  monitoring on in ``setting``, the turn after one that went wrong (a rejected action, a
  reported loop, no action) is sampled at that temperature instead (`rollouts.rollout`'s
  ``retry``; seeded by ``seed + 1``). Rejections and loop reports are the monitor's, so with
  the monitor hidden or removed every turn is decoded the same way."""
  if setting not in SETTINGS:
    raise ValueError(f"setting: expected one of {tuple(SETTINGS)}, got {setting!r}")
  if not 0 <= retry_temperature < float("inf"):
    raise ValueError(f"retry_temperature: expected a finite number >= 0, got "
                     f"{retry_temperature!r}")
  st, am = SETTINGS[setting]
  generator = rollouts.LMGenerator(model, tokenizer, max_new_tokens=max_new_tokens,
                                   temperature=temperature, seed=seed)
  retry = (rollouts.LMGenerator(model, tokenizer, max_new_tokens=max_new_tokens,
                                temperature=retry_temperature, seed=seed + 1)
           if retry_temperature > 0 and am else None)
  own_log = log_path is None
  if own_log:
    handle, log_path = tempfile.mkstemp(suffix=".jsonl")
    os.close(handle)
  try:
    result = rollouts.rollout(
        tasks, HarnessedGameMaker(st, am, max_steps), generator, render=WindowContext(window),
        batch_size=batch_size, max_turns=max_steps, workers=workers, log_path=log_path,
        meta={"setting": setting}, retry=retry)
    traces = traces_from_log(rollouts.read_log(log_path))
  finally:
    if own_log:
      os.remove(log_path)
  stats = {"turns": result.turns, "seconds": result.seconds,
           "tokens_per_second": result.tokens_per_second,
           "parse_failures": sum(e.parse_failures for e in result.episodes)}
  return traces, stats


def decision_accuracy(model, tokenizer, examples: Sequence[dict], *, batch_size: int = 16,
                      max_new_tokens: int = 64) -> dict:
  """How often the model's greedy action equals the expert's on expert-labelled states.

  A fast check of a build, minutes instead of the hour full episodes take: winning a
  20-step episode needs nearly every decision right (0.95 per step wins 36 % of them), so a
  build whose per-state accuracy is far from 1 will not win, whatever its training loss.

  Args:
    model, tokenizer: the agent.
    examples: ``{"context", "action"}`` dicts, e.g. :func:`walkthroughs` of held-out tasks.
    batch_size: contexts per batched generation.
    max_new_tokens: generation budget per output.

  Returns:
    ``{"overall": Rate, "by_verb": {verb: Rate}, "parse_failures": int}``: the share of
    states whose parsed action equals the expert's action (an output without an action
    counts as wrong), overall and per the expert's command verb ("go", "open", "take", …).
  """
  examples = list(examples)
  if not examples:
    raise ValueError("examples: expected at least one expert-labelled state")
  for i, e in enumerate(examples):
    if not isinstance(e, dict) or not {"context", "action"} <= set(e):
      raise ValueError(f"examples[{i}]: expected a dict with 'context' and 'action'")
  generator = rollouts.LMGenerator(model, tokenizer, max_new_tokens=max_new_tokens)
  outputs = []
  for start in range(0, len(examples), batch_size):
    outputs += generator([e["context"] for e in examples[start:start + batch_size]])
  actions = [text_agent.parse_output(o.text).action for o in outputs]
  right = [a is not None and a.strip() == e["action"].strip()
           for a, e in zip(actions, examples)]
  verbs: dict[str, list[bool]] = {}
  for e, ok in zip(examples, right):
    verbs.setdefault(e["action"].split(" ", 1)[0], []).append(ok)
  rate = lambda oks: text_metrics.Rate(int(sum(oks)), len(oks))  # noqa: E731
  return {"overall": rate(right), "by_verb": {v: rate(oks) for v, oks in sorted(verbs.items())},
          "parse_failures": sum(a is None for a in actions)}


def random_agent(tasks, *, max_steps: int, seed: int = 0) -> list[text_metrics.EpisodeTrace]:
  """The random baseline: a uniformly drawn admissible command each turn, through the harness."""
  rng = random.Random(seed)
  out = []
  for task in tasks:
    game = HarnessedGameMaker(max_steps=max_steps)(task)
    _, info = game.reset()
    for _ in range(max_steps):
      _, _, terminated, truncated, info = game.step(rng.choice(sorted(info["admissible"])))
      if terminated or truncated:
        break
    out.append(text_metrics.EpisodeTrace(
        won=bool(info.get("won")), accepted=np.array([t.accepted for t in game.turns], bool),
        consistent=np.array([t.consistent for t in game.turns], bool),
        stalled=np.array([t.stalled for t in game.turns], bool)))
    game.close()
  return out


# -- the evaluation study (scripts/text_agents.py) -------------------------------------------


def eval_tasks(cfg) -> dict[str, list[GameTask]]:
  """Seen and unseen evaluation tasks (seen: other instances than the training ones)."""
  return {split: game_tasks(cfg.game, split, per_type=int(cfg.eval.per_type),
                            task_types=cfg.task_types, seed=int(cfg.eval.task_seed),
                            rooms=cfg.get("rooms", None))
          for split in ("seen", "unseen")}


def run(cfg, *, log: Log | None = None) -> dict:
  """Builds (or loads) the agent, then evaluates it and the random baseline under every setting
  on seen and unseen tasks, and the agent's actions at the expert's states of the same tasks
  (``cfg.eval.decision_states`` per split; 0 skips). With ``cfg.eval.log_episodes`` every
  turn of the agent's episodes is kept in ``<output_dir>/episodes/<setting>-<split>.jsonl``
  (`rollouts.read_log`, `rollouts.replay`). Returns ``{"agent": {setting: {split:
  traces}}, "random": {split: traces}, "decisions": {split: decision_accuracy(...)}, "stats":
  ..., "agent_dir": ...}``."""
  say = log or (lambda line: None)
  if cfg.checkpoint and not os.path.isfile(os.path.join(cfg.checkpoint, "config.json")):
    raise ValueError(f"checkpoint: expected a Hugging Face model directory (with config.json), "
                     f"got {cfg.checkpoint!r}")
  directory = cfg.checkpoint or build_agent(cfg, cfg.agent_dir, log=say)
  model, tok = load_agent(directory)
  tasks = eval_tasks(cfg)
  agent, stats = {}, {}
  episodes = os.path.join(cfg.output_dir, "episodes") if cfg.eval.get("log_episodes") else None
  if episodes:
    os.makedirs(episodes, exist_ok=True)
  for setting in cfg.eval.settings:
    agent[setting] = {}
    for split, ts in tasks.items():
      log_path = os.path.join(episodes, f"{setting}-{split}.jsonl") if episodes else None
      traces, st = evaluate(model, tok, ts, setting, window=int(cfg.window),
                            max_steps=int(cfg.eval.max_steps), batch_size=int(cfg.eval.batch_size),
                            max_new_tokens=int(cfg.eval.max_new_tokens),
                            temperature=float(cfg.eval.get("temperature", 0.0)),
                            retry_temperature=float(cfg.eval.get("retry_temperature", 0.0)),
                            seed=int(cfg.seed), log_path=log_path)
      agent[setting][split], stats[f"{setting}/{split}"] = traces, st
      say(f"text agents: {setting} {split}: success "
          f"{text_metrics.success(traces)} ({st['seconds']:.0f} s)")
  rnd = {split: random_agent(ts, max_steps=int(cfg.eval.max_steps), seed=int(cfg.seed))
         for split, ts in tasks.items()}
  decisions = {}
  cap = int(cfg.eval.get("decision_states", 0) or 0)
  for split, ts in tasks.items() if cap else ():
    # The expert's walkthroughs of the evaluation tasks: per-state accuracy (decision_accuracy).
    examples, _ = walkthroughs(ts, window=int(cfg.window), max_steps=int(cfg.eval.max_steps))
    if len(examples) > cap:
      examples = random.Random(int(cfg.seed)).sample(examples, cap)
    decisions[split] = decision_accuracy(model, tok, examples,
                                         batch_size=int(cfg.eval.batch_size),
                                         max_new_tokens=int(cfg.eval.max_new_tokens))
    say(f"text agents: {split} expert states: {decisions[split]['overall']} of the agent's "
        f"actions are the expert's")
  return {"agent": agent, "random": rnd, "stats": stats, "agent_dir": directory,
          "decisions": decisions}


def _cell(rate: text_metrics.Rate, *, interval: bool = False) -> str:
  if not rate.trials:
    return "n/a"
  bounds = ""
  if interval:
    lo, hi = rate.interval()
    bounds = f" [{100 * lo:.0f}, {100 * hi:.0f}]"
  return f"{100 * rate.value:.1f}{bounds} ({rate.successes}/{rate.trials})"


def _decoding(cfg) -> str:
  t = float(cfg.eval.get("temperature", 0.0))
  r = float(cfg.eval.get("retry_temperature", 0.0))
  text = "greedy decoding" if t == 0 else f"sampled at temperature {t:g} (seed {cfg.seed})"
  if r > 0:
    text += (f"; the turn after a rejected action, a reported loop or no action sampled at "
             f"temperature {r:g}")
  return text


def render(cfg, result: dict) -> str:
  """The report: the HAD paper's tables' shape (docs/text_eval.md)."""
  from harnax.studies.results import markdown_table

  agent, rnd = result["agent"], result["random"]
  lines = [f"# Text agents on {'ALFWorld' if cfg.game == 'alfworld' else 'ScienceWorld'}", "",
           f"Agent: `{os.path.basename(result['agent_dir'])}`; {len(next(iter(rnd.values())))} "
           f"tasks per split ({', '.join(cfg.task_types)}), at most {cfg.eval.max_steps} turns, "
           f"{_decoding(cfg)}, context window {cfg.window} turns.", "",
           "## Success (%) by harness setting", "",
           "Cells: success % [95 % Wilson interval] (won/tasks).", ""]
  header = ["agent"] + [f"{s} / {split}" for s in agent for split in ("seen", "unseen")]
  rows = [["LM agent"] + [_cell(text_metrics.success(agent[s][split]), interval=True)
                          for s in agent for split in ("seen", "unseen")]]
  rows.append(["random admissible"] + [
      _cell(text_metrics.success(rnd[split]), interval=True) if s == "with_harness" else "-"
      for s in agent for split in ("seen", "unseen")])
  lines += [markdown_table(header, rows), "", "## How the agent acts through the harness", ""]
  header = ["agent", "setting", "harness utilization", "stall prevention",
            "stall escape (5 turns)"]
  rows = []
  for name, by_setting in (("LM agent", agent), ("random admissible", {"with_harness": rnd})):
    for s, splits in by_setting.items():
      traces = [t for split in ("seen", "unseen") for t in splits[split]]
      m = text_metrics.summarize(traces)
      rows.append([name, s, _cell(m["harness_utilization"]), _cell(m["stall_prevention"]),
                   _cell(m["stall_escape"])])
  lines += [markdown_table(header, rows), ""]
  decisions = result.get("decisions") or {}
  if decisions:
    verbs = sorted({v for d in decisions.values() for v in d["by_verb"]})
    lines += ["## The agent's action at the expert's states (% equal to the expert's)", "",
              "States of the expert's walkthroughs of the same tasks (at most "
              f"{cfg.eval.decision_states} per split), greedy; an episode needs nearly all "
              "of them right.", ""]
    header = ["split", "all"] + verbs + ["no action"]
    rows = [[split, _cell(d["overall"])]
            + [_cell(d["by_verb"][v]) if v in d["by_verb"] else "-" for v in verbs]
            + [str(d["parse_failures"])] for split, d in decisions.items()]
    lines += [markdown_table(header, rows), ""]
  return "\n".join(lines)


def metrics(result: dict) -> dict:
  out = {"agent_dir": result["agent_dir"], "stats": result["stats"]}
  for name, by_setting in (("agent", result["agent"]),
                           ("random", {"with_harness": result["random"]})):
    for s, splits in by_setting.items():
      for split, traces in splits.items():
        out[f"{name}/{s}/{split}"] = {k: {"successes": v.successes, "trials": v.trials}
                                      for k, v in text_metrics.summarize(traces).items()}
  for split, d in (result.get("decisions") or {}).items():
    out[f"agent/decisions/{split}"] = {
        "overall": {"successes": d["overall"].successes, "trials": d["overall"].trials},
        "by_verb": {v: {"successes": r.successes, "trials": r.trials}
                    for v, r in d["by_verb"].items()},
        "parse_failures": d["parse_failures"]}
  return out
