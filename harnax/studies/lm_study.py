"""The harness-transfer study with a language model: `make demo`'s main job.

The paper (docs/harnesses.md) post-trains a language model by exact policy gradient on
each MiniWoB++ harness H0–H5 and reads every checkpoint through every harness. Here:

1. the base model: a small Qwen3-architecture model with a locally trained tokenizer,
   pre-trained by next-token learning on H0 transcripts of a reference policy
   (`harnax.studies.base_model`), or any Hugging Face checkpoint directory;
2. per task family, `harnax.studies.miniwob.run_family` with the LM behind the harness
   (`harnax.studies.families.LMFamily`): one checkpoint post-trained per harness on the
   training instances, every checkpoint evaluated on every harness on held-out instances,
   the swaps adapted, the continued-training control, the field reversal;
3. the same protocol with the log-linear family, the cheap second family;
4. the headline table: each of the paper's findings beside what each family gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import numpy as np

from harnax import estimate as he
from harnax import models
from harnax.envs import miniwob as mw
from harnax.studies import base_model as base_model_lib
from harnax.studies import families
from harnax.studies import miniwob
from harnax.studies import miniwob_report
from harnax.studies import results

POLICIES = ("lm", "log_linear")


def load_base_model(cfg, *, log: results.Log | None = None):
  """`(model, tokenizer, directory)`: `cfg.model_dir` if set, else the built base model."""
  directory = cfg.model_dir
  if not directory:
    check_held_out_unseen(cfg)
    directory = base_model_lib.build_base_model(base_model_config(cfg), cfg.base_model_dir,
                                                log=log)
  if not os.path.isdir(directory):
    raise ValueError(f"model_dir: {directory!r} is not a directory (expected a Hugging Face "
                     "model directory with config.json, weights and tokenizer files)")
  model = models.load_pretrained(directory)
  tokenizer = models.Tokenizer.from_dir(directory)
  return model, tokenizer, directory


def base_model_config(cfg):
  """`cfg.base_model` over the study's families and discount.

  The base model pre-trains on its own pool of instances (`cfg.base_model.num_train` drawn
  from `cfg.base_model.split_seed`), which must not contain any of the study's held-out
  instances: `run` checks that before building.
  """
  c = cfg.base_model.copy_and_resolve_references()
  with c.unlocked():
    c.families = tuple(cfg.families)
    c.discount = cfg.discount
  return c


def check_held_out_unseen(cfg) -> None:
  """A clear error when the base model's pre-training pool holds a held-out instance."""
  pool = base_model_lib.training_tasks(base_model_config(cfg))
  for family in cfg.families:
    _, test = mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)
    seen = [t for t in test if t in pool[family]]
    if seen:
      raise ValueError(f"base_model.split_seed: the base model's pre-training instances of "
                       f"{family} include {len(seen)} of the study's held-out instances; draw "
                       f"the pool from another seed range (e.g. split_seed=1000)")


def runs_dir(cfg) -> str:
  """`<output_dir>/runs/<config hash>`: a rerun of the same config resumes its post-training
  runs (harnax.train's exact resume); another config starts its own."""
  text = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
  return os.path.join(cfg.output_dir, "runs", hashlib.sha256(text.encode()).hexdigest()[:12])


def check_config(cfg) -> None:
  """Clear errors for the config fields before anything is built."""
  unknown = [f for f in cfg.families if f not in mw.FAMILIES]
  if unknown:
    raise ValueError(f"families: expected names from {mw.FAMILIES}, got {unknown}")
  bad = [p for p in cfg.policies if p not in POLICIES]
  if bad or not cfg.policies:
    raise ValueError(f"policies: expected a non-empty subset of {POLICIES}, got "
                     f"{tuple(cfg.policies)}")
  for h in cfg.harnesses:
    if h not in mw.HARNESSES:
      raise ValueError(f"harnesses: expected names from {mw.HARNESSES}, got {h!r}")
  if cfg.pi_ref not in miniwob.PI_REFS:
    raise ValueError(f"pi_ref: expected one of {miniwob.PI_REFS}, got {cfg.pi_ref!r}")
  swaps = miniwob_report.swaps_of(cfg)
  for a, b in (() if swaps == "select" else swaps):
    if a not in cfg.harnesses or b not in cfg.harnesses:
      raise ValueError(f"swaps: ({a!r}, {b!r}) names a harness not in {tuple(cfg.harnesses)}")
  max_swaps = cfg.get("max_swaps")
  if max_swaps is not None and (not isinstance(max_swaps, int) or max_swaps < 0):
    raise ValueError(f"max_swaps: expected None or a non-negative int, got {max_swaps!r}")


def run(cfg, *, log: results.Log | None = None) -> dict:
  """Runs the study; `{"policies": {name: {family: FamilyStudy}}, "seconds", "model_dir"}`."""
  check_config(cfg)
  log = log or (lambda _: None)
  t0 = time.time()
  out: dict[str, Any] = {"policies": {}}
  model = tokenizer = None
  if "lm" in cfg.policies:
    model, tokenizer, out["model_dir"] = load_base_model(cfg, log=log)
    log(f"base model: {out['model_dir']} ({models.param_count(model):,} parameters)")
  for name in cfg.policies:
    out["policies"][name] = {}
    for family in cfg.families:
      train, test = mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)
      if name == "lm":
        policy = families.LMFamily(
            model, tokenizer, learning_rate=cfg.lm.learning_rate,
            micro_batch=cfg.lm.micro_batch, train_config=cfg.lm.get("train"),
            workdir=(os.path.join(runs_dir(cfg), family) if cfg.lm.get("keep_runs")
                     else None))
        steps, adapt = cfg.lm.steps, cfg.lm.adapt_steps
      else:
        policy = families.LogLinearFamily(cfg.log_linear.learning_rate)
        steps, adapt = cfg.log_linear.steps, cfg.log_linear.adapt_steps
      out["policies"][name][family] = miniwob.run_family(
          family, train, test, tau=cfg.tau, discount=cfg.discount, steps=steps,
          adapt_steps=adapt, harnesses=tuple(cfg.harnesses),
          swaps=miniwob_report.swaps_of(cfg), max_swaps=cfg.get("max_swaps"), policy=policy,
          pi_ref=cfg.pi_ref,
          controls=tuple(cfg.controls) if cfg.get("controls") is not None else None,
          log=lambda m, n=name: log(f"[{n}] {m}"))
  out["seconds"] = time.time() - t0
  return out


# -- the paper's findings, measured ---------------------------------------------------------

PAPER = {
    "post_training_raises_success": "every harness",
    "own_success": "—",
    "reversal_success": "85.0 % → 19.2 %",
    "reversal_flips": "about half of the states",
    "h1_ceiling": "slightly up",
    "h1_mismatch_ratio": "~10×",
    "h1_success": "down",
    "h1_adapted_vs_controls": "beats both",
    "swaps_rejected": "9 of the swaps",
    "wins_dc_up": "7 / 7",
    "wins_dc_down": "0 / 2",
    "spearman_T": "0.95",
    "spearman_frozen": "0.17",
    "error_reduction": "69–90 %",
    "own_lowest": "every checkpoint",
    "reversal_decomposition": "target fixed, readout moves",
    "ranking_exact": "only C − M",
}

LABELS = {
    "post_training_raises_success": "post-training raises success on",
    "own_success": "success, own checkpoint (mean over harnesses)",
    "reversal_success": "success when the fields are reversed",
    "reversal_flips": "states whose most likely output changes (reversal)",
    "h1_ceiling": "H1: ceiling change ΔC",
    "h1_mismatch_ratio": "H1: frozen mismatch, M_H1(π_H0) / M_H0(π_H0)",
    "h1_success": "H1: success change of the frozen H0 checkpoint",
    "h1_adapted_vs_controls": "H0 → H1 adapted vs. original and H0-continued",
    "swaps_rejected": "swaps the frozen comparison rejects with T > 0",
    "wins_dc_up": "… of those raising C: adaptation wins",
    "wins_dc_down": "… of those lowering C: adaptation wins",
    "spearman_T": "Spearman(T = ΔC + M_H(π), realized gain)",
    "spearman_frozen": "Spearman(frozen return change, realized gain)",
    "error_reduction": "score error reduction by post-training (own harness)",
    "own_lowest": "checkpoints with their lowest score error on their own harness",
    "reversal_decomposition": "field reversal: target shift / readout drift (RMS)",
    "ranking_exact": "full harness ranking right (own checkpoints vs success, per family)",
}


def _pct(x):
  return f"{100 * x:.1f} %"


def findings(studies: dict[str, miniwob.FamilyStudy]) -> dict[str, str]:
  """The headline quantities of one policy family, pooled over task families."""
  fams = list(studies.values())
  names = fams[0].harnesses
  out = {}
  raised = [int(np.sum(s.success["frozen"].diagonal() > s.success["base"])) for s in fams]
  out["post_training_raises_success"] = (f"{sum(raised)} / {len(names) * len(fams)} "
                                         "(harness, family) pairs")
  own = np.mean([s.success["frozen"].diagonal() for s in fams])
  base = np.mean([s.success["base"] for s in fams])
  out["own_success"] = f"{_pct(own)} (base model {_pct(base)})"
  rev = np.mean([s.success["reversed"] for s in fams])
  out["reversal_success"] = f"{_pct(own)} → {_pct(rev)}"
  out["reversal_flips"] = _pct(np.mean([s.decision_flips for s in fams]))
  if "H0" in names and "H1" in names:
    i, j = names.index("H0"), names.index("H1")
    dc = np.mean([s.frozen.ceiling[j, j] - s.frozen.ceiling[i, i] for s in fams])
    ratio = np.mean([s.frozen.mismatch[i, j] / max(s.frozen.mismatch[i, i], 1e-12)
                     for s in fams])
    ds = np.mean([s.success["frozen"][i, j] - s.success["frozen"][i, i] for s in fams])
    out["h1_ceiling"] = f"{dc:+.4f}"
    out["h1_mismatch_ratio"] = f"{ratio:.1f}×"
    out["h1_success"] = f"{100 * ds:+.1f} points"
    pairs = [(s.adapted[(i, j)].value, s.frozen.value[i, i], s.continued[i].value)
             for s in fams if (i, j) in s.adapted]
    if pairs:
      beats = sum(a > o and a > c for a, o, c in pairs)
      out["h1_adapted_vs_controls"] = f"beats both in {beats} / {len(pairs)} families"
  # The paper's selection over every ordered pair; wins among the adapted ones.
  pairs = [r for s in fams for r in miniwob_report.selection(s)["pairs"]]
  sel = [r for r in pairs if r["selected"]]
  out["swaps_rejected"] = f"{len(sel)} of {len(pairs)} ordered pairs"
  for key, up in (("wins_dc_up", True), ("wins_dc_down", False)):
    side = [r for r in sel if (r["delta_ceiling"] > 0) == up and np.isfinite(r["realized_gain"])]
    out[key] = f"{sum(r['realized_gain'] > 0 for r in side)} / {len(side)} adapted"
  rows = [r for s in fams for r in miniwob.swap_rows(s)]
  t = np.array([r["threshold"] for r in rows])
  frozen = np.array([r["frozen_change"] for r in rows])
  gain = np.array([r["realized_gain"] for r in rows])
  if len(rows) > 2 and np.isfinite(gain).all() and np.ptp(gain) > 0:
    out["spearman_T"] = f"{float(he.spearman(t, gain)):+.2f}"
    out["spearman_frozen"] = f"{float(he.spearman(frozen, gain)):+.2f}"
  if all(s.errors is not None for s in fams):
    errs = [miniwob_report.errors(s) for s in fams]
    red = np.concatenate([e["reduction"] for e in errs])
    out["error_reduction"] = f"{_pct(red.min())} to {_pct(red.max())}"
    lowest = sum(int(np.sum(e["own_lowest_in_row"])) for e in errs)
    out["own_lowest"] = f"{lowest} / {len(names) * len(fams)}"
    shift = max(d["target_shift"] for s in fams for d in s.reversal_decompositions)
    drift = np.mean([d["readout_drift"] for s in fams for d in s.reversal_decompositions])
    out["reversal_decomposition"] = f"{shift:.3f} / {drift:.3f}"
    if len(names) > 2:
      ranks = [miniwob_report.rankings(s)["own checkpoints"]["success"] for s in fams]
      out["ranking_exact"] = ", ".join(
          f"{k} {sum(r[k]['exact'] for r in ranks)} / {len(ranks)}" for k in ("C − M", "C", "M"))
  return out


def headline_table(result) -> str:
  """The paper's findings beside each policy family's."""
  found = {name: findings(st) for name, st in result["policies"].items()}
  header = ["finding", "paper (Qwen3.5-2B)"] + [_policy_label(n) for n in found]
  rows = [[LABELS[k], PAPER[k]] + [found[n].get(k, "—") for n in found] for k in LABELS]
  return results.markdown_table(header, rows)


def _policy_label(name: str) -> str:
  return {"lm": "harnax, LM", "log_linear": "harnax, log-linear"}[name]


def disagreements(result) -> list[str]:
  """Findings where the two families point different ways (sign or direction)."""
  if set(result["policies"]) != set(POLICIES):
    return []
  a, b = (findings(result["policies"][n]) for n in POLICIES)
  out = []
  for k in ("h1_ceiling", "h1_success", "spearman_T", "spearman_frozen"):
    if k in a and k in b and (a[k].lstrip().startswith("-") != b[k].lstrip().startswith("-")):
      out.append(f"{LABELS[k]}: LM {a[k]}, log-linear {b[k]}")
  return out


def render(cfg, result) -> str:
  """The markdown report: the headline table, then every family's tables per policy."""
  parts = ["# The harness-transfer study with a language model", "",
           f"Families {', '.join(cfg.families)}; {cfg.num_train} training and {cfg.num_test} "
           f"held-out instances each (split seed {cfg.split_seed}); γ = {cfg.discount}, "
           f"τ = {cfg.tau}, π_ref = {cfg.pi_ref}. LM: {cfg.lm.steps} exact policy-gradient "
           f"steps per harness, {cfg.lm.adapt_steps} to adapt"
           + (f" (base model {result.get('model_dir')})" if "model_dir" in result else "")
           + f". Run time {result['seconds']:.0f} s.", "",
           "## Headline: the paper's findings beside ours", "", headline_table(result), ""]
  dis = disagreements(result)
  if dis:
    parts += ["Where the LM and the log-linear family disagree:", ""] + [f"- {d}" for d in dis]
    parts += [""]
  for name, studies in result["policies"].items():
    for family, s in studies.items():
      parts += [f"## {_policy_label(name)}: {family}", "", miniwob_report.harness_table(s), "",
                miniwob_report.success_table(s), "",
                miniwob_report.swap_table(miniwob.swap_rows(s)), ""]
  return "\n".join(parts) + "\n"


def metrics(result) -> dict:
  """JSON metrics: per policy family, the findings and every family's study metrics."""
  out = {"seconds": result["seconds"], "model_dir": result.get("model_dir"), "policies": {}}
  for name, studies in result["policies"].items():
    per = miniwob_report.metrics({"families": studies, "seconds": result["seconds"]})
    out["policies"][name] = {"findings": findings(studies), "families": per["families"]}
  return out
