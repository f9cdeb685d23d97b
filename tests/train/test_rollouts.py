"""Batched text-game rollouts: the per-turn JSONL log, queue replacement, worker processes,
replay, parse failures, and batched generation against one prompt at a time.

Most tests play `Corridor`, a small deterministic stand-in for a text game written here (walk
north to room K); the `slow` tests play real ALFWorld games (TextWorld's PDDL engine).
"""

import dataclasses
import functools
import json

import numpy as np
import pytest

from harnax import models
from harnax.envs.text import base
from harnax.models import tokenizer as tokenizer_lib
from harnax.policies import text_agent
from harnax.train import rollouts


class Corridor:
  """Rooms 0..K along a corridor; the task is to reach room K (`params = (K,)`).

  "go north" / "go south" move (the walls stop you), "look" describes the room, anything
  else is "Nothing happens.". The game reports a harness-like verdict in `info["harness"]`
  (`accepted`: the command is admissible; `stalled`: the same room three turns running),
  and truncates after `limit` moves.
  """

  COMMANDS = ("go north", "go south", "look")

  def __init__(self, task, limit=50):
    self.task = task
    self.goal_room = int(task.params[0])
    self.limit = limit

  def _info(self, verdict=None):
    info = {"goal": f"reach room {self.goal_room}", "admissible": self.COMMANDS,
            "won": self.room == self.goal_room, "score": self.room / self.goal_room,
            "moves": self.moves}
    if verdict is not None:
      info["harness"] = verdict
    return info

  def reset(self, *, seed=None, options=None):
    self.room, self.moves, self.rooms = 0, 0, [0]
    self.seed = seed
    return (f"You are in room 0 of a corridor (seed {seed}). Your task is to: reach room "
            f"{self.goal_room}."), self._info()

  def step(self, action):
    before = self.room / self.goal_room
    self.moves += 1
    if action == "go north":
      self.room = min(self.room + 1, self.goal_room)
      obs = f"You walk north into room {self.room}."
    elif action == "go south":
      self.room = max(self.room - 1, 0)
      obs = f"You walk south into room {self.room}."
    elif action == "look":
      obs = f"You are in room {self.room}."
    else:
      obs = "Nothing happens."
    self.rooms.append(self.room)
    verdict = {"accepted": action in self.COMMANDS, "consistent": True,
               "stalled": len(self.rooms) >= 3 and len(set(self.rooms[-3:])) == 1}
    info = self._info(verdict)
    return obs, info["score"] - before, info["won"], self.moves >= self.limit, info

  def expert_plan(self):
    return ["go north"] * (self.goal_room - self.room)

  def close(self):
    pass


def corridor_tasks(distances):
  return [base.GameTask(game="corridor", task_type="walk", split="seen",
                        ident=f"corridor-{k}-{i}", params=(k,))
          for i, k in enumerate(distances)]


class Scripted:
  """A generator that answers every context with `script(context)` (no model)."""

  def __init__(self, script):
    self.script = script
    self.calls = []

  def __call__(self, contexts):
    self.calls.append(list(contexts))
    return [rollouts.Generated(text=self.script(c), num_tokens=5, prompt_tokens=len(c))
            for c in contexts]


def always_north(context):
  return "Think: the goal is north.\nAction: go north"


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
  """A byte-level BPE tokenizer trained on corridor texts and a tiny random Qwen3."""
  texts = [text_agent.SYSTEM_PROMPT, rollouts.PARSE_ERROR_OBSERVATION]
  for k in range(1, 5):
    game = Corridor(corridor_tasks([k])[0])
    texts.append(game.reset(seed=0)[0])
    for a in Corridor.COMMANDS + ("jump",):
      texts.append(text_agent.format_output("I go.", a) + "\n" + game.step(a)[0])
  tok = tokenizer_lib.train_tokenizer(texts, str(tmp_path_factory.mktemp("tok")),
                                      vocab_size=320)
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": tok.vocab_size, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 1024,
      "tie_word_embeddings": True, "eos_token_id": tok.eos_token_id,
      "pad_token_id": tok.pad_token_id})
  return models.from_config(cfg, seed=0), tok


def _generator(agent, **kw):
  model, tok = agent
  kw = dict(dict(max_new_tokens=12, length_buckets=(128, 256, 512)), **kw)
  return rollouts.LMGenerator(model, tok, **kw)


# -- the log and the schedule ---------------------------------------------------------------


def test_queue_refills_slots_and_the_log_follows_the_games(tmp_path):
  # Distances 1, 3, 2, 1, 2 with batch 2, walking north every turn. Worked by hand:
  # turn 1: ep0 (wins), ep1 | turn 2: ep2, ep1 | turn 3: ep2 (wins), ep1 (wins)
  # turn 4: ep3 (wins), ep4 | turn 5: ep4 (wins).
  log = tmp_path / "log.jsonl"
  gen = Scripted(always_north)
  res = rollouts.rollout(corridor_tasks([1, 3, 2, 1, 2]), Corridor, gen, batch_size=2,
                         max_turns=10, log_path=str(log), seed=7)
  assert res.batch_sizes == [2, 2, 2, 2, 1]
  assert [len(c) for c in gen.calls] == [2, 2, 2, 2, 1]
  assert [(e.episode, e.won, e.turns, e.end) for e in res.episodes] == [
      (0, True, 1, "won"), (1, True, 3, "won"), (2, True, 2, "won"), (3, True, 1, "won"),
      (4, True, 2, "won")]
  assert all(e.parse_failures == e.rejected == 0 and e.ret == pytest.approx(1.0)
             for e in res.episodes)

  records = rollouts.read_log(str(log))
  assert records[0]["kind"] == "run" and records[0]["batch_size"] == 2
  by_episode = rollouts.episodes(records)
  assert sorted(by_episode) == [0, 1, 2, 3, 4]
  for ep, recs in by_episode.items():
    k = [1, 3, 2, 1, 2][ep]
    kinds = [r["kind"] for r in recs]
    assert kinds == ["reset"] + ["turn"] * k + ["episode"]
    reset, turns = recs[0], recs[1:-1]
    assert reset["seed"] == 7 + ep and f"(seed {7 + ep})" in reset["observation"]
    assert reset["task"]["params"] == [k] and reset["goal"] == f"reach room {k}"
    for t, r in enumerate(turns):
      assert r["turn"] == t and r["task"] == f"corridor-{k}-{ep}"
      assert r["action"] == "go north" and r["parse_error"] is None
      assert r["reasoning"] == "the goal is north."
      assert r["observation"] == f"You walk north into room {t + 1}."
      assert r["score"] == pytest.approx((t + 1) / k) and r["reward"] == pytest.approx(1 / k)
      assert r["won"] == r["done"] == r["terminated"] == (t == k - 1)
      assert r["harness"] == {"accepted": True, "consistent": True, "stalled": False}
      assert r["moves"] == t + 1 and "admissible" not in r
    # The context of each turn: the plain renderer on what the log holds before that turn.
    assert turns[0]["context"] == reset["observation"]
    for t in range(1, k):
      shown = "\n\n".join([reset["observation"]] + [
          f"> {r['action']}\n{r['observation']}" for r in turns[:t]])
      assert turns[t]["context"] == shown
  # Turn records appear in the batched order: episodes interleave.
  order = [(r["episode"], r["turn"], r["batch"]) for r in records if r["kind"] == "turn"]
  assert order[:4] == [(0, 0, 0), (1, 0, 0), (2, 0, 1), (1, 1, 1)]


def test_parse_failures_are_counted_not_raised(tmp_path):
  outputs = iter(["Think: hmm", "Action: go north", "", "go north", "Action: jump",
                  "Action: go south", "Action: go south", "Action: go south"])
  gen = Scripted(lambda c: next(outputs))
  log = tmp_path / "log.jsonl"
  res = rollouts.rollout(corridor_tasks([3]), Corridor, gen, batch_size=1, max_turns=8,
                         log_path=str(log), log_admissible=True)
  [ep] = res.episodes
  assert (ep.turns, ep.parse_failures, ep.rejected, ep.end, ep.won) == (8, 2, 1, "max_turns",
                                                                          False)
  # Rooms after the turns: 0 (no action), 1, 1 (no action), 2, 2 (jump), 1, 0, 0 (the wall):
  # never three equal rooms in a row among the executed moves, so no stall.
  turns = [r for r in rollouts.read_log(str(log)) if r["kind"] == "turn"]
  assert [r["parse_error"] for r in turns[:3]] == ["no action line", None, "empty output"]
  assert turns[0]["observation"] == rollouts.PARSE_ERROR_OBSERVATION
  assert turns[0]["harness"] is None and turns[0]["moves"] == 0
  assert [r["moves"] for r in turns] == [0, 1, 1, 2, 3, 4, 5, 6]
  assert turns[4]["observation"] == "Nothing happens."
  assert turns[4]["harness"]["accepted"] is False
  assert turns[1]["admissible"] == list(Corridor.COMMANDS)
  # The agent is told: the next context shows the failed turn.
  assert "> (no action)\n" + rollouts.PARSE_ERROR_OBSERVATION in turns[1]["context"]
  assert ep.stalled == 0


def test_stalls_and_truncation(tmp_path):
  gen = Scripted(lambda c: "Action: look")
  res = rollouts.rollout(corridor_tasks([2]), functools.partial(Corridor, limit=4), gen,
                         batch_size=1, max_turns=10)
  [ep] = res.episodes
  # Rooms 0, 0, 0, 0, 0 after reset and four looks: stalled after turns 2, 3, 4.
  assert (ep.turns, ep.end, ep.stalled) == (4, "truncated", 3)


def test_retry_answers_the_turn_after_one_that_went_wrong(tmp_path):
  # The first output of each game depends on its reset seed, shown in every context:
  #   seed 0: a rejected command ("jump"), seed 1: always right, seed 2: no action,
  #   seed 3: "look", which stalls the game on its second turn (the same room three times).
  first = {0: "Action: jump", 1: "Action: go north", 2: "", 3: "Action: look"}
  gen = Scripted(lambda c: first[int(c.split("(seed ")[1][0])])
  retry = Scripted(lambda c: "Think: something else.\nAction: go north")
  log = tmp_path / "log.jsonl"
  res = rollouts.rollout(corridor_tasks([3, 2, 1, 1]), Corridor, gen, batch_size=4,
                         max_turns=10, log_path=str(log), retry=retry)
  assert [e.won for e in res.episodes] == [True] * 4
  turns = [r for r in rollouts.read_log(str(log)) if r["kind"] == "turn"]
  flags = {e: [r["retry"] for r in turns if r["episode"] == e] for e in range(4)}
  assert flags == {0: [False, True, False, True, False, True], 1: [False, False],
                   2: [False, True], 3: [False, False, True]}
  # Each generator saw exactly the contexts of its turns, in one call per batched turn.
  answered_by = lambda f: sorted(r["context"] for r in turns if r["retry"] == f)  # noqa: E731
  assert sorted(c for call in gen.calls for c in call) == answered_by(False)
  assert sorted(c for call in retry.calls for c in call) == answered_by(True)
  # Batched turns: 1 all four by `gen`; 2 games 0 and 2 by `retry`, 1 and 3 by `gen`; 3 game 0
  # by `gen`, game 3 (stalled) by `retry`; then game 0 alone, alternating.
  assert [len(call) for call in gen.calls] == [4, 2, 1, 1]
  assert [len(call) for call in retry.calls] == [2, 1, 1, 1]
  header = rollouts.read_log(str(log))[0]
  assert header["retry"] == "Scripted"


# -- the language model in the loop ---------------------------------------------------------


@pytest.fixture(scope="module")
def lm_log(agent, tmp_path_factory):
  path = tmp_path_factory.mktemp("lm") / "log.jsonl"
  gen = _generator(agent)
  res = rollouts.rollout(corridor_tasks([2, 1, 3, 2]), Corridor, gen, batch_size=3,
                         max_turns=3, log_path=str(path), meta={"harness": "none"})
  return res, rollouts.read_log(str(path)), gen


def test_lm_rollout_logs(lm_log, agent):
  res, records, gen = lm_log
  _, tok = agent
  assert records[0]["meta"] == {"harness": "none"}
  assert records[0]["generator"]["max_new_tokens"] == 12
  turns = [r for r in records if r["kind"] == "turn"]
  assert len(turns) == res.turns == sum(e.turns for e in res.episodes)
  assert res.batch_sizes[0] == 3
  for r in turns:
    # The logged prompt length is that of the formatted context; outputs are <= 12 tokens.
    prompt = text_agent.format_prompt(tok, r["context"])
    assert r["prompt_tokens"] == len(tok.encode(prompt, add_special_tokens=False))
    assert 1 <= r["output_tokens"] <= 12
    p = text_agent.parse_output(r["output"])
    assert (r["action"], r["parse_error"]) == (p.action, p.error)
  failures = sum(r["parse_error"] is not None for r in turns)
  assert failures == sum(e.parse_failures for e in res.episodes)
  assert res.generated_tokens == sum(r["output_tokens"] for r in turns)
  # A few static shapes only (3 rows -> 4; prompts under 128 or 256 tokens).
  assert gen.stats["shapes"] <= {(n, t) for n in (1, 2, 4) for t in (128, 256, 512)}


def test_replay_reproduces_observations(lm_log, tmp_path):
  _, records, _ = lm_log
  for recs in rollouts.episodes(records).values():
    result = rollouts.replay(recs, Corridor)
    assert result.ok, result.mismatches
  # A log with executed actions (the random model rarely writes one), and tampered copies.
  outputs = iter(["Action: go north", "junk\njunk", "Action: look", "Action: jump"] * 3)
  log = tmp_path / "log.jsonl"
  rollouts.rollout(corridor_tasks([3, 2]), Corridor, Scripted(lambda c: next(outputs)),
                   batch_size=2, max_turns=4, log_path=str(log))
  by_episode = rollouts.episodes(rollouts.read_log(str(log)))
  for recs in by_episode.values():
    result = rollouts.replay(recs, Corridor)
    assert result.ok and result.steps == sum(
        r["kind"] == "turn" and r["action"] is not None for r in recs)
  recs = [dict(r) for r in by_episode[0]]
  stepped = [r for r in recs if r["kind"] == "turn" and r["action"] is not None]
  stepped[1]["observation"] = "something else"
  bad = rollouts.replay(recs, Corridor)
  assert bad.mismatches == [(stepped[1]["turn"], "observation", "something else",
                             "You are in room 1.")]
  recs = [dict(r) for r in by_episode[1]]
  recs[0]["seed"] = 12345  # the reset observation names the seed
  assert rollouts.replay(recs, Corridor).mismatches[0][0] == -1
  recs = [dict(r) for r in by_episode[1]]
  next(r for r in recs if r["kind"] == "turn" and r["action"])["action"] = "go south"
  assert {m[1] for m in rollouts.replay(recs, Corridor).mismatches} >= {"observation"}


def test_worker_processes_log_what_in_process_logs(agent, lm_log, tmp_path):
  _, records, _ = lm_log
  path = tmp_path / "workers.jsonl"
  rollouts.rollout(corridor_tasks([2, 1, 3, 2]), Corridor, _generator(agent), batch_size=3,
                   max_turns=3, log_path=str(path), meta={"harness": "none"}, workers=2)
  other = rollouts.read_log(str(path))
  assert other[0]["workers"] == 2
  assert other[1:] == records[1:]


def test_batched_generation_equals_one_at_a_time(agent):
  contexts = ["You are in room 0.", "You are in room 1 of a long corridor. " * 6,
              "Nothing happens.\n\n> look\nYou are in room 2."]
  batched = _generator(agent)(contexts)
  one = _generator(agent)
  single = [one([c])[0] for c in contexts]
  assert [g.text for g in batched] == [g.text for g in single]
  assert [g.num_tokens for g in batched] == [g.num_tokens for g in single]
  # And against an unbucketed, unpadded reference: harnax.models.generate on one prompt.
  model, tok = agent
  gen = _generator(agent)
  for c, g in zip(contexts, batched):
    ids = np.asarray([tok.encode(gen.prompt(c), add_special_tokens=False)], np.int32)
    ref = models.generate(model, ids, max_new_tokens=12, stop_tokens=gen.stop_tokens)
    n = int(ref.lengths[0])
    assert g.text == tok.decode(np.asarray(ref.tokens[0, :n]).tolist())


def test_sampling_is_reproducible_from_the_seed(agent):
  contexts = ["You are in room 0.", "You are in room 1."]
  a = _generator(agent, temperature=1.0, top_p=0.9, seed=3)(contexts)
  b = _generator(agent, temperature=1.0, top_p=0.9, seed=3)(contexts)
  c = _generator(agent, temperature=1.0, top_p=0.9, seed=4)(contexts)
  assert a == b and a != c


def test_long_prompts_are_cut_on_the_left(agent):
  gen = _generator(agent, max_prompt_tokens=64, length_buckets=(32, 64))
  [g] = gen(["word " * 200])
  assert g.prompt_cut and g.prompt_tokens == 64


# -- bad inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=0), "batch_size"), (dict(max_turns=0), "max_turns"),
    (dict(workers=-1), "workers"), (dict(start_method="fork"), "start_method"),
    (dict(pick="any"), "pick"), (dict(workers=1, make_game=lambda t: Corridor(t)), "make_game"),
    (dict(retry="sample"), "retry"),
])
def test_bad_rollout_options(kw, match):
  kw = dict(dict(make_game=Corridor), **kw)
  with pytest.raises(ValueError, match=match):
    rollouts.rollout(corridor_tasks([1]), generator=Scripted(always_north), **kw)


def test_bad_tasks_and_generator_options(agent):
  with pytest.raises(ValueError, match=r"tasks\[0\]"):
    rollouts.rollout(["corridor-1"], Corridor, Scripted(always_north))
  for kw, match in [(dict(max_new_tokens=0), "max_new_tokens"),
                    (dict(temperature=-1.0), "temperature"), (dict(top_p=1.5), "top_p"),
                    (dict(max_prompt_tokens=2000), "max_prompt_tokens")]:
    with pytest.raises(ValueError, match=match):
      _generator(agent, **kw)
  with pytest.raises(ValueError, match="PlainContext|window"):
    rollouts.PlainContext(window=-1)


def test_a_failing_game_raises_with_its_traceback(tmp_path):
  class Broken(Corridor):
    def step(self, action):
      raise KeyError("engine crashed")

  with pytest.raises(KeyError, match="engine crashed"):
    rollouts.rollout(corridor_tasks([2]), Broken, Scripted(always_north), batch_size=1)


def test_read_log_rejects_other_files(tmp_path):
  path = tmp_path / "x.jsonl"
  path.write_text(json.dumps({"kind": "run", "format": "other"}) + "\n")
  with pytest.raises(ValueError, match="format"):
    rollouts.read_log(str(path))
  path.write_text(json.dumps({"kind": "run", "format": rollouts.LOG_FORMAT}) + "\n{\"kind\": ")
  assert len(rollouts.read_log(str(path))) == 1  # a truncated last line is dropped


def test_summary_fields_are_json():
  s = rollouts.EpisodeSummary(0, "t", 1, True, 1.0, 1.0, 2, "won", 0, 0, 0, 10, 0)
  assert json.loads(json.dumps(dataclasses.asdict(s)))["end"] == "won"



# -- real ALFWorld games --------------------------------------------------------------------


def make_alfworld(task):
  from harnax.envs.text import alfworld
  # Generated tasks are solvable by construction; skipping the planner check halves loading.
  return alfworld.make(task, check_solvable=False)


@pytest.fixture(scope="module")
def alfworld_tasks():
  alfworld = pytest.importorskip("harnax.envs.text.alfworld")
  return alfworld.tasks("seen", per_type=1)[:2]


def make_harnessed_alfworld(task):
  from harnax.envs.text import harness
  return harness.HarnessedGame(make_alfworld(task), harness.HarnessConfig())


@pytest.fixture(scope="module")
def alfworld_log(agent, alfworld_tasks, tmp_path_factory):
  path = tmp_path_factory.mktemp("alfworld") / "log.jsonl"
  res = rollouts.rollout(alfworld_tasks, make_harnessed_alfworld, _generator(agent),
                         render=rollouts.GameContext(), batch_size=2, max_turns=2,
                         log_path=str(path))
  return res, rollouts.read_log(str(path))


@pytest.mark.slow
def test_harnessed_alfworld_rollout_logs_and_replays(alfworld_log, alfworld_tasks):
  res, records = alfworld_log
  assert res.batch_sizes == [2, 2]
  by_episode = rollouts.episodes(records)
  for ep, recs in by_episode.items():
    reset, turns = recs[0], recs[1:-1]
    task = alfworld_tasks[ep]
    assert rollouts.task_from_record(reset) == task
    assert reset["observation"].startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert reset["goal"] and reset["goal"] in reset["observation"]
    assert [r["turn"] for r in turns] == [0, 1] and turns[-1]["done"]
    # The harnessed game's own context: the opening, then the harness record block.
    assert turns[0]["context"].startswith(reset["observation"].strip())
    assert "<harness_state>" in turns[0]["context"]
    for r in turns:
      assert r["task"] == task.ident and r["won"] is False and r["score"] == 0.0
      if r["action"] is None:
        assert r["harness"] is None
      else:  # the monitor judged the random model's command
        assert {"accepted", "consistent", "stalled"} <= set(r["harness"])
    summary = recs[-1]
    assert summary["end"] == "max_turns"
    assert summary["rejected"] == sum(bool(r["harness"]) and not r["harness"]["accepted"]
                                      for r in turns)
    assert summary["parse_failures"] == sum(r["action"] is None for r in turns)
  # Replay loads the game afresh (seconds per ALFWorld game): one episode.
  assert rollouts.replay(by_episode[0], make_harnessed_alfworld).ok


class PlanBook:
  """Answers each ALFWorld context with the next command of its game's expert plan (the
  opening observation, the first line of the context, names the game)."""

  def __init__(self, tasks):
    self.plans = {}
    for task in tasks:
      game = make_alfworld(task)
      obs, _ = game.reset()
      self.plans[obs.strip()] = iter(game.expert_plan())
      game.close()

  def __call__(self, contexts):
    out = []
    for c in contexts:
      opening = next(k for k in self.plans if c.startswith(k))
      out.append(rollouts.Generated(f"Think: plan\nAction: {next(self.plans[opening])}", 3, 9))
    return out


@pytest.mark.slow
def test_alfworld_expert_actions_win_in_worker_processes(alfworld_tasks, tmp_path):
  book = PlanBook(alfworld_tasks)
  res = rollouts.rollout(alfworld_tasks, make_alfworld, book, batch_size=2, max_turns=30,
                         workers=2, log_path=str(tmp_path / "log.jsonl"))
  assert [(e.won, e.end, e.score, e.ret, e.parse_failures) for e in res.episodes] == [
      (True, "won", 1.0, 1.0, 0)] * 2
  turns = [r for r in rollouts.read_log(str(tmp_path / "log.jsonl")) if r["kind"] == "turn"]
  last = [r for r in turns if r["done"]]
  assert [(r["won"], r["reward"], r["terminated"]) for r in last] == [(True, 1.0, True)] * 2
