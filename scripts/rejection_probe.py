"""What the distilled students, the student before distillation and the teacher answer at the
states where a run's evaluation had just seen its action rejected (docs/had.md, "Where the
distilled students lose"; the pipeline is `harnax.studies.rejection_probe`).

  python scripts/rejection_probe.py --config=configs/distill.py:had \
      --study_dir=results/had_study/alfworld-cpu-120tasks --runs=had-seed0,opd-seed0

For each run, the states come from its kept evaluation logs (`<run>/eval/`); its last
checkpoint is restored and must have the evaluated weights' digest, and its greedy answers are
checked against the logged ones before the three models are asked. The second column counts,
in the run's training rollouts (sampled), the turns after a rejected action that repeat it.
The last column is the mean total log-probability (nats, end token included) of the run's
answers that repeat, under the run, the student before distillation and the teacher.
"""

import json
import os

from absl import flags
import ml_collections
from ml_collections import config_flags

from harnax.policies import text_agent
from harnax.studies import had_study
from harnax.studies import rejection_probe
from harnax.studies import results
from harnax.studies import text_agents
from harnax.train import distill_loop
from harnax.train import loop as loop_lib
from harnax.train import rollouts

_CONFIG = config_flags.DEFINE_config_file("config", "configs/distill.py:had",
                                          "the study's config (its teacher and student)")
_STUDY = flags.DEFINE_string("study_dir", None, "the study's output_dir", required=True)
_RUNS = flags.DEFINE_list("runs", None, "run directories under <study_dir>/runs",
                          required=True)
_VERB = flags.DEFINE_string("verb", "take", "only actions with this first word ('' for any)")
_SETTING = flags.DEFINE_string("setting", "with_harness", "the evaluation's harness setting")


def _states(eval_dir: str, setting: str, verb: str | None) -> tuple[dict, list]:
  with open(os.path.join(eval_dir, "key.json")) as f:
    key = json.load(f)
  states = []
  for split in key["tasks"]:
    records = rollouts.read_log(os.path.join(eval_dir, f"{setting}-{split}.jsonl"))
    states += rejection_probe.after_rejection(records, verb=verb)
  return key, states


def _restore(workdir: str, student, key: dict):
  with open(os.path.join(workdir, "config.json")) as f:
    train_cfg = ml_collections.ConfigDict(json.load(f))
  steps = loop_lib.checkpoint_steps(workdir)
  if not steps:
    raise ValueError(f"runs: {workdir!r} has no checkpoint")
  model = distill_loop.restore_student(ml_collections.ConfigDict({"train": train_cfg}),
                                       student, workdir, steps[-1])
  if had_study.params_digest(model) != key["params"]:
    raise ValueError(f"runs: the last checkpoint of {workdir!r} (step {steps[-1]}) is not the "
                     "weights its evaluation was made with")
  return model, steps[-1]


def main(argv):
  del argv
  cfg = _CONFIG.value
  verb = _VERB.value or None
  teacher, t_tok = text_agents.load_agent(cfg.teacher.checkpoint or cfg.teacher_dir)
  student, s_tok = text_agents.load_agent(cfg.student.checkpoint or cfg.student_dir)
  rows = []
  for run in _RUNS.value:
    workdir = os.path.join(_STUDY.value, "runs", run)
    key, states = _states(os.path.join(workdir, "eval"), _SETTING.value, verb)
    model, step = _restore(workdir, student, key)
    n_new = int(key["max_new_tokens"])
    rate, outputs = rejection_probe.repeats(
        rejection_probe.greedy(model, s_tok, max_new_tokens=n_new), states)
    same_as_log = sum(o == s.output for o, s in zip(outputs, states))
    before, _ = rejection_probe.repeats(
        rejection_probe.greedy(student, s_tok, max_new_tokens=n_new), states)
    teach, _ = rejection_probe.repeats(
        rejection_probe.greedy(teacher, t_tok, max_new_tokens=n_new), states)
    # How likely each model finds the run's own answer where that answer repeats.
    rep = [(s.context, o) for s, o in zip(states, outputs)
           if text_agent.parse_output(o).action == s.rejected]
    lp = [rejection_probe.output_logprobs(m, t, [c for c, _ in rep], [o for _, o in rep]).mean()
          if rep else float("nan")
          for m, t in ((model, s_tok), (student, s_tok), (teacher, t_tok))]
    trained = rejection_probe.training_repeats(workdir)
    rows.append(f"| {run} (step {step}) | {trained.successes}/{trained.trials} | "
                f"{len(states)} | {same_as_log}/{len(states)} | "
                f"{rate.successes} ({_pct(rate)}) | {before.successes} ({_pct(before)}) | "
                f"{teach.successes} ({_pct(teach)}) | "
                + " / ".join(f"{v:.1f}" for v in lp) + " |")
  what = f"a rejected '{verb}'" if verb else "a rejected action"
  print(f"States after {what} ({_SETTING.value}; the first per episode), and how many answers "
        "repeat it:\n")
  print("| run | training rollouts: repeats after a rejection | states | run's answers = "
        "logged | run repeats | student before repeats | teacher repeats | log p of the run's "
        "repeats: run / student before / teacher |")
  print("|---|---|---|---|---|---|---|---|")
  print("\n".join(rows))


def _pct(rate) -> str:
  return f"{100 * rate.value:.0f} %" if rate.trials else "n/a"


if __name__ == "__main__":
  results.run_script(main)
