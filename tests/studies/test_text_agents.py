"""The text-agent pipeline (harnax.studies.text_agents) end to end at micro scale: expert
walkthroughs through the harness, a locally trained tokenizer and Qwen3, batched evaluation
under the HAD settings, the random baseline and the report."""

import gzip
import json
import os
import random
import re

import jax.numpy as jnp
import numpy as np
import pytest

from configs import text_agents as config_lib
from harnax.envs.text import alfworld
from harnax.models import decoding
from harnax.policies import text_agent
from harnax.studies import text_agents
from harnax.studies import text_metrics
from harnax.train import rollouts

pytestmark = pytest.mark.slow


def _micro():
  cfg = config_lib.get_config("micro")
  cfg.per_type = 2
  cfg.sft.num_steps = 30
  # Mechanics, not learning: small batches of one padded length (one compile) keep it fast.
  cfg.sft.batch_size = 4
  cfg.sft.length_bucket = 512
  cfg.dagger.rounds = 1
  cfg.dagger.num_steps = 10
  cfg.dagger.per_type = 1  # of the 2 training tasks, the model plays the first in DAgger
  cfg.dagger.repeats = 2
  cfg.dagger.learning_rate = 1e-3
  cfg.max_steps = 20
  cfg.eval.per_type = 1
  cfg.eval.max_steps = 6
  cfg.eval.settings = ("with_harness", "harness_removed")
  cfg.augment.copies = 1
  cfg.augment.repeats = 2
  cfg.augment.rejections = 0.3
  return cfg


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  cfg = _micro()
  root = tmp_path_factory.mktemp("text_agents")
  cfg.agent_dir = str(root / "agent")
  cfg.output_dir = str(root / "out")
  lines = []
  directory = text_agents.build_agent(cfg, cfg.agent_dir, log=lines.append)
  return cfg, directory, lines


def test_build_writes_a_model_directory_and_reuses_it(built):
  cfg, directory, _ = built
  with open(os.path.join(directory, "manifest.json")) as f:
    manifest = json.load(f)
  walk = manifest["walkthroughs"]
  # The expert wins its training tasks from observations alone, and every turn is an example.
  assert walk["won"] == walk["episodes"] == 2
  # One DAgger round: the model played the first training task and the expert labelled its
  # turns.
  (dagger,) = manifest["dagger"]
  assert dagger["episodes"] == 1 and dagger["turns"] >= 1
  assert dagger["examples"] == 2 * dagger["turns"] and dagger["learning_rate"] == 1e-3
  # The walkthrough turns, a repeat of each finishing turn ("take", "move", ...), all of them
  # relabeled once more, then the DAgger turns (not relabeled, each `dagger.repeats` times).
  examples, _ = text_agents.walkthroughs(text_agents.train_tasks(cfg), window=cfg.window,
                                         max_steps=cfg.max_steps,
                                         rejections=cfg.augment.rejections, seed=cfg.seed)
  finishing = sum(e["action"].split()[0] in cfg.augment.repeat_verbs for e in examples)
  assert finishing >= 2 * 2  # at least a take and a move per task
  # Rejected mistakes are turns of the game, not examples.
  assert walk["rejected"] >= 1 and len(examples) == walk["turns"] - walk["rejected"]
  assert manifest["training"]["num_examples"] == (
      (len(examples) + finishing) * (1 + cfg.augment.copies)
      + cfg.dagger.repeats * dagger["turns"])
  assert manifest["training"]["num_steps"] == 30 + 10
  assert manifest["training"]["final_loss"] < manifest["training"]["initial_loss"]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(directory))
  stamp = os.path.getmtime(os.path.join(directory, "model.safetensors"))
  lines = []
  assert text_agents.build_agent(cfg, directory, log=lines.append) == directory
  assert "reusing" in lines[0]
  assert os.path.getmtime(os.path.join(directory, "model.safetensors")) == stamp
  # How a build is evaluated is not part of it; how it is trained is.
  other = _micro()
  other.eval.max_steps, other.eval.temperature, other.output_dir = 9, 0.5, "elsewhere"
  assert text_agents.is_built(directory, other)
  other.sft.num_steps += 1
  assert not text_agents.is_built(directory, other)
  other = _micro()
  other.dagger.per_type = None
  assert not text_agents.is_built(directory, other)


def test_build_from_an_init_dir_continues_that_model_with_its_tokenizer(built, tmp_path):
  cfg, directory, _ = built
  with open(os.path.join(directory, "manifest.json")) as f:
    first = json.load(f)
  # Zero SFT steps and no DAgger: the new directory holds the same weights and tokenizer.
  same = _micro()
  same.init_dir, same.sft.num_steps, same.dagger.rounds = directory, 0, 0
  out = text_agents.build_agent(same, str(tmp_path / "same"))
  for name in ("model.safetensors", "tokenizer.json"):
    with open(os.path.join(directory, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
      assert a.read() == b.read(), name
  with open(os.path.join(out, "manifest.json")) as f:
    manifest = json.load(f)
  assert manifest["init"]["dir"] == os.path.abspath(directory)
  assert manifest["init"]["config"] == first["config"]
  assert manifest["training"]["num_steps"] == 0
  # Training goes on from the trained weights: its first loss is the trained model's, far
  # below a fresh model's first loss on the same data.
  more = _micro()
  more.init_dir, more.sft.num_steps, more.dagger.rounds = directory, 2, 0
  out = text_agents.build_agent(more, str(tmp_path / "more"))
  with open(os.path.join(out, "manifest.json")) as f:
    manifest = json.load(f)
  assert manifest["training"]["num_steps"] == 2
  assert manifest["training"]["initial_loss"] < 0.8 * first["training"]["initial_loss"]


def test_a_build_on_prepared_data_equals_the_build_that_plays_the_walkthroughs(tmp_path):
  cfg = _micro()
  cfg.sft.num_steps, cfg.dagger.rounds = 5, 0
  data_dir = text_agents.prepare_data(cfg, str(tmp_path / "data"))
  examples, data, _ = text_agents.load_data(cfg, data_dir)
  walked, walk = text_agents.walkthroughs(text_agents.train_tasks(cfg), window=cfg.window,
                                          max_steps=cfg.max_steps,
                                          rejections=cfg.augment.rejections, seed=cfg.seed)
  assert data["walkthroughs"] == walk
  assert [e["output"] for e in examples[:len(walked)]] == [e["output"] for e in walked]
  direct = text_agents.build_agent(cfg, str(tmp_path / "direct"))
  cfg.data_dir = data_dir
  prepared = text_agents.build_agent(cfg, str(tmp_path / "prepared"))
  for name in ("model.safetensors", "tokenizer.json"):
    with open(os.path.join(direct, name), "rb") as a, open(os.path.join(prepared, name),
                                                            "rb") as b:
      assert a.read() == b.read(), name
  manifests = []
  for directory in (direct, prepared):
    with open(os.path.join(directory, "manifest.json")) as f:
      manifests.append(json.load(f))
  for key in ("walkthroughs", "train_tasks", "training"):
    if key == "training":
      for m in manifests:
        m[key].pop("seconds")
    assert manifests[0][key] == manifests[1][key], key

  # Data prepared from another config are refused, naming the field that differs.
  other = _micro()
  other.data_dir, other.per_type = data_dir, 3
  with pytest.raises(ValueError, match="per_type"):
    text_agents.build_agent(other, str(tmp_path / "other"))
  other = _micro()
  other.data_dir, other.augment.copies = data_dir, 2
  with pytest.raises(ValueError, match="augment"):
    text_agents.load_data(other, data_dir)
  # A damaged directory: fewer examples than its manifest says.
  damaged = tmp_path / "damaged"
  damaged.mkdir()
  for name in os.listdir(data_dir):
    (damaged / name).write_bytes((tmp_path / "data" / name).read_bytes())
  with gzip.open(damaged / text_agents.DATA_EXAMPLES, "wt") as f:
    f.write(json.dumps(examples[0]) + "\n")
  with pytest.raises(ValueError, match="damaged"):
    text_agents.load_data(cfg, str(damaged))
  # Not a data directory; a foreign directory is not replaced; init_dir brings its own
  # tokenizer, so preparing data with it is refused.
  bad = _micro()
  bad.data_dir = str(tmp_path)
  with pytest.raises(ValueError, match="data_dir"):
    text_agents.check_config(bad)
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not a prepared-data directory"):
    text_agents.prepare_data(_micro(), str(foreign))
  bad = _micro()
  bad.init_dir = direct
  with pytest.raises(ValueError, match="init_dir"):
    text_agents.prepare_data(bad, str(tmp_path / "never"))
  assert not (tmp_path / "never").exists()


def test_walkthrough_examples_are_the_expert_turns_in_the_agent_format():
  tasks = alfworld.tasks("seen", per_type=1, task_types=("pick_and_place_simple",))
  examples, summary = text_agents.walkthroughs(tasks, window=1, max_steps=50)
  assert summary["won"] == 1 and len(examples) == summary["turns"]
  for e in examples:
    assert e["output"].startswith("Think: ") and e["output"].endswith("Action: " + e["action"])
    assert "<harness_state>" in e["context"]
  # The last action is the placement that won.
  assert examples[-1]["action"].startswith(("move ", "put "))


def test_rejected_mistakes_leave_the_walkthrough_and_precede_a_recovery():
  tasks = alfworld.tasks("seen", per_type=1, task_types=("pick_cool_then_place_in_recep",
                                                         "pick_two_obj_and_place"))
  plain, plain_summary = text_agents.walkthroughs(tasks, window=1, max_steps=50)
  examples, summary = text_agents.walkthroughs(tasks, window=1, max_steps=50, rejections=0.3,
                                               seed=4)
  # A rejected command is not executed, so the expert plays the same game: same actions, same
  # wins; only the contexts after a mistake differ (they show it and its feedback).
  assert [e["action"] for e in examples] == [e["action"] for e in plain]
  assert summary["won"] == plain_summary["won"] == 2
  assert summary["rejected"] >= 3 and summary["turns"] == plain_summary["turns"] + (
      summary["rejected"])
  after = [e for e in examples if '<harness_feedback>Rejected "' in e["context"]]
  assert len(after) == summary["rejected"]
  for e in after:
    mistake = re.search(r'Rejected "([^"]+)"', e["context"]).group(1)
    assert mistake != e["action"] and mistake not in e["output"]
  assert examples == text_agents.walkthroughs(tasks, window=1, max_steps=50, rejections=0.3,
                                              seed=4)[0]
  with pytest.raises(ValueError, match="rejections"):
    text_agents.walkthroughs(tasks, window=1, max_steps=50, rejections=1.5)


def test_bare_examples_are_expert_turns_in_the_context_without_the_harness():
  tasks = alfworld.tasks("seen", per_type=1, task_types=("pick_and_place_simple",
                                                         "pick_heat_then_place_in_recep"))
  plain, plain_summary = text_agents.walkthroughs(tasks, window=1, max_steps=50)
  examples, summary = text_agents.walkthroughs(tasks, window=1, max_steps=50, bare=0.5, seed=3)
  harnessed = [e for e in examples if not e.get("bare")]
  bare = [e for e in examples if e.get("bare")]
  # The harnessed examples are the walkthrough's, unchanged; bare ones are extra.
  assert harnessed == plain and summary["won"] == plain_summary["won"] == 2
  assert summary["bare"] == len(bare) and 0 < len(bare) < len(plain)
  # Replay the walkthroughs and render each state without the harness, independently.
  expected = []
  for task in tasks:
    game = text_agents.HarnessedGameMaker(max_steps=50)(task)
    game.reset()
    for e in (e for e in plain if e["task"] == task.ident):
      expected.append((e["action"], game.context(window=1, state_tracking=False,
                                                 action_monitoring=False)))
      game.step(e["action"])
    game.close()
  # Each bare example follows its own turn's harnessed example, in that turn's state.
  for i, e in enumerate(examples):
    if e.get("bare"):
      before = examples[i - 1]
      assert not before.get("bare") and before["action"] == e["action"]
      assert (e["action"], e["context"]) == expected[harnessed.index(before)]
      assert "<harness_state>" not in e["context"] and "harness" not in e["context"]
      assert e["output"] == f"Think: I {e['action']}.\nAction: {e['action']}"
      assert text_agent.parse_output(e["output"]).action == e["action"]
  assert examples == text_agents.walkthroughs(tasks, window=1, max_steps=50, bare=0.5,
                                              seed=3)[0]
  all_bare = text_agents.walkthroughs(tasks, window=1, max_steps=50, bare=1.0)[0]
  assert len(all_bare) == 2 * len(plain)
  with pytest.raises(ValueError, match="bare"):
    text_agents.walkthroughs(tasks, window=1, max_steps=50, bare=-0.1)


def test_relabeled_copies_rename_each_instance_consistently():
  tasks = alfworld.tasks("seen", per_type=1, task_types=("pick_clean_then_place_in_recep",))
  examples, _ = text_agents.walkthroughs(tasks, window=1, max_steps=50)
  word_number = re.compile(r"([a-z]+) (\d+)")
  renamed_any = False
  for e in examples:
    texts = [e["context"], e["output"], e["action"]]
    new = text_agents.relabel_instances(texts, random.Random(7), max_number=30)
    mapping = {}
    for old, got in zip(texts, new):
      # Only numbers change: the texts agree outside the digits.
      assert re.sub(r"\d+", "#", old) == re.sub(r"\d+", "#", got)
      pairs_old, pairs_new = word_number.findall(old), word_number.findall(got)
      assert [w for w, _ in pairs_old] == [w for w, _ in pairs_new]
      for (word, a), (_, b) in zip(pairs_old, pairs_new):
        if word == "turn":
          assert a == b  # not an instance
          continue
        assert mapping.setdefault((word, a), b) == b  # one new number per instance, everywhere
        assert 1 <= int(b) <= max(30, int(a))
        renamed_any |= a != b
    by_class = {}
    for (word, _), b in mapping.items():
      by_class.setdefault(word, []).append(b)
    assert all(len(set(v)) == len(v) for v in by_class.values())  # one-to-one per class
    assert new[1].endswith("Action: " + new[2])  # the command is still the output's action
  assert renamed_any
  aug = text_agents.augment(examples, copies=2, seed=3)
  assert len(aug) == 3 * len(examples) and aug[:len(examples)] == examples
  assert aug == text_agents.augment(examples, copies=2, seed=3)
  with pytest.raises(ValueError, match="max_number"):
    text_agents.relabel_instances(["apple 1"], random.Random(0), max_number=0)
  with pytest.raises(ValueError, match="copies"):
    text_agents.augment(examples, copies=-1)


def test_repeat_verbs_repeats_the_finishing_turns_only():
  tasks = alfworld.tasks("seen", per_type=1, task_types=("pick_heat_then_place_in_recep",))
  examples, _ = text_agents.walkthroughs(tasks, window=1, max_steps=50)
  verbs = ("take", "heat", "move")
  out = text_agents.repeat_verbs(examples, verbs=verbs, repeats=3)
  assert out[:len(examples)] == examples
  rare = [e for e in examples if e["action"].split()[0] in verbs]
  # A heat task takes, heats and places: each of those turns is there twice more.
  assert {e["action"].split()[0] for e in rare} == set(verbs)
  assert out[len(examples):] == rare + rare
  assert text_agents.repeat_verbs(examples, verbs=verbs, repeats=1) == examples
  with pytest.raises(ValueError, match="repeats"):
    text_agents.repeat_verbs(examples, verbs=verbs, repeats=0)
  with pytest.raises(ValueError, match="verbs"):
    text_agents.repeat_verbs(examples, verbs="take", repeats=2)


def test_evaluate_traces_match_the_rollout_log(built, tmp_path):
  cfg, directory, _ = built
  model, tok = text_agents.load_agent(directory)
  tasks = alfworld.tasks("seen", per_type=1, task_types=tuple(cfg.task_types), seed=1)
  for setting in ("with_harness", "harness_removed"):
    log = str(tmp_path / f"{setting}.jsonl")
    traces, stats = text_agents.evaluate(model, tok, tasks, setting, window=cfg.window,
                                         max_steps=cfg.eval.max_steps, log_path=log)
    records = rollouts.read_log(log)
    summaries = [r for r in records if r.get("kind") == "episode"]
    assert [t.turns for t in traces] == [s["turns"] for s in summaries]
    assert [t.won for t in traces] == [s["won"] for s in summaries]
    assert stats["turns"] == sum(t.turns for t in traces)
    contexts = [r["context"] for r in records if r.get("kind") == "turn"]
    shows_harness = any("<harness_" in c for c in contexts)
    assert shows_harness == (setting == "with_harness")


def test_sampled_evaluation_is_a_function_of_its_seed(built, tmp_path):
  cfg, directory, _ = built
  model, tok = text_agents.load_agent(directory)
  tasks = alfworld.tasks("seen", per_type=1, task_types=tuple(cfg.task_types), seed=1)

  def actions(temperature, seed):
    log = str(tmp_path / f"{temperature}-{seed}.jsonl")
    text_agents.evaluate(model, tok, tasks, "with_harness", window=cfg.window, max_steps=4,
                         log_path=log, temperature=temperature, seed=seed)
    return [r["output"] for r in rollouts.read_log(log) if r.get("kind") == "turn"]

  greedy = actions(0.0, 0)
  assert actions(0.0, 7) == greedy  # greedy ignores the seed
  sampled = actions(1.0, 3)
  assert actions(1.0, 3) == sampled
  # At temperature 1 a 30-step model's outputs are far from deterministic: some turn differs
  # from the greedy one (each of the 4 turns has dozens of tokens to draw).
  assert sampled != greedy


def test_retry_temperature_samples_only_after_a_turn_that_went_wrong(built, tmp_path):
  cfg, directory, _ = built
  model, tok = text_agents.load_agent(directory)
  tasks = alfworld.tasks("seen", per_type=2, task_types=tuple(cfg.task_types), seed=1)

  def turns(retry_temperature, setting="with_harness"):
    log = str(tmp_path / f"{retry_temperature}-{setting}.jsonl")
    text_agents.evaluate(model, tok, tasks, setting, window=cfg.window, max_steps=6,
                         log_path=log, retry_temperature=retry_temperature)
    return [r for r in rollouts.read_log(log) if r.get("kind") == "turn"]

  greedy, retried = turns(0.0), turns(1.0)
  assert not any(r["retry"] for r in greedy)
  went_wrong = lambda r: (r["action"] is None or not r["harness"]["accepted"]  # noqa: E731
                          or r["harness"]["stalled"])
  for episode in {r["episode"] for r in retried}:
    mine = [r for r in retried if r["episode"] == episode]
    assert [r["retry"] for r in mine] == [False] + [went_wrong(r) for r in mine[:-1]]
    # Until the first retry the agent is the greedy one, turn for turn.
    theirs = [r for r in greedy if r["episode"] == episode]
    k = next((i for i, r in enumerate(mine) if r["retry"]), len(mine))
    assert [r["output"] for r in mine[:k]] == [r["output"] for r in theirs[:k]]
  # The 30-step micro model errs within 6 turns; the check above is not vacuous.
  assert any(r["retry"] for r in retried)
  # Rejections are the monitor's: with it hidden the agent never retries, errors or not.
  hidden = turns(1.0, "action_monitoring_hidden")
  assert not any(r["retry"] for r in hidden) and any(went_wrong(r) for r in hidden)


def test_random_agent_and_report(built):
  cfg, directory, _ = built
  tasks = alfworld.tasks("seen", per_type=1, task_types=tuple(cfg.task_types))
  traces = text_agents.random_agent(tasks, max_steps=5, seed=0)
  # Random admissible commands are always accepted by the monitor.
  assert all(t.accepted.all() for t in traces)
  cfg.checkpoint = directory
  result = text_agents.run(cfg)
  text = text_agents.render(cfg, result)
  assert "## Success (%) by harness setting" in text and "random admissible" in text
  # Success cells carry the Wilson interval (checked against scipy in test_text_metrics).
  rate = text_metrics.success(result["agent"]["with_harness"]["seen"])
  lo, hi = rate.interval()
  assert f"[{100 * lo:.0f}, {100 * hi:.0f}] ({rate.successes}/{rate.trials})" in text
  m = text_agents.metrics(result)
  assert m["agent/with_harness/seen"]["success"]["trials"] == len(tasks)
  assert isinstance(text_metrics.success(result["random"]["seen"]).value, float)
  assert np.isfinite(text_metrics.harness_utilization(result["random"]["seen"]).value)
  # Per-state accuracy on the expert's walkthroughs of the same tasks (eval.max_steps each).
  for split in ("seen", "unseen"):
    walk, _ = text_agents.walkthroughs(text_agents.eval_tasks(cfg)[split], window=cfg.window,
                                       max_steps=cfg.eval.max_steps)
    d = result["decisions"][split]
    assert d["overall"].trials == min(len(walk), cfg.eval.decision_states)
    assert m[f"agent/decisions/{split}"]["overall"]["trials"] == d["overall"].trials
  assert "## The agent's action at the expert's states" in text
  # Every turn of every episode is kept, one log per setting and split, and replays.
  for setting in cfg.eval.settings:
    for split, ts in text_agents.eval_tasks(cfg).items():
      records = rollouts.read_log(os.path.join(cfg.output_dir, "episodes",
                                               f"{setting}-{split}.jsonl"))
      assert sum(r["kind"] == "reset" for r in records) == len(ts)
      turns = [r for r in records if r["kind"] == "turn"]
      assert len(turns) == sum(len(t.accepted) for t in result["agent"][setting][split])
  records = rollouts.read_log(os.path.join(cfg.output_dir, "episodes", "with_harness-seen.jsonl"))
  first = [r for r in records if r.get("episode") == records[1]["episode"]]
  replayed = rollouts.replay(first, text_agents.HarnessedGameMaker(max_steps=cfg.eval.max_steps))
  assert replayed.ok, replayed


def test_bad_inputs(tmp_path):
  sw = "micro,scienceworld"
  bad = [("micro", "task_types", ("fly_to_the_moon",)), ("micro", "per_type", 0),
         (sw, "augment.copies", 1), ("micro", "init_dir", str(tmp_path)),  # no config.json
         ("micro", "eval.temperature", -0.5), ("micro", "eval.retry_temperature", -1.0),
         ("micro", "sft.num_steps", 0),  # nothing to train from without init_dir
         ("micro", "augment.repeats", 0), ("micro", "augment.rejections", -0.1),
         ("micro", "augment.rejections", 1.5), (sw, "augment.rejections", 0.1),
         ("micro", "augment.bare", 1.5), ("micro", "augment.bare", -0.5),
         ("micro", "augment.repeat_verbs", ("take", "")), ("micro", "rooms", ("attic",)),
         ("micro", "rooms", ()), (sw, "rooms", ("bathroom",))]
  bad += [("micro", f"dagger.{field}", value) for field, value in (
      ("rounds", -1), ("num_steps", 0), ("batch_size", 0), ("per_type", 0), ("repeats", 0),
      ("learning_rate", 0.0), ("learning_rate", float("nan")))]
  for variant, field, value in bad:
    cfg = _micro() if variant == "micro" else config_lib.get_config(variant)
    cfg.update_from_flattened_dict({field: value})
    with pytest.raises(ValueError, match=re.escape(field)):
      text_agents.check_config(cfg)
  with pytest.raises(TypeError, match="rooms"):  # the typed field takes a tuple, not a string
    _micro().rooms = "bathroom"
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not a text-agent directory"):
    text_agents.build_agent(_micro(), str(foreign))
  with pytest.raises(ValueError, match="setting"):
    text_agents.evaluate(None, None, [], "no_such_setting", window=1, max_steps=1)


def test_scienceworld_walkthroughs_win_through_the_harness():
  # ScienceWorld's gold paths, without the steps the harness rejects as no-ops (opening an open
  # door), still win; every kept step is accepted by the monitor.
  from harnax.envs.text import GameLoadError
  from harnax.envs.text import scienceworld

  try:
    scienceworld.find_java()
  except GameLoadError:  # CI installs java (make java): there a missing one fails the test
    if os.environ.get("CI") == "true":
      raise
    pytest.skip("java is missing (make java)")
  tasks = text_agents.game_tasks("scienceworld", "seen", per_type=1,
                                 task_types=("lifespan-longest-lived", "find-plant"), seed=0)
  examples, summary = text_agents.walkthroughs(tasks, window=2, max_steps=40)
  assert summary["won"] == summary["episodes"] == 2
  assert len(examples) == summary["turns"]
  assert all(e["output"].startswith("Think: I am in the ") for e in examples)


def test_dagger_labels_the_states_the_model_reaches(built):
  cfg, directory, _ = built
  model, tok = text_agents.load_agent(directory)
  tasks = alfworld.tasks("seen", per_type=1, task_types=tuple(cfg.task_types))
  # With the expert always executed, DAgger is the walkthrough itself, example for example.
  same, summary = text_agents.dagger_examples(model, tok, tasks, window=cfg.window,
                                              max_steps=50, expert_prob=1.0)
  walk, walk_summary = text_agents.walkthroughs(tasks, window=cfg.window, max_steps=50)
  assert [(e["context"], e["output"]) for e in same] == [(e["context"], e["output"])
                                                         for e in walk]
  assert summary["won"] == walk_summary["won"] == 1
  # With the model executed, every turn it played is labelled once by the expert.
  own, summary = text_agents.dagger_examples(model, tok, tasks, window=cfg.window, max_steps=5)
  assert len(own) == summary["turns"] == 5
  assert all(e["output"].endswith("Action: " + e["action"]) for e in own)
  with pytest.raises(ValueError, match="expert_prob"):
    text_agents.dagger_examples(model, tok, tasks, window=1, max_steps=1, expert_prob=2.0)


def test_decision_accuracy_against_one_prompt_at_a_time_generation(built):
  cfg, directory, _ = built
  model, tok = text_agents.load_agent(directory)
  tasks = alfworld.tasks("seen", per_type=1, task_types=tuple(cfg.task_types), seed=5)
  examples, _ = text_agents.walkthroughs(tasks, window=cfg.window, max_steps=50)
  examples = examples[:3]  # each reference generation below compiles for its own length
  # The reference: each prompt generated alone (no batch, no padding), greedy, up to eos.
  actions = []
  for e in examples:
    ids = tok.encode(text_agent.format_prompt(tok, e["context"]))
    out = decoding.generate(model, jnp.asarray([ids], jnp.int32), max_new_tokens=64,
                            stop_tokens=[tok.eos_token_id])
    n = int(out.lengths[0])
    text = tok.decode([int(t) for t in out.tokens[0, :n] if int(t) != tok.eos_token_id])
    actions.append(text_agent.parse_output(text).action)
  expected = sum(a == e["action"] for a, e in zip(actions, examples))
  got = text_agents.decision_accuracy(model, tok, examples, batch_size=2)
  assert (got["overall"].successes, got["overall"].trials) == (expected, 3)
  assert got["parse_failures"] == sum(a is None for a in actions)
  assert sum(r.trials for r in got["by_verb"].values()) == 3
  # Labelled with the model's own actions, every state with an action is right.
  own = [dict(e, action=a) for e, a in zip(examples, actions) if a is not None]
  assert own, "the micro build wrote no parsable action at all"
  assert text_agents.decision_accuracy(model, tok, own)["overall"].value == 1.0
  wrong = [dict(e, action="fly to the moon") for e in examples]
  assert text_agents.decision_accuracy(model, tok, wrong)["overall"].successes == 0
  with pytest.raises(ValueError, match="examples"):
    text_agents.decision_accuracy(model, tok, [])
  with pytest.raises(ValueError, match=r"examples\[0\]"):
    text_agents.decision_accuracy(model, tok, [{"context": "x"}])
