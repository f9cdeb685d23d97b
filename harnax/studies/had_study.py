"""The HAD study: a teacher distilled into a student by HAD, each baseline, each ablation and
the teacher-budget-x2 controls, evaluated as the paper does (docs/had.md).

`run(cfg)` (config: `configs/distill.py`; script: `scripts/had_study.py`; `make had-study`):

1. builds (or reuses) the teacher and the student (`harnax.studies.text_agents.build_agent`);
2. for every run (method or ablation, budget, seed) distils the teacher into a fresh copy of
   the student (`harnax.train.distill_loop.train`, its own workdir, so a stopped study
   resumes);
3. evaluates the teacher, the student before distillation and every run with
   `text_agents.evaluate` under the four harness settings on seen and unseen tasks, keeping
   every episode in `<output_dir>/eval/{teacher,student}/` and `<run workdir>/eval/`
   (`<setting>-<split>.jsonl`). An evaluation is reused when its `key.json` (the weights'
   digest, the tasks and the decoding settings) matches, so a stopped or extended study
   (more methods, seeds or settings) redoes neither a finished run nor its evaluation;
4. with `study.curve_steps`, keeps each run's checkpoints at those steps
   (`train.keep_steps`) and evaluates them with the harness (`<run workdir>/eval/step_<N>/`,
   cached the same way): success against the number of updates.

`render(cfg, result)` writes the report in the paper's tables' shape with the paper's numbers
beside ours (success with 95 % Wilson intervals, pooled over seeds, and per run the success of
each seed with a two-stage bootstrap interval over seeds and episodes).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import Callable

from flax import nnx
import jax
import numpy as np

from harnax.studies import text_agents
from harnax.studies import text_metrics
from harnax.train import rollouts

Log = Callable[[str], None]

# The HAD paper's ALFWorld numbers (Qwen3-8B teacher, Qwen3-1.7B student), in percent.
PAPER = {
    "success": {"HAD": {"seen": 51.4, "unseen": 63.4},
                "best baseline": {"seen": 41.4, "unseen": 47.0}},
    "settings": {"with_harness": {"seen": 51.4, "unseen": 63.4},
                 "harness_removed": {"seen": 37.9, "unseen": 40.3},
                 "state_tracking_hidden": {"seen": 40.7, "unseen": 37.3},
                 "action_monitoring_hidden": {"seen": 45.0, "unseen": 56.0}},
    "utilization": {"had": 81.0, "no_negative_action": 74.4, "response distillation only": 73.1},
    "stall_prevention": {"had": 75.9, "others (at most)": 64.6},
    "stall_escape": {"had": 59.7, "student before distillation": 46.8},
    "ablations": {"had": 57.4, "no_validity_filter": 50.8, "no_negative_action": 52.4,
                  "no_preference": 43.5},
    "budget2": {"opd": 46.7, "sopd": 46.8, "before (x1, mean)": 43.5, "had": 57.4},
}


def check_study(cfg) -> None:
  """Raises ValueError naming the field when the study's lists are not what `run` reads:
  checked before anything is built, trained or evaluated (a misspelled setting used to surface
  only at the first evaluation, after the teacher was built)."""
  from harnax.train import distill_loop

  def names(field, value, allowed):
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
      raise ValueError(f"{field}: expected a tuple of names from {allowed}, got {value!r}")
    bad = [v for v in value if v not in allowed]
    if bad:
      raise ValueError(f"{field}: expected names from {allowed}, got {tuple(bad)!r}")

  names("study.methods", cfg.study.methods, distill_loop.METHODS)
  names("study.ablations", cfg.study.ablations, distill_loop.ABLATIONS)
  names("study.budget2", cfg.study.budget2, distill_loop.METHODS)
  settings = cfg.teacher.eval.settings
  names("teacher.eval.settings", settings, tuple(text_agents.SETTINGS))
  if "with_harness" not in settings:
    raise ValueError(f"teacher.eval.settings: expected 'with_harness' among them (every table "
                     f"reads it), got {tuple(settings)!r}")
  seeds = cfg.study.seeds
  if (isinstance(seeds, (str, int)) or not len(seeds)
      or not all(isinstance(v, int) and not isinstance(v, bool) for v in seeds)):
    raise ValueError(f"study.seeds: expected a non-empty tuple of ints, got {seeds!r}")
  curve = cfg.study.get("curve_steps", ())
  steps = int(cfg.train.num_steps)
  if (isinstance(curve, (str, int)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                               and 1 <= v < steps for v in curve)):
    raise ValueError(f"study.curve_steps: expected a tuple of ints in [1, train.num_steps = "
                     f"{steps}), got {curve!r}")
  if not run_names(cfg):
    raise ValueError("study: expected at least one run (study.methods, study.ablations and "
                     "study.budget2 are all empty)")


def run_names(cfg) -> list[tuple[str, str, int]]:
  """`(name, method, teacher_budget)` of every run: methods, ablations, budget-x2 controls."""
  out = [(m, m, 1) for m in cfg.study.methods]
  out += [(a, a, 1) for a in cfg.study.ablations if a not in cfg.study.methods]
  out += [(f"{m}_budget2", m, 2) for m in cfg.study.budget2]
  return out


def run(cfg, *, log: Log | None = None) -> dict:
  """Builds, distils and evaluates (module docstring). Returns ``{"runs": {name: {setting:
  {split: traces}}}, "teacher": ..., "student": ..., "history": {name: [last metrics per
  seed]}, "digests": {name: [trained weights' digest per seed]}, ...}``."""
  from harnax.train import distill_loop

  check_study(cfg)
  say = log or (lambda line: None)
  teacher_dir = cfg.teacher.checkpoint or text_agents.build_agent(cfg.teacher, cfg.teacher_dir,
                                                                   log=say)
  student_dir = cfg.student.checkpoint or text_agents.build_agent(cfg.student, cfg.student_dir,
                                                                   log=say)
  teacher, t_tok = text_agents.load_agent(teacher_dir)
  tasks = text_agents.train_tasks(cfg.teacher)
  evals = text_agents.eval_tasks(cfg.teacher)
  ev = cfg.teacher.eval
  make_game = text_agents.HarnessedGameMaker(max_steps=int(cfg.max_turns))

  def evaluate(model, tok, directory) -> dict:
    return evaluations(model, tok, evals, ev.settings, directory, window=int(cfg.window),
                       max_steps=int(ev.max_steps), batch_size=int(ev.batch_size),
                       max_new_tokens=int(ev.max_new_tokens), log=say)

  def evaluate_with_harness(model, tok, directory) -> dict:
    return evaluations(model, tok, evals, ("with_harness",), directory, window=int(cfg.window),
                       max_steps=int(ev.max_steps), batch_size=int(ev.batch_size),
                       max_new_tokens=int(ev.max_new_tokens), log=say)["with_harness"]

  evals_dir = os.path.join(cfg.study.output_dir, "eval")
  # The teacher's evaluation (the slowest: it decodes the most) can be left out of a study
  # that only compares students; the report then says so.
  out = {"runs": {}, "history": {},
         "teacher": (evaluate(teacher, t_tok, os.path.join(evals_dir, "teacher"))
                     if cfg.study.get("evaluate_teacher", True) else {})}
  student0, s_tok = text_agents.load_agent(student_dir)
  out["student"] = evaluate(student0, s_tok, os.path.join(evals_dir, "student"))
  out["seeds"], out["digests"] = {}, {}
  curve = sorted({int(v) for v in cfg.study.get("curve_steps", ())})
  out["curve"] = {}
  for name, method, budget in run_names(cfg):
    pooled = {s: {split: [] for split in evals} for s in ev.settings}
    per_seed = {s: {split: [] for split in evals} for s in ev.settings}
    out["history"][name], out["digests"][name] = [], []
    out["curve"][name] = {step: {split: [] for split in evals} for step in curve}
    for seed in cfg.study.seeds:
      c = copy.deepcopy(cfg)
      c.method, c.teacher_budget, c.seed = method, budget, int(seed)
      # The curve's checkpoints are kept (keep_steps does not change the trajectory).
      c.train.keep_steps = tuple(sorted(set(curve) | set(c.train.keep_steps)))
      student, tok = text_agents.load_agent(student_dir)
      workdir = os.path.join(cfg.study.output_dir, "runs", f"{name}-seed{seed}")
      trained, result = distill_loop.train(c, student, tok, teacher, make_game, tasks,
                                           workdir=workdir, teacher_tokenizer=t_tok)
      out["history"][name].append(result.history[-1] if result.history else {})
      out["digests"][name].append(params_digest(trained))
      for step in curve:
        traces = _curve_point(c, student, tok, workdir, step, evaluate_with_harness, say)
        for split, ts in (traces or {}).items():
          out["curve"][name][step][split].append(ts)
      for s, splits in evaluate(trained, tok, os.path.join(workdir, "eval")).items():
        for split, traces in splits.items():
          pooled[s][split] += traces
          per_seed[s][split].append(traces)
      say(f"had study: {name} seed {seed}: with harness "
          f"{text_metrics.success(pooled['with_harness']['unseen'])} unseen")
    out["runs"][name] = pooled
    out["seeds"][name] = per_seed
  return out


def _curve_point(cfg, student, tokenizer, workdir: str, step: int, evaluate, say):
  """`{split: traces}` with the harness of a run's student after `step` updates, kept in
  ``<workdir>/eval/step_<step>/``; None (and a log line) when that checkpoint was not kept (a
  run trained before the step was on the curve)."""
  from harnax.train import distill_loop

  try:
    model = distill_loop.restore_student(cfg, student, workdir, step)
  except ValueError as e:
    if "no checkpoint of step" not in str(e):
      raise
    say(f"had study: {workdir}: no checkpoint of step {step} was kept; it is left off the "
        "curve")
    return None
  return evaluate(model, tokenizer, os.path.join(workdir, "eval", f"step_{step:06d}"))


def params_digest(model) -> str:
  """SHA-256 of a model's parameters (names, shapes, dtypes and values): two models with one
  digest decode identically."""
  h = hashlib.sha256()
  leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))
  for path, leaf in leaves:
    x = np.asarray(leaf)
    h.update(f"{jax.tree_util.keystr(path)}|{x.dtype}|{x.shape}|".encode())
    h.update(np.ascontiguousarray(x).tobytes())
  return h.hexdigest()


def evaluations(model, tokenizer, tasks: dict, settings, directory: str, *, window: int,
                max_steps: int, batch_size: int, max_new_tokens: int,
                log: Log | None = None) -> dict:
  """`{setting: {split: [EpisodeTrace]}}` of greedy `text_agents.evaluate` runs, cached.

  Every evaluation's episodes are kept in ``directory/<setting>-<split>.jsonl`` (written to a
  temporary name and renamed when complete). ``directory/key.json`` holds what decides them:
  the weights' digest, the task identities and the decoding settings; a directory whose key
  differs is evaluated again (its logs replaced), one whose key matches is read back.

  Args:
    model, tokenizer: the agent.
    tasks: `{split: [GameTask]}`.
    settings: names of `text_agents.SETTINGS`.
    directory: where the logs and the key live.
    window, max_steps, batch_size, max_new_tokens: as in `text_agents.evaluate`
      (``batch_size`` is not in the key: it does not change greedy decoding's choices).
  """
  say = log or (lambda line: None)
  key = dict(format=1, params=params_digest(model), vocab_size=int(tokenizer.vocab_size),
             window=int(window), max_steps=int(max_steps), max_new_tokens=int(max_new_tokens),
             tasks={split: [t.ident for t in ts] for split, ts in tasks.items()})
  key_path = os.path.join(directory, "key.json")
  os.makedirs(directory, exist_ok=True)
  cached = None
  if os.path.exists(key_path):
    with open(key_path) as f:
      cached = json.load(f)
  if cached != key:
    if cached is not None:
      say(f"had study: {directory}: the model or the evaluation changed; evaluating again")
    for name in os.listdir(directory):
      if name.endswith(".jsonl"):
        os.remove(os.path.join(directory, name))
    tmp = key_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(key, f, indent=1)
    os.replace(tmp, key_path)
  out = {}
  for setting in settings:
    out[setting] = {}
    for split, ts in tasks.items():
      path = os.path.join(directory, f"{setting}-{split}.jsonl")
      if not os.path.exists(path):
        tmp = path + ".tmp"
        text_agents.evaluate(model, tokenizer, ts, setting, window=window, max_steps=max_steps,
                             batch_size=batch_size, max_new_tokens=max_new_tokens,
                             log_path=tmp)
        os.replace(tmp, path)
      out[setting][split] = text_agents.traces_from_log(rollouts.read_log(path))
  return out


def _pct(rate: text_metrics.Rate) -> str:
  if not rate.trials:
    return "n/a"
  lo, hi = rate.interval()
  return f"{100 * rate.value:.1f} [{100 * lo:.0f}, {100 * hi:.0f}] ({rate.successes}/{rate.trials})"


def _paper(x) -> str:
  return "—" if x is None else f"{x:.1f}"


def _summary(by_setting: dict, setting: str = "with_harness") -> dict:
  traces = [t for split in ("seen", "unseen") for t in by_setting.get(setting, {}).get(split, [])]
  return text_metrics.summarize(traces)


def _models(result: dict) -> dict:
  """`{model: {setting: {split: traces}}}`: every run, then the teacher (unless the study left
  its evaluation out) and the student before distillation."""
  teacher = {"teacher": result["teacher"]} if result["teacher"] else {}
  return dict(result["runs"], **teacher, student=result["student"])


def render(cfg, result: dict) -> str:
  """The report (markdown): our numbers with 95 % Wilson intervals beside the paper's."""
  from harnax.studies.results import markdown_table

  runs = result["runs"]
  everyone = _models(result)
  game = "ALFWorld" if cfg.game == "alfworld" else "ScienceWorld"
  lines = [f"# HAD and its baselines on {game}", "",
           f"Teacher `{os.path.basename(str(cfg.teacher_dir))}`, student "
           f"`{os.path.basename(str(cfg.student_dir))}`; {cfg.train.num_steps} distillation "
           f"updates of {cfg.episodes_per_step} episodes each; seeds {tuple(cfg.study.seeds)} "
           "pooled. Cells: success % [95 % Wilson interval] (won/episodes). The paper's numbers "
           "are ALFWorld, Qwen3-8B teacher and Qwen3-1.7B student.", ""]
  if cfg.get("rd_after_rejection", "keep") != "keep":
    lines += ["**Not the published losses:** every run's reverse KL leaves out the turns right "
              f"after a rejected action (`rd_after_rejection={cfg.rd_after_rejection!r}`; "
              "docs/had.md).", ""]
  if cfg.get("pref_against_reasoning", "keep") != "keep":
    lines += ["**Not the published preference term:** HAD's pairs whose a⁺ is another action "
              "than the one the student's reasoning named and took are left out of it "
              f"(`pref_against_reasoning={cfg.pref_against_reasoning!r}`; docs/had.md).", ""]
  if cfg.get("pref_after_rejection", "keep") != "keep":
    lines += ["**Not the published preference term:** HAD's pairs at the turns right after a "
              "rejected action are left out of it "
              f"(`pref_after_rejection={cfg.pref_after_rejection!r}`; docs/had.md).", ""]
  if cfg.get("pref_lambda") is not None:
    lines += ["**Not the published balancing:** the preference term is weighted by a fixed "
              f"λ = {float(cfg.pref_lambda):g}, not by the gradient-norm ratio of each "
              "minibatch (`pref_lambda`; docs/had.md).", ""]
  if not result["teacher"]:
    lines += ["The teacher was not evaluated (`study.evaluate_teacher=False`): its rows are "
              "left out.", ""]
  wins = sum(text_metrics.success([t for s in by.values() for sp in s.values() for t in sp])
             .successes for by in runs.values())
  teacher_wins = text_metrics.success(
      [t for s in result["teacher"].values() for sp in s.values() for t in sp]).successes
  if wins == 0:
    lines += ["**The miniature does not reproduce the paper's comparisons: no distilled "
              "student wins a single evaluation game, so every success gap below is 0 and "
              "none of the paper's orderings can be observed.** "
              + ("" if not result["teacher"] else
                 "The teacher does not win either (docs/text_agents.md). " if not teacher_wins
                 else f"The teacher wins {teacher_wins} of its evaluation games. ")
              + "The behaviour metrics (utilization, stalls) still compare how the students act "
              "through the harness.", ""]
  # The columns of the settings evaluated: with the harness always (check_study), removed if so.
  shown = [s for s in ("with_harness", "harness_removed") if s in cfg.teacher.eval.settings]
  lines += ["## Success (%) with the harness" + (" and with it removed" if len(shown) > 1
                                                  else ""), ""]
  header = (["model"] + [f"{'with harness' if s == 'with_harness' else 'removed'} / {split}"
                         for s in shown for split in ("seen", "unseen")]
            + ["paper (with, seen / unseen)"])
  rows = []
  for name, by in everyone.items():
    paper = PAPER["success"]["HAD"] if name == "had" else None
    rows.append([name] + [_pct(text_metrics.success(by.get(s, {}).get(split, [])))
                          for s in shown for split in ("seen", "unseen")]
                + [f"{paper['seen']} / {paper['unseen']}" if paper else "—"])
  best = PAPER["success"]["best baseline"]
  rows.append(["paper: best baseline"] + [""] * (2 * len(shown))
              + [f"{best['seen']} / {best['unseen']}"])
  lines += [markdown_table(header, rows), ""]
  lines += _same_weights_note(result)
  if result.get("seeds"):
    lines += _seed_table(result["seeds"])
    lines += _paired_table(result)
  lines += _curve_table(cfg, result)
  if "had" in runs:
    lines += ["## HAD under the four settings", ""]
    header = ["setting", "HAD seen", "HAD unseen", "paper seen", "paper unseen"]
    rows = []
    for s in cfg.teacher.eval.settings:
      by = runs["had"].get(s, {})
      p = PAPER["settings"].get(s, {})
      rows.append([s, _pct(text_metrics.success(by.get("seen", []))),
                   _pct(text_metrics.success(by.get("unseen", []))), _paper(p.get("seen")),
                   _paper(p.get("unseen"))])
    lines += [markdown_table(header, rows), ""]
  # Every model with one part of the harness hidden: the paper reports HAD only; the teacher,
  # the student before distillation and the baselines show which part each one relies on.
  hidden = [s for s in ("state_tracking_hidden", "action_monitoring_hidden")
            if s in cfg.teacher.eval.settings]
  if hidden:
    lines += ["## Every model with part of the harness hidden", ""]
    header = ["model"] + [f"{s} / {split}" for s in hidden for split in ("seen", "unseen")]
    rows = [[name] + [_pct(text_metrics.success(by.get(s, {}).get(split, [])))
                      for s in hidden for split in ("seen", "unseen")]
            for name, by in everyone.items()]
    rows.append(["paper: HAD"] + [_paper(PAPER["settings"][s][split])
                                  for s in hidden for split in ("seen", "unseen")])
    lines += [markdown_table(header, rows), ""]
  lines += ["## How each model acts through the harness", ""]
  header = ["model", "harness utilization", "stall prevention", "stall escape (5 turns)"]
  rows = [[name] + [_pct(_summary(by)[k]) for k in ("harness_utilization", "stall_prevention",
                                                    "stall_escape")]
          for name, by in everyone.items()]
  lines += [markdown_table(header, rows), "",
            "Paper: utilization HAD 81.0 vs 73.1 with response distillation only (74.4 without "
            "the negative action); stall prevention HAD 75.9 vs at most 64.6 for the others; "
            "stall escape HAD 59.7 vs 46.8 for the student before distillation.", ""]
  header = ["run", "ours", "paper"]
  rows = []
  ablated = any(n in runs for n in ("had",) + tuple(PAPER["ablations"]))
  for name, paper in list(PAPER["ablations"].items()) + [
      (f"{m}_budget2", PAPER["budget2"].get(m)) for m in cfg.study.budget2]:
    by, label = runs.get(name), name
    if by is None and name == "no_preference" and ablated and "opd" in runs:
      # Without the preference term HAD's update is OPD's, to the bit (distill_loop; tested),
      # so a study that trained OPD needs no second run of it.
      by, label = runs["opd"], "no_preference (OPD's runs: the same update)"
    if by is None:
      continue
    traces = [t for sp in by.get("with_harness", {}).values() for t in sp]
    rows.append([label, _pct(text_metrics.success(traces)), _paper(paper)])
  if rows:    # none when the study ran none of HAD, its ablations and the budget controls
    lines += ["## Ablations and the teacher budget (success with the harness, seen and unseen "
              "pooled)", "",
              "The paper's figure here is the mean of the two splits with the harness (HAD's "
              "57.4 is the mean of its 51.4 seen and 63.4 unseen); pooling equal splits gives "
              "the same mean.", "", markdown_table(header, rows), "",
              "The paper's budget control: OPD and SOPD with twice the teacher budget rise from "
              "43.5 to 46.7 and 46.8, below HAD's 57.4.", ""]
  return "\n".join(lines)


def same_weights(result: dict) -> list[tuple[str, ...]]:
  """Groups of runs whose trained weights have the same digest in every seed (the same model
  evaluated more than once, e.g. an ablation that reduces to a baseline), each sorted."""
  groups = {}
  for name, digests in (result.get("digests") or {}).items():
    if digests:
      groups.setdefault(tuple(digests), []).append(name)
  return sorted(tuple(sorted(g)) for g in groups.values() if len(g) > 1)


def _same_weights_note(result: dict) -> list[str]:
  same = same_weights(result)
  if not same:
    return []
  names = "; ".join(" = ".join(f"`{n}`" for n in g) for g in same)
  return [f"**The same weights in every seed:** {names}. Their rows are one model evaluated "
          "again, not independent agreement.", ""]


def _seed_table(seeds: dict) -> list[str]:
  """Success with the harness per training seed, and the pooled success with its two-stage
  bootstrap interval (text_metrics.seed_bootstrap): the interval a reader should compare."""
  from harnax.studies.results import markdown_table

  header = ["run", "seen: per seed", "seen: pooled [bootstrap 95 %]", "unseen: per seed",
            "unseen: pooled [bootstrap 95 %]"]
  rows = []
  for name, by in seeds.items():
    row = [name]
    for split in ("seen", "unseen"):
      groups = by.get("with_harness", {}).get(split, [])
      row.append(", ".join(f"{100 * text_metrics.success(g).value:.0f}" for g in groups)
                 or "—")
      value, lo, hi = text_metrics.seed_bootstrap(groups)
      row.append("n/a" if value != value else
                 f"{100 * value:.1f} [{100 * lo:.0f}, {100 * hi:.0f}]")
    rows.append(row)
  return ["### With the harness, seed by seed", "",
          "Each seed is one distillation run from the same student; the bootstrap draws seeds, "
          "then each drawn seed's games, so the interval includes the run-to-run spread.", "",
          markdown_table(header, rows), ""]


def _paired(result: dict) -> dict:
  """`{model: {split: [PairedWins per seed]}}` with the harness, each evaluation against the
  student before distillation on the same tasks (the teacher: its one evaluation)."""
  before = result["student"].get("with_harness", {})
  return {name: {split: [text_metrics.paired_wins(before[split], g) for g in groups]
                 for split, groups in by.items() if split in before}
          for name, by in _paired_models(result).items()}


def _paired_models(result: dict) -> dict:
  """`{model: {split: [episodes per seed]}}` with the harness, the teacher first (one group;
  none when it was not evaluated)."""
  models = {"teacher": {split: [traces] for split, traces
                        in result["teacher"].get("with_harness", {}).items()}}
  if not result["teacher"]:
    models = {}
  models.update({name: by.get("with_harness", {}) for name, by in result["seeds"].items()})
  return models


def _pooled_against_student(result: dict) -> dict:
  """`{model: {split: PooledPairedWins}}`: every seed's run against the student before."""
  before = result["student"].get("with_harness", {})
  return {name: {split: text_metrics.pooled_paired_wins([before[split]] * len(groups), groups)
                 for split, groups in by.items() if split in before and groups}
          for name, by in _paired_models(result).items()}


def _pooled_had_against_others(result: dict) -> dict:
  """`{run: {split: PooledPairedWins}}`: the other run of seed k (before) against HAD's run of
  seed k (after), over the seeds both have."""
  had = result["seeds"].get("had", {}).get("with_harness", {})
  out = {}
  for name, by in result["seeds"].items():
    if name == "had" or not had:
      continue
    by = by.get("with_harness", {})
    out[name] = {}
    for split in ("seen", "unseen"):
      k = min(len(had.get(split, [])), len(by.get(split, [])))
      if k:
        out[name][split] = text_metrics.pooled_paired_wins(by[split][:k], had[split][:k])
  return out


def _wins_cell(p) -> str:
  """`+gained/-lost (p value)` of a `PairedWins` or `PooledPairedWins`."""
  return f"+{p.gained}/-{p.lost} (p {p.p_value:.2g})"


def _pooled_cell(p) -> str:
  """The pooled test in the report: tasks ahead and behind over the seeds, and its p-value."""
  return f"{p.ahead} ahead, {p.behind} behind (p {p.p_value:.2g})"


def _paired_table(result: dict) -> list[str]:
  """Each model against the student before, and HAD against each other run, task by task:
  tasks gained and lost with the exact McNemar p-value per seed, and the seeds pooled by the
  task-level sign-flip test (`text_metrics.pooled_paired_wins`)."""
  from harnax.studies.results import markdown_table

  header = ["seen: per seed", "seen: seeds pooled", "unseen: per seed", "unseen: seeds pooled"]
  paired, pooled = _paired(result), _pooled_against_student(result)
  rows = []
  for name, by in paired.items():
    row = [name]
    for split in ("seen", "unseen"):
      row.append("; ".join(_wins_cell(p) for p in by.get(split, [])) or "—")
      row.append(_pooled_cell(pooled[name][split]) if split in pooled.get(name, {}) else "—")
    rows.append(row)
  out = ["### Against the student before, task by task (with the harness)", "",
         "The same tasks in the same order: +gained (won now, not by the student before) / "
         "-lost (the reverse), and the exact two-sided McNemar p-value of no change, one "
         "per seed. Tasks that both or neither win carry no information about a change. The "
         "seeds share the tasks, so their discordant tasks are not pooled into one McNemar "
         "test; the pooled column sums each task's change over the seeds and counts the tasks "
         "ahead and behind, with the exact sign-flip test over tasks (docs/text_eval.md).", "",
         markdown_table(["model"] + header, rows), ""]
  others = _pooled_had_against_others(result)
  if others:
    had = result["seeds"]["had"]["with_harness"]
    rows = []
    for name, pooled in others.items():
      by = result["seeds"][name].get("with_harness", {})
      row = [name]
      for split in ("seen", "unseen"):
        pairs = [text_metrics.paired_wins(b, a)
                 for a, b in zip(had.get(split, []), by.get(split, []))]
        row.append("; ".join(_wins_cell(p) for p in pairs) or "—")
        row.append(_pooled_cell(pooled[split]) if split in pooled else "—")
      rows.append(row)
    out += ["### HAD against each other run, task by task (with the harness)", "",
            "HAD's run of seed k against the other run of seed k on the same tasks: +tasks "
            "HAD wins and the other does not / -the reverse, with the exact McNemar p-value; "
            "pooled: the tasks where HAD is ahead and behind over the seeds, with the exact "
            "sign-flip test over tasks.",
            "", markdown_table(["against"] + header, rows), ""]
  return out


def _curve_table(cfg, result: dict) -> list[str]:
  """Success with the harness after 0 (the student before distillation), each of
  `study.curve_steps` and all `train.num_steps` updates, pooled over seeds, per split."""
  from harnax.studies.results import markdown_table

  curve = result.get("curve") or {}
  steps = sorted({step for by in curve.values() for step in by})
  if not steps:
    return []
  final = int(cfg.train.num_steps)
  header = ["run", "split", "0 (student before)"] + [str(step) for step in steps] + [str(final)]
  rows = []
  for name, by in curve.items():
    for split in ("seen", "unseen"):
      cells = [_pct(text_metrics.success(
          result["student"].get("with_harness", {}).get(split, [])))]
      cells += [_pct(text_metrics.success([t for g in by[step].get(split, []) for t in g]))
                for step in steps]
      cells.append(_pct(text_metrics.success(
          result["runs"].get(name, {}).get("with_harness", {}).get(split, []))))
      rows.append([name, split] + cells)
  return ["## Success with the harness by number of updates", "",
          "Each run's checkpoints at `study.curve_steps`, evaluated like the final one and "
          "pooled over seeds (a point that a run did not keep counts fewer games).", "",
          markdown_table(header, rows), ""]


def metrics(result: dict) -> dict:
  """Counts per model, setting and split (JSON)."""
  out = {}
  everyone = _models(result)
  for name, by in everyone.items():
    for s, splits in by.items():
      for split, traces in splits.items():
        out[f"{name}/{s}/{split}"] = {k: {"successes": v.successes, "trials": v.trials}
                                      for k, v in text_metrics.summarize(traces).items()}
  out["history"] = result.get("history", {})
  out["digests"] = result.get("digests", {})
  out["same_weights"] = [list(g) for g in same_weights(result)]
  # Per run, setting and split: the games won and played by each training seed.
  out["seeds"] = {name: {s: {split: [[text_metrics.success(g).successes,
                                      text_metrics.success(g).trials] for g in groups]
                             for split, groups in splits.items()}
                         for s, splits in by.items()}
                  for name, by in result.get("seeds", {}).items()}
  # Per model and split, against the student before on the same tasks: per seed, the tasks
  # gained, lost, won by both and by neither.
  if result.get("seeds"):
    out["paired"] = {name: {split: [[p.gained, p.lost, p.both, p.neither] for p in ps]
                            for split, ps in by.items()}
                     for name, by in _paired(result).items()}
    # The seeds pooled task by task: tasks ahead, tasks behind, and the sign-flip p-value.
    def pooled(by):
      return {split: {"ahead": p.ahead, "behind": p.behind, "seeds": p.seeds,
                      "p_value": p.p_value} for split, p in by.items()}
    out["pooled_paired"] = {name: pooled(by)
                            for name, by in _pooled_against_student(result).items()}
    out["had_against"] = {name: pooled(by)
                          for name, by in _pooled_had_against_others(result).items()}
  # Per run, curve step and split: the games won and played by each seed that kept the step.
  out["curve"] = {name: {str(step): {split: [[text_metrics.success(g).successes,
                                              text_metrics.success(g).trials] for g in groups]
                                     for split, groups in splits.items()}
                         for step, splits in by.items()}
                  for name, by in result.get("curve", {}).items()}
  return out
