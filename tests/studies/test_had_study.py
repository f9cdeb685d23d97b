"""The HAD study's report (harnax.studies.had_study) on a tiny hand-made result, its run list,
and configs/distill.py's variants."""

import copy
import json
import os
import shutil

import numpy as np
import pytest

from configs import distill as config_lib
from harnax.studies import had_study
from harnax.studies import text_agents
from harnax.studies import text_metrics


def _trace(won, turns=3, stalled=()):
  s = np.zeros(turns, bool)
  s[list(stalled)] = True
  return text_metrics.EpisodeTrace(won=won, accepted=np.ones(turns, bool),
                                   consistent=np.ones(turns, bool), stalled=s)


def _by(wins_seen, wins_unseen, cfg):
  return {s: {"seen": [_trace(w) for w in wins_seen], "unseen": [_trace(w) for w in wins_unseen]}
          for s in cfg.teacher.eval.settings}


def test_variants_set_method_game_budget_and_size():
  c = config_lib.get_config("sopd,scienceworld,budget2")
  assert (c.method, c.game, c.teacher_budget) == ("sopd", "scienceworld", 2)
  assert c.teacher.game == "scienceworld" and c.workdir.endswith("scienceworld-sopd-budget2")
  # The ScienceWorld pair is built on one prepared data set (one tokenizer), bare turns
  # included, so that HAD's query without the harness gets an action from the teacher.
  assert all(c.teacher[k] == c.student[k] for k in text_agents.DATA_FIELDS)
  assert c.teacher.augment.bare > 0 and c.teacher.model != c.student.model
  m = config_lib.get_config("had,micro")
  assert m.game == "alfworld" and m.train.num_steps == 2 and m.teacher_dir != m.student_dir
  w = config_lib.get_config("opd,micro_teacher,budget2")
  # The winning micro pair: one tokenizer (same walkthroughs), the student trained less.
  assert w.teacher.rooms == w.student.rooms == ("bathroom",) and w.teacher_budget == 2
  assert w.student.sft.num_steps < w.teacher.sft.num_steps and w.teacher_dir != w.student_dir
  assert {k: v for k, v in w.student.to_dict().items() if k not in ("sft", "agent_dir")} == {
      k: v for k, v in w.teacher.to_dict().items() if k not in ("sft", "agent_dir")}
  assert w.max_turns == w.teacher.eval.max_steps and w.workdir.endswith("-budget2")
  # The accelerator sizing changes the sizing and nothing else (same pair, same method).
  long, base = config_lib.get_config("had,long,budget2"), config_lib.get_config("had,budget2")
  changed = {"episodes_per_step", "batch_size", "workdir", "train.num_steps",
             "train.checkpoint_every", "study.seeds", "study.curve_steps", "study.output_dir",
             "teacher.eval.per_type"}

  def flat(d, prefix=""):
    return {k2: v2 for k, v in d.items()
            for k2, v2 in (flat(v, f"{prefix}{k}.").items() if isinstance(v, dict)
                           else [(f"{prefix}{k}", v)])}
  a, b = flat(long.to_dict()), flat(base.to_dict())
  assert {k for k in a if a[k] != b[k]} == changed
  assert long.episodes_per_step == 16 and long.train.num_steps == 400
  assert long.train.learning_rate == 1e-4 and long.teacher_budget == 2
  assert long.workdir.endswith("alfworld-had-long-budget2")
  # Only how the teacher is evaluated changes, not what its build makes (it is reused).
  assert text_agents.build_key(text_agents.config_dict(long.teacher)) == text_agents.build_key(
      text_agents.config_dict(base.teacher))
  for bad in ("dpo", "had,webshop", "had,alfworld,scienceworld", "", "had,micro,micro_teacher",
              "had,scienceworld,micro_teacher", "had,micro,long", "had,long,long"):
    with pytest.raises(ValueError, match="variant"):
      config_lib.get_config(bad)


def test_run_list_has_methods_ablations_and_budget_controls():
  names = [n for n, _, _ in had_study.run_names(config_lib.get_config("had"))]
  assert names == ["had", "opd", "sage_opd", "guided_opd", "sopd", "no_validity_filter",
                   "no_negative_action", "no_preference", "opd_budget2", "sopd_budget2"]
  assert ("sopd_budget2", "sopd", 2) in had_study.run_names(config_lib.get_config("had"))


@pytest.mark.parametrize("variant", ["had", "opd,scienceworld", "had,micro", "sopd,micro_teacher",
                                     "had,long", "opd,scienceworld,long"])
def test_every_variant_passes_the_study_check(variant):
  had_study.check_study(config_lib.get_config(variant))


@pytest.mark.parametrize("field,value,match", [
    ("teacher.eval.settings", ("with_harness", "without_harness"), "teacher.eval.settings"),
    ("teacher.eval.settings", ("harness_removed",), "'with_harness' among them"),
    ("study.methods", ("had", "gkd"), "study.methods"),
    ("study.ablations", ("no_preference", "opd"), "study.ablations"),
    ("study.budget2", ("no_preference",), "study.budget2"),
    ("study.seeds", (), "study.seeds"),
    ("study.seeds", (0, "1"), "study.seeds"),
    ("study.curve_steps", (0,), r"study.curve_steps: .*\[1, train.num_steps = 2\)"),
    ("study.curve_steps", (2,), "study.curve_steps"),      # the final step is always evaluated
    ("study.curve_steps", ("1",), "study.curve_steps"),
])
def test_the_study_check_names_the_bad_field(field, value, match):
  cfg = config_lib.get_config("had,micro")
  with cfg.unlocked():
    node = cfg
    *parents, leaf = field.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  with pytest.raises(ValueError, match=match):
    had_study.check_study(cfg)


def test_a_study_with_no_run_is_refused_before_anything_is_built():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = (), (), ()
  # run() checks first: the teacher is neither built nor loaded (its directory does not exist).
  cfg.teacher.checkpoint = "/nonexistent/teacher"
  with pytest.raises(ValueError, match="at least one run"):
    had_study.run(cfg)


def test_report_shows_ours_with_intervals_beside_the_paper():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods = ("had", "opd")
  cfg.study.ablations = ("no_preference",)
  cfg.study.budget2 = ("opd",)
  runs = {"had": _by([True, False], [True, True], cfg), "opd": _by([False, False], [False, True],
                                                                    cfg),
          "no_preference": _by([False], [False], cfg), "opd_budget2": _by([False], [True], cfg)}
  result = {"runs": runs, "teacher": _by([True], [True], cfg), "student": _by([False], [False],
                                                                               cfg)}
  text = had_study.render(cfg, result)
  # HAD won 1 of 2 seen games: 50.0 % with its Wilson interval [9, 91].
  assert "| had | 50.0 [9, 91] (1/2) | 100.0 [34, 100] (2/2) |" in text
  assert "51.4 / 63.4" in text and "41.4 / 47.0" in text        # the paper beside ours
  # Ablations pool both splits with the harness, as the paper's mean of the two does: 0 of 2
  # and 1 of 2 games (the other settings' games do not count).
  assert "| no_preference | 0.0 [0, 66] (0/2) | 43.5 |" in text
  assert "OPD's runs" not in text
  # Without its own run, no_preference is OPD's runs (the same update): 1 of 4 games.
  cfg.study.ablations = ()
  del runs["no_preference"]
  text = had_study.render(cfg, result)
  assert "| no_preference (OPD's runs: the same update) | 25.0 [5, 70] (1/4) | 43.5 |" in text
  # No HAD or ablation run: no ablation table for OPD alone.
  assert "Ablations and" not in had_study.render(cfg, dict(result, runs={"opd": runs["opd"]}))
  cfg.study.ablations = ("no_preference",)
  runs["no_preference"] = _by([False], [False], cfg)
  text = had_study.render(cfg, result)
  assert "| opd_budget2 | 50.0 [9, 91] (1/2) | 46.7 |" in text
  assert "does not reproduce" not in text
  # Every model with part of the harness hidden, the paper's HAD beside them.
  assert ("| opd | 0.0 [0, 66] (0/2) | 50.0 [9, 91] (1/2) | 0.0 [0, 66] (0/2) "
          "| 50.0 [9, 91] (1/2) |") in text
  assert "| paper: HAD | 40.7 | 37.3 | 45.0 | 56.0 |" in text
  m = had_study.metrics(result)
  assert m["had/with_harness/seen"]["success"] == {"successes": 1, "trials": 2}


def test_report_names_runs_that_trained_the_same_weights():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("had", "opd", "sopd"), (), ()
  zero = _by([False], [False], cfg)
  result = {"runs": {"had": zero, "opd": zero, "sopd": zero, "no_preference": zero},
            "teacher": zero, "student": zero,
            # sopd shares seed 0's weights only: not the same run.
            "digests": {"had": ["h0", "h1"], "opd": ["o0", "o1"], "sopd": ["o0", "s1"],
                        "no_preference": ["o0", "o1"]}}
  assert had_study.same_weights(result) == [("no_preference", "opd")]
  assert "**The same weights in every seed:** `no_preference` = `opd`." in had_study.render(
      cfg, result)
  assert had_study.metrics(result)["same_weights"] == [["no_preference", "opd"]]
  result["digests"]["no_preference"] = ["o0", "n1"]
  assert had_study.same_weights(result) == []
  assert "same weights" not in had_study.render(cfg, result)


def test_report_says_plainly_when_nothing_is_won():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("had",), (), ()
  zero = _by([False, False], [False], cfg)
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": zero, "student": zero})
  assert "does not reproduce" in text and "0.0 [0, 66] (0/2)" in text
  assert "The teacher does not win either" in text
  won = _by([True], [False], cfg)
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert "The teacher wins 4 of its evaluation games" in text
  cfg.teacher.eval.settings = ("with_harness", "harness_removed")
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert "part of the harness hidden" not in text      # no such setting evaluated
  assert "Not the published losses" not in text
  cfg.rd_after_rejection = "drop"
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert "**Not the published losses:**" in text and "rd_after_rejection='drop'" in text
  assert "Not the published preference term" not in text
  cfg.pref_against_reasoning = "drop"
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert ("**Not the published preference term:**" in text
          and "pref_against_reasoning='drop'" in text)
  assert "Not the published balancing" not in text
  assert "pref_after_rejection" not in text
  cfg.pref_after_rejection = "drop"
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert ("HAD's pairs at the turns right after a rejected action are left out of it"
          in text and "pref_after_rejection='drop'" in text)
  cfg.pref_lambda = 0.35
  text = had_study.render(cfg, {"runs": {"had": zero}, "teacher": won, "student": zero})
  assert "**Not the published balancing:** the preference term is weighted by a fixed λ = 0.35" \
      in text


def test_report_gives_each_seed_and_the_bootstrap_over_seeds():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("had",), (), ()
  # Two seeds that disagree completely on the seen games: 4/4 and 0/4.
  seeds = {"had": {s: {"seen": [[_trace(True)] * 4, [_trace(False)] * 4],
                       "unseen": [[_trace(True)] * 2, [_trace(True)] * 2]}
                   for s in cfg.teacher.eval.settings}}
  runs = {"had": {s: {split: [t for g in groups for t in g] for split, groups in by.items()}
                  for s, by in seeds["had"].items()}}
  zero = _by([False] * 4, [False] * 2, cfg)
  teacher = _by([True, True, False, False], [False, False], cfg)
  text = had_study.render(cfg, {"runs": runs, "teacher": teacher, "student": zero,
                                "seeds": seeds})
  # Pooled 4/8 = 50 %, but drawing seeds {A, A} or {B, B} (each 1/4) gives 100 % or 0 %.
  assert "| had | 100, 0 | 50.0 [0, 100] | 100, 100 | 100.0 [100, 100] |" in text
  # Task by task against the student (who won nothing): seed A gains all 4 seen games, p =
  # 2 / 2^4; seed B none, p = 1; each gains both unseen games, p = 2 / 2^2. Pooled over the
  # seeds, task by task: each seen game is ahead by 1 (4 tasks, p = 2 / 2^4); each unseen game
  # by 2 (2 tasks: 2 of the 4 sign patterns reach |total| 4, p = 1/2).
  assert ("| had | +4/-0 (p 0.12); +0/-0 (p 1) | 4 ahead, 0 behind (p 0.12) "
          "| +2/-0 (p 0.5); +2/-0 (p 0.5) | 2 ahead, 0 behind (p 0.5) |") in text
  assert ("| teacher | +2/-0 (p 0.5) | 2 ahead, 0 behind (p 0.5) | +0/-0 (p 1) "
          "| 0 ahead, 0 behind (p 1) |") in text
  m = had_study.metrics({"runs": runs, "teacher": teacher, "student": zero, "seeds": seeds})
  assert m["seeds"]["had"]["with_harness"]["seen"] == [[4, 4], [0, 4]]
  # gained, lost, won by both, by neither.
  assert m["paired"]["had"]["seen"] == [[4, 0, 0, 0], [0, 0, 0, 4]]
  assert m["paired"]["teacher"]["unseen"] == [[0, 0, 0, 2]]
  assert m["pooled_paired"]["had"]["unseen"] == {"ahead": 2, "behind": 0, "seeds": 2,
                                                 "p_value": 0.5}
  assert "not evaluated" not in text
  assert "## HAD under the four settings" in text and "## Ablations" in text
  # A study that left the teacher's evaluation out: no teacher row anywhere, and it says so.
  result = {"runs": runs, "teacher": {}, "student": zero, "seeds": seeds}
  text = had_study.render(cfg, result)
  assert "The teacher was not evaluated (`study.evaluate_teacher=False`)" in text
  assert "| teacher |" not in text and "| student |" in text
  assert "| had | 100, 0 | 50.0 [0, 100] | 100, 100 | 100.0 [100, 100] |" in text
  # Only OPD, evaluated with the harness only: no HAD or ablation section, no empty column.
  cfg.study.methods, cfg.teacher.eval.settings = ("opd",), ("with_harness",)
  opd = {"opd": seeds["had"]}
  text = had_study.render(cfg, {"runs": {"opd": runs["had"]}, "teacher": {}, "student": zero,
                                "seeds": opd})
  assert "## Success (%) with the harness\n" in text and "removed" not in text
  assert "| student | 0.0 [0, 49] (0/4) | 0.0 [0, 66] (0/2) | — |" in text
  assert "HAD under" not in text and "## Ablations" not in text
  m = had_study.metrics(result)
  assert "teacher" not in m["paired"] and not any(k.startswith("teacher/") for k in m)
  assert m["paired"]["had"]["seen"] == [[4, 0, 0, 0], [0, 0, 0, 4]]


def test_report_compares_had_with_each_other_run_task_by_task():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("had", "opd"), (), ()
  t, f = _trace(True), _trace(False)
  # Seed 0: HAD wins seen games 1-3, OPD games 3-4; seed 1: both win game 1 only.
  seeds = {"had": {"with_harness": {"seen": [[t, t, t, f], [t, f, f, f]], "unseen": [[f], [t]]}},
           "opd": {"with_harness": {"seen": [[f, f, t, t], [t, f, f, f]], "unseen": [[f], [f]]}}}
  runs = {n: {s: {sp: [x for g in gs for x in g] for sp, gs in by.items()}
              for s, by in seeds[n].items()} for n in seeds}
  zero = _by([False] * 4, [False], cfg)
  text = had_study.render(cfg, {"runs": runs, "teacher": zero, "student": zero, "seeds": seeds})
  # HAD-only games: 2 (seed 0: games 1 and 2), OPD-only: 1 (game 4); p = 2 (1 + 3) / 8 = 1.
  # Pooled: HAD - OPD summed over the seeds is (1, 1, 0, -1) seen, (1) unseen.
  assert ("| opd | +2/-1 (p 1); +0/-0 (p 1) | 2 ahead, 1 behind (p 1) "
          "| +0/-0 (p 1); +1/-0 (p 1) | 1 ahead, 0 behind (p 1) |") in text
  m = had_study.metrics({"runs": runs, "teacher": zero, "student": zero, "seeds": seeds})
  assert m["had_against"]["opd"]["seen"] == {"ahead": 2, "behind": 1, "seeds": 2,
                                             "p_value": 1.0}
  assert "HAD against each other run" in text
  one = {"had": seeds["had"]}
  text = had_study.render(cfg, {"runs": {"had": runs["had"]}, "teacher": zero, "student": zero,
                                "seeds": one})
  assert "HAD against each other run" not in text       # nothing to compare with


def test_report_and_metrics_give_the_learning_curve():
  cfg = config_lib.get_config("had,micro")
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("had",), (), ()
  cfg.train.num_steps, cfg.study.curve_steps = 4, (2,)
  # Two seeds; after 2 updates seed 0 won 1 of 2 seen games and seed 1 both; after all 4
  # (the final evaluation) 1 of 2 seen, 2 of 2 unseen.
  curve = {"had": {2: {"seen": [[_trace(True), _trace(False)], [_trace(True), _trace(True)]],
                       "unseen": [[_trace(False)], [_trace(False)]]}}}
  result = {"runs": {"had": _by([True, False], [True, True], cfg)},
            "teacher": _by([True], [True], cfg), "student": _by([False, False], [True], cfg),
            "curve": curve}
  text = had_study.render(cfg, result)
  assert "| run | split | 0 (student before) | 2 | 4 |" in text
  assert "| had | seen | 0.0 [0, 66] (0/2) | 75.0 [30, 95] (3/4) | 50.0 [9, 91] (1/2) |" in text
  assert ("| had | unseen | 100.0 [21, 100] (1/1) | 0.0 [0, 66] (0/2) "
          "| 100.0 [34, 100] (2/2) |") in text
  assert had_study.metrics(result)["curve"] == {
      "had": {"2": {"seen": [[1, 2], [2, 2]], "unseen": [[0, 1], [0, 1]]}}}
  del result["curve"]
  assert "by number of updates" not in had_study.render(cfg, result)


def _tiny_agent(directory, tok_dir, hidden, seed):
  import shutil

  from harnax import models
  from harnax.models import tokenizer as tokenizer_lib
  from tests.train import tiny

  shutil.copytree(tok_dir, directory)
  tok = tokenizer_lib.Tokenizer.from_dir(directory)
  models.save_pretrained(tiny.tiny_qwen3(tok, hidden, seed), str(directory))
  return str(directory)


def _micro_study(tmp_path):
  """An OPD study of two tiny agents on one tokenizer: one task per type, 2 turns, 8 tokens."""
  from harnax.models import tokenizer as tokenizer_lib
  from harnax.policies import text_agent

  tok_dir = tmp_path / "tok"
  tokenizer_lib.train_tokenizer(
      [text_agent.SYSTEM_PROMPT, "You arrive at cabinet 1. Your task is to: put a apple in "
       "fridge.", "Think: I go there.\nAction: go to fridge 1"], str(tok_dir), vocab_size=400)
  cfg = config_lib.get_config("opd,alfworld,micro")
  cfg.teacher.checkpoint = _tiny_agent(tmp_path / "teacher", tok_dir, 32, 1)
  cfg.student.checkpoint = _tiny_agent(tmp_path / "student", tok_dir, 16, 0)
  cfg.study.methods, cfg.study.ablations, cfg.study.budget2 = ("opd",), (), ()
  cfg.study.output_dir = str(tmp_path / "study")
  ev = cfg.teacher.eval
  ev.settings, ev.per_type, ev.max_steps, ev.max_new_tokens = ("with_harness",), 1, 2, 8
  return cfg


def _run_again_without_work(cfg, monkeypatch):
  """`had_study.run(cfg)` with evaluation and rollouts made to raise: all must be cached."""
  from harnax.studies import text_agents
  from harnax.train import distill_loop

  def no_more(*args, **kw):
    raise AssertionError("evaluated or trained again")

  with monkeypatch.context() as m:
    m.setattr(text_agents, "evaluate", no_more)
    m.setattr(distill_loop, "collect", no_more)
    return had_study.run(cfg)


@pytest.mark.slow
def test_a_micro_study_runs_end_to_end_and_a_second_run_redoes_nothing(tmp_path, monkeypatch):
  from harnax.studies import text_agents

  cfg = _micro_study(tmp_path)
  ev = cfg.teacher.eval
  cfg.max_turns, cfg.max_new_tokens, cfg.train.num_steps = 2, 8, 1
  first = had_study.run(cfg)
  n_tasks = len(text_agents.eval_tasks(cfg.teacher)["seen"])
  for who in ("teacher", "student"):
    assert len(first[who]["with_harness"]["seen"]) == n_tasks
  assert len(first["runs"]["opd"]["with_harness"]["unseen"]) == n_tasks
  assert len(first["history"]["opd"]) == 1 and first["history"]["opd"][0]["step"] == 0
  with open(os.path.join(cfg.study.output_dir, "runs", "opd-seed0", "eval", "key.json")) as f:
    assert first["digests"]["opd"] == [json.load(f)["params"]]
  assert "| opd |" in had_study.render(cfg, first).replace("`", "")

  # Run again: the finished run resumes at its last step and every evaluation is read back.
  second = _run_again_without_work(cfg, monkeypatch)
  assert had_study.metrics(second) == had_study.metrics(first)
  assert had_study.render(cfg, second) == had_study.render(cfg, first)

  # Another evaluation budget is another evaluation: the key differs, so it is redone.
  calls = []
  evaluate = text_agents.evaluate

  def counted(*args, **kw):
    calls.append(kw["max_steps"])
    return evaluate(*args, **kw)

  ev.max_steps = 3
  with monkeypatch.context() as m:
    m.setattr(text_agents, "evaluate", counted)
    had_study.run(cfg)
  assert calls == [3] * 6   # teacher, student, the run; seen and unseen

  # Leaving the teacher out: only the student and the run are evaluated again.
  ev.max_steps, cfg.study.evaluate_teacher, calls[:] = 4, False, []
  with monkeypatch.context() as m:
    m.setattr(text_agents, "evaluate", counted)
    third = had_study.run(cfg)
  assert calls == [4] * 4 and third["teacher"] == {}
  assert "| teacher |" not in had_study.render(cfg, third)


@pytest.mark.slow
def test_a_micro_study_evaluates_its_learning_curve_from_kept_checkpoints(tmp_path, monkeypatch):
  from harnax.studies import text_agents
  from harnax.train import distill_loop

  cfg = _micro_study(tmp_path)
  cfg.max_turns, cfg.max_new_tokens = 2, 8
  cfg.train.num_steps, cfg.train.checkpoint_every, cfg.train.keep_checkpoints = 3, 0, 1
  cfg.train.learning_rate = 0.05             # large enough that each update moves the weights
  cfg.study.curve_steps = (1, 2)
  first = had_study.run(cfg)
  n_tasks = len(text_agents.eval_tasks(cfg.teacher)["seen"])
  assert sorted(first["curve"]["opd"]) == [1, 2]
  for step in (1, 2):
    for split in ("seen", "unseen"):
      assert [len(g) for g in first["curve"]["opd"][step][split]] == [n_tasks]
  # The step-1 point is the student of an independent 1-update run (same seed and data).
  teacher, _ = text_agents.load_agent(cfg.teacher.checkpoint)
  student, tok = text_agents.load_agent(cfg.student.checkpoint)
  one = copy.deepcopy(cfg)
  one.method, one.seed, one.train.num_steps = "opd", 0, 1
  trained, _ = distill_loop.train(one, student, tok, teacher, text_agents.HarnessedGameMaker(
      max_steps=int(cfg.max_turns)), text_agents.train_tasks(cfg.teacher),
      workdir=str(tmp_path / "one"), progress=False)
  run_dir = os.path.join(cfg.study.output_dir, "runs", "opd-seed0")
  digests = {}
  for step in (1, 2):
    with open(os.path.join(run_dir, "eval", f"step_{step:06d}", "key.json")) as f:
      digests[step] = json.load(f)["params"]
  assert digests[1] == had_study.params_digest(trained) != digests[2]
  text = had_study.render(cfg, first)
  assert "| run | split | 0 (student before) | 1 | 2 | 3 |" in text

  # Again: every point is read back, nothing is trained or evaluated.
  second = _run_again_without_work(cfg, monkeypatch)
  assert had_study.metrics(second) == had_study.metrics(first)

  # A point whose checkpoint is gone (as for a run trained before the point was on the curve)
  # is left off, and said, never evaluated on other weights.
  lines = []
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "1"))
  third = had_study.run(cfg, log=lines.append)
  assert third["curve"]["opd"][1] == {"seen": [], "unseen": []}
  assert any("no checkpoint of step 1" in line for line in lines)


def test_the_evaluation_key_is_the_weights_digest():
  from flax import nnx
  import jax

  from harnax import models

  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 64})
  a, b, a2 = (models.from_config(cfg, seed=s) for s in (0, 1, 0))
  assert had_study.params_digest(a) == had_study.params_digest(a2)
  assert had_study.params_digest(a) != had_study.params_digest(b)
  # One value moved by one ulp is another model.
  graphdef, params, rest = nnx.split(a2, nnx.Param, ...)
  leaves, treedef = jax.tree.flatten(params)
  x = np.array(leaves[0])
  x.flat[0] = np.nextafter(x.flat[0], np.float32(np.inf))
  leaves[0] = jax.numpy.asarray(x)
  moved = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)
  assert had_study.params_digest(moved) != had_study.params_digest(a)
