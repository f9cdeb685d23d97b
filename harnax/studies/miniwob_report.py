"""Reporting of the MiniWoB++ study: the run over a config's families, tables, plot, metrics.

`harnax.studies.miniwob` computes one family; this module runs the families of a
`configs/miniwob_study.py` config and renders `report.md`, `metrics.json` and `study.png`
(`scripts/miniwob_study.py` writes them).
"""

from __future__ import annotations

import time

import numpy as np

from harnax import estimate as he
from harnax.envs import miniwob as mw
from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.studies import miniwob
from harnax.studies import results
from harnax.studies import transfer_metrics as tm


def run(cfg, *, log: results.Log | None = None) -> dict:
  """Runs the study once per reference policy of `cfg.pi_refs` (default: `("uniform",)`).

  Returns `{"families": {name: FamilyStudy}, "by_pi_ref": {pi_ref: {name: FamilyStudy}},
  "seconds": ...}`; `"families"` is the first reference's run (the full report's tables).
  The swaps: `swaps_of(cfg)`; `cfg.max_swaps` caps them. `log`, when given, receives a
  progress line per stage (a full run takes minutes).
  """
  unknown = [f for f in cfg.families if f not in mw.FAMILIES]
  if unknown:
    raise ValueError(f"families: expected names from {mw.FAMILIES}, got {unknown}")
  pi_refs = tuple(cfg.get("pi_refs", ("uniform",)))
  bad = [p for p in pi_refs if p not in miniwob.PI_REFS]
  if bad or not pi_refs:
    raise ValueError(f"pi_refs: expected a non-empty tuple from {miniwob.PI_REFS}, got "
                     f"{pi_refs}")
  swaps = swaps_of(cfg)
  controls = cfg.get("controls")
  by_ref, t0 = {}, time.time()
  for pi_ref in pi_refs:
    by_ref[pi_ref] = {}
    for family in cfg.families:
      train, test = mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)
      by_ref[pi_ref][family] = miniwob.run_family(
          family, train, test, tau=cfg.tau, discount=cfg.discount, steps=cfg.steps,
          adapt_steps=cfg.adapt_steps, learning_rate=cfg.learning_rate, swaps=swaps,
          max_swaps=cfg.get("max_swaps"), pi_ref=pi_ref,
          controls=tuple(controls) if controls is not None else None,
          log=None if log is None else (lambda m, r=pi_ref: log(f"[π_ref {r}] {m}")))
  return {"families": by_ref[pi_refs[0]], "by_pi_ref": by_ref, "seconds": time.time() - t0}


SWAP_RULES = ("select", "given")


def swaps_of(cfg):
  """`"select"` when `cfg.swap_rule == "select"` (the paper's rule), else the pairs of
  `cfg.swaps` (default: the nine of `harnax.envs.miniwob.SWAPS`).

  Two fields, because an ml_collections field keeps its type: the rule is a string, the
  pairs a tuple, and both can be overridden on the command line.
  """
  rule = cfg.get("swap_rule", "given")
  if rule not in SWAP_RULES:
    raise ValueError(f"swap_rule: expected one of {SWAP_RULES}, got {rule!r}")
  if rule == "select":
    return "select"
  return tuple(tuple(x) for x in cfg.get("swaps", harnesses_lib.SWAPS))


# -- the paper's quantities of one family's study ------------------------------------------


def selection(s: miniwob.FamilyStudy) -> dict:
  """All ordered pairs, the paper's selection and the wins split by the sign of ΔC."""
  rows = miniwob.swap_rows(s, miniwob.all_pairs(s))
  return {"pairs": rows, "num_pairs": len(rows),
          "num_selected": int(sum(r["selected"] for r in rows)),
          "wins": tm.swap_wins(rows)}


def h1_metrics(s: miniwob.FamilyStudy) -> dict | None:
  """H0 -> H1: ceiling change, frozen mismatch ratio, success change, adapted vs controls."""
  if "H0" not in s.harnesses or "H1" not in s.harnesses:
    return None
  i, j = s.harnesses.index("H0"), s.harnesses.index("H1")
  f = s.frozen
  out = {"delta_ceiling": float(f.ceiling[j, j] - f.ceiling[i, i]),
         "mismatch_ratio": float(f.mismatch[i, j] / max(f.mismatch[i, i], 1e-12)),
         "success_change": float(s.success["frozen"][i, j] - s.success["frozen"][i, i])}
  if (i, j) in s.adapted:
    out["adapted_minus_original"] = float(s.adapted[(i, j)].value - f.value[i, i])
    if i in s.continued:
      out["adapted_minus_continued"] = float(s.adapted[(i, j)].value - s.continued[i].value)
  return out


REALIZED = ("success", "plain return")


def rankings(s: miniwob.FamilyStudy) -> dict:
  """`C − M`, `C` and `M` against the realized ranking of the harnesses, for three
  deployments: the base model frozen (the paper's coding-agent setting), the H0 checkpoint
  frozen, and each harness's own checkpoint. Realized: the success within 20 steps, and the
  plain (KL-free) discounted return. `{deployment: {realized: ranking_agreement}}`."""
  f, sc, pr = s.frozen, s.success, s.plain_return
  deployments = {"base model": (s.base.mismatch, sc["base"], pr.get("base")),
                 "π_H0, frozen": (f.mismatch[0], sc["frozen"][0],
                                  pr["frozen"][0] if pr else None),
                 "own checkpoints": (np.diagonal(f.mismatch), np.diagonal(sc["frozen"]),
                                     np.diagonal(pr["frozen"]) if pr else None)}
  return {k: {name: tm.ranking_agreement(s.ceiling, m, y)
              for name, y in zip(REALIZED, ys) if y is not None}
          for k, (m, *ys) in deployments.items()}


def errors(s: miniwob.FamilyStudy) -> dict:
  """The error matrix and its reading (`transfer_metrics.error_summary`)."""
  out = tm.error_summary(s.errors, s.base_errors)
  return {"matrix": np.asarray(s.errors), "base": np.asarray(s.base_errors), **out}


def _f(x, digits=3):
  x = float(x)
  return "—" if np.isnan(x) else f"{x:+.{digits}f}"


def _pct(x):
  return f"{100 * x:.1f} %"


def harness_table(s: miniwob.FamilyStudy) -> str:
  """Per harness: C, the reference policy, the H0 model frozen, each own model."""
  f, ref = s.frozen, s.reference
  header = ["harness", "C", "J(π_ref)", "M(π_ref)", "J(H0 model)", "M(H0 model)", "J(own model)",
            "M(own model)", "J(own, fields reversed)", "top-output flips when reversed"]
  rows = [[h] + [_f(x) for x in (s.ceiling[i], ref.value[i], ref.mismatch[i], f.value[0, i],
                                 f.mismatch[0, i], f.value[i, i], f.mismatch[i, i],
                                 s.reversed_frozen.value[i])]
          + [f"{100 * s.decision_flips[i]:.0f} %"] for i, h in enumerate(s.harnesses)]
  return results.markdown_table(header, rows)


def success_table(s: miniwob.FamilyStudy) -> str:
  """Per harness: success within the episode cap, and pi*'s plain discounted return."""
  sc = s.success
  header = ["harness", "π* return (no KL)", "success π*", "success π_ref", "success H0 model",
            "success own model", "success own, fields reversed"]
  rows = [[h, _f(s.optimal_return[i])] + [_pct(x) for x in (
      sc["optimal"][i], sc["reference"][i], sc["frozen"][0, i], sc["frozen"][i, i],
      sc["reversed"][i])] for i, h in enumerate(s.harnesses)]
  return results.markdown_table(header, rows)


def swap_table(rows) -> str:
  """One row per swap H -> H': the threshold T beside the frozen and adapted outcomes."""
  header = ["swap", "ΔC", "M_H(π)", "T", "frozen ΔJ", "M_H'(frozen)", "M_H'(adapted)",
            "realized gain", "frozen rejects, T > 0", "adapted wins"]
  keys = ("delta_ceiling", "source_mismatch", "threshold", "frozen_change", "frozen_mismatch",
          "adapted_mismatch", "realized_gain")
  yes = lambda b: "yes" if b else "no"  # noqa: E731
  cells = [[r["swap"]] + [_f(r[k]) for k in keys]
           + [yes(r["frozen_change"] < 0 < r["threshold"]), yes(r["realized_gain"] > 0)]
           for r in rows]
  return results.markdown_table(header, cells)


def pairs_table(s: miniwob.FamilyStudy) -> str:
  """Every ordered pair as a matrix: `T` / frozen ΔJ, ● where the paper's rule selects it."""
  rows = {r["swap"]: r for r in selection(s)["pairs"]}
  cells = []
  for a in s.harnesses:
    line = [f"from {a}"]
    for b in s.harnesses:
      r = rows.get(f"{a} → {b}")
      line.append("·" if r is None else
                  f"{_f(r['threshold'])} / {_f(r['frozen_change'])}"
                  + (" ●" if r["selected"] else ""))
    cells.append(line)
  return results.markdown_table(["T / frozen ΔJ"] + [f"to {b}" for b in s.harnesses], cells)


def selected_table(s: miniwob.FamilyStudy) -> str:
  """The selected swaps, grouped by the sign of ΔC: adapted vs original and vs control."""
  header = ["ΔC", "swap", "T", "frozen ΔJ", "M_H'(adapted)", "gain vs original",
            "gain vs continued on H", "wins"]
  cells = []
  for r in sorted((r for r in selection(s)["pairs"] if r["selected"]),
                  key=lambda r: r["delta_ceiling"] <= 0):
    win = r["realized_gain"] > 0 and not r["gain_vs_continued"] <= 0
    cells.append(["raises C" if r["delta_ceiling"] > 0 else "lowers C", r["swap"],
                  _f(r["threshold"]), _f(r["frozen_change"]), _f(r["adapted_mismatch"]),
                  _f(r["realized_gain"]), _f(r["gain_vs_continued"]),
                  "—" if np.isnan(r["realized_gain"]) else ("yes" if win else "no")])
  return results.markdown_table(header, cells)


def error_table(s: miniwob.FamilyStudy) -> str:
  """The checkpoint × harness centred score error (rows: checkpoints, columns: harnesses)."""
  e = errors(s)
  cells = [[f"π_{a}"] + [f"{x:.4f}" + (" *" if k == int(np.argmin(e["matrix"][i])) else "")
                         for k, x in enumerate(e["matrix"][i])]
           for i, a in enumerate(s.harnesses)]
  cells.append(["base model"] + [f"{x:.4f}" for x in e["base"]])
  cells.append(["reduction on own harness"] + [_pct(x) for x in e["reduction"]])
  return results.markdown_table(["checkpoint \\ read through"] + list(s.harnesses), cells)


def decomposition_table(s: miniwob.FamilyStudy) -> str:
  """The three-way split (RMS norms) for each adapted swap and each field reversal."""
  header = ["checkpoint, deployed on", "error", "target shift", "learning residual",
            "readout drift", "occupancy covered"]
  keys = ("error", "target_shift", "learning_residual", "readout_drift", "coverage")
  cells = [[f"π_{s.harnesses[i]} on {s.harnesses[j]}"] + [f"{d[k]:.4f}" for k in keys]
           for (i, j), d in s.decompositions.items()]
  cells += [[f"π_{h} on {h}, fields reversed"] + [f"{d[k]:.4f}" for k in keys]
            for h, d in zip(s.harnesses, s.reversal_decompositions)]
  return results.markdown_table(header, cells)


def ranking_table(s: miniwob.FamilyStudy) -> str:
  """Spearman / Kendall tau-b of each predictor against the realized success ranking."""
  cells = []
  for dep, per in rankings(s).items():
    for realized, agree in per.items():
      for pred, a in agree.items():
        cells.append([dep, realized, f"by {pred}", _f(a["spearman"], 2), _f(a["kendall"], 2),
                      str(a["discordant"]), "yes" if a["exact"] else "no"])
  return results.markdown_table(["deployed", "realized", "ranking", "Spearman", "Kendall τ-b",
                                 "discordant pairs", "full ranking right"], cells)


def family_findings(s: miniwob.FamilyStudy) -> list[str]:
  """Bullets: the paper's figure beside this family's, for the per-checkpoint metrics."""
  sel, e, out = selection(s), errors(s), []
  w = sel["wins"]
  out.append(f"Selection rule: the frozen comparison rejects {sel['num_selected']} of "
             f"{sel['num_pairs']} ordered swaps with T > 0 (paper: "
             f"{tm.PAPER['swaps_selected']}). Adapted: raising C wins "
             f"{w['raises_C']['wins']} / {w['raises_C']['adapted']} (paper 7 / 7), lowering C "
             f"wins {w['lowers_C']['wins']} / {w['lowers_C']['adapted']} (paper 0 / 2); "
             f"against the continued control "
             f"{w['raises_C']['wins_vs_control']} / {w['raises_C']['with_control']} and "
             f"{w['lowers_C']['wins_vs_control']} / {w['lowers_C']['with_control']}"
             + (f"; at most {s.max_swaps} adapted (largest T)" if s.max_swaps is not None
                else "") + ".")
  lo, hi = tm.PAPER["error_reduction"]
  out.append(f"Post-training reduces the centred score error on the own harness by "
             f"{_pct(np.min(e['reduction']))} to {_pct(np.max(e['reduction']))} (paper: "
             f"{_pct(lo)} to {_pct(hi)}); each checkpoint lowest on its own harness: "
             f"{int(np.sum(e['own_lowest_in_row']))} / {len(s.harnesses)} (paper: all); "
             f"each harness's own checkpoint lowest there: "
             f"{int(np.sum(e['own_lowest_in_column']))} / {len(s.harnesses)}.")
  own = float(np.mean(np.diagonal(s.success["frozen"])))
  shift = max(d["target_shift"] for d in s.reversal_decompositions)
  out.append(f"Field reversal: success {_pct(own)} → {_pct(np.mean(s.success['reversed']))} "
             f"(paper 85.0 % → 19.2 %); most likely output changes in "
             f"{_pct(np.mean(s.decision_flips))} of the states (paper: about half); largest "
             f"target shift of the reversal {shift:.1e} (0 when the reference policy does not "
             "move).")
  h1 = h1_metrics(s)
  if h1 is not None:
    out.append(f"H1 vs H0: ΔC {h1['delta_ceiling']:+.4f} (paper: slightly up); frozen "
               f"mismatch ratio {h1['mismatch_ratio']:.1f}× (paper ~10×); success change "
               f"{100 * h1['success_change']:+.1f} points (paper: down)"
               + (f"; H0 → H1 adapted minus original {h1['adapted_minus_original']:+.3f}"
                  if "adapted_minus_original" in h1 else "")
               + (f", minus H0-continued {h1['adapted_minus_continued']:+.3f} (paper: beats "
                  "both)" if "adapted_minus_continued" in h1 else "") + ".")
  exact = [f"{dep} vs {realized}: "
           + (", ".join(p for p, a in agree.items() if a["exact"]) or "none")
           for dep, per in rankings(s).items() for realized, agree in per.items()]
  out.append("Full ranking right (paper: only C − M): " + "; ".join(exact) + ".")
  return out


def pi_ref_table(result) -> str:
  """Per reference policy and family: the H1 ceiling change and the frozen H1 quantities."""
  cells = []
  for ref, studies in result.get("by_pi_ref", {}).items():
    for family, s in studies.items():
      h1 = h1_metrics(s)
      if h1 is None:
        continue
      cells.append([ref, family, f"{h1['delta_ceiling']:+.4f}",
                    "up" if h1["delta_ceiling"] > 0 else "down",
                    f"{h1['mismatch_ratio']:.1f}×", f"{100 * h1['success_change']:+.1f}"])
  return results.markdown_table(["π_ref", "family", "ΔC (H0 → H1)", "sign (paper: up)",
                                 "M_H1(π_H0) / M_H0(π_H0)", "success change (points)"], cells)


def summary(result) -> dict:
  """Across all families: selection and wins, and how well T and the frozen change predict
  the gain of the adapted swaps."""
  rows = [r for s in result["families"].values() for r in miniwob.swap_rows(s)]
  t = np.array([r["threshold"] for r in rows])
  frozen = np.array([r["frozen_change"] for r in rows])
  gain = np.array([r["realized_gain"] for r in rows])
  rejected = (frozen < 0) & (t > 0)
  out = {"num_swaps": len(rows), "frozen_rejects_T_positive": int(rejected.sum()),
         "of_those_adapted_wins": int((rejected & (gain > 0)).sum())}
  sels = [selection(s) for s in result["families"].values()]
  out["num_pairs"] = sum(x["num_pairs"] for x in sels)
  out["num_selected"] = sum(x["num_selected"] for x in sels)
  out["wins"] = {k: {f: sum(x["wins"][k][f] for x in sels) for f in sels[0]["wins"][k]}
                 for k in ("raises_C", "lowers_C")} if sels else {}
  if len(rows) > 2 and np.isfinite(gain).all() and np.ptp(gain) > 0:
    out["spearman_T_gain"] = float(he.spearman(t, gain))
    out["spearman_frozen_gain"] = float(he.spearman(frozen, gain))
  return out


def render(cfg, result) -> str:
  """The markdown report of a run."""
  pi_refs = tuple(result.get("by_pi_ref", {}) or ("uniform",))
  swaps = swaps_of(cfg)
  swaps = ("the paper's rule (frozen comparison rejects, T > 0)" if swaps == "select"
           else ", ".join(f"{a} → {b}" for a, b in swaps))
  parts = ["# MiniWoB++ tabular study: H0–H5",
           "",
           f"Families {', '.join(cfg.families)}; {cfg.num_train} training and {cfg.num_test} "
           f"held-out task instances each (split seed {cfg.split_seed}); γ = {cfg.discount}, "
           f"τ = {cfg.tau}; {cfg.steps} exact policy-gradient steps per model, "
           f"{cfg.adapt_steps} to adapt. Swaps adapted: {swaps}"
           + (f" (at most {cfg.max_swaps})" if cfg.get("max_swaps") is not None else "")
           + f". Reference policies: {', '.join(pi_refs)}; the tables are π_ref = "
           f"{pi_refs[0]}. Means over held-out instances. Run time "
           f"{result['seconds']:.0f} s.",
           "",
           "Harnesses (docs/harnesses.md): H0 one click per step; H1 + batch clicks; "
           "H2 + automatic checking; H3 + verification tool; H4 + additional instructions; "
           "H5 all four. 'H0 model' is the model trained on H0 read through each harness "
           "(frozen); 'own model' is the one trained on that harness. J = C − M holds "
           "exactly in every cell (checked in the tests).", ""]
  for family, s in result["families"].items():
    parts += [f"## {family}", "", "### The paper's figures beside ours", ""]
    parts += [f"- {x}" for x in family_findings(s)] + [""]
    parts += [harness_table(s), "",
              "Success (raw reward 1) within 20 steps, exact:", "", success_table(s), "",
              f"Field reversal keeps every optimal decision: "
              f"**{'yes' if s.optimal_decisions_unchanged else 'NO'}** (all held-out "
              "instances, all harnesses).", "",
              "### Swaps", "",
              "Every ordered pair (the model trained on the row's harness, read through the "
              "column's): T = ΔC + M_H(π) / the frozen return change; ● marks the swaps the "
              "frozen comparison rejects while T > 0 (the paper's selection):", "",
              pairs_table(s), "",
              "The selected swaps, adapted (wins: the adapted model beats the original pair "
              "and, where the control ran, the source model trained as long on its own "
              "harness):", "", selected_table(s), "",
              "The nine single-addition swaps (each addition alone, and into H5), for "
              "reference (— where that swap was not adapted):", "",
              swap_table(miniwob.swap_rows(s, [(a, b) for a, b in harnesses_lib.SWAPS
                                                if a in s.harnesses and b in s.harnesses])),
              "",
              "### Geometric error: checkpoint × harness", "",
              "Occupancy-weighted RMS centred score error against π* (docs/estimation.md §5) "
              "of each checkpoint read through each harness; * marks each row's lowest:", "",
              error_table(s), "",
              "### Three-way decomposition", "",
              "Centred score error on the deployed harness = target shift + learning residual "
              "+ readout drift (docs/harness.md), on the actions both harnesses have and the "
              "states matched by page; RMS norms weighted by the checkpoint's occupancy on "
              "the deployed harness (the parts add state by state, their norms do not); "
              "'occupancy covered': the mass on states with two or more common actions.", "",
              decomposition_table(s), "",
              "### Rankings of the harnesses", "",
              "Predicted by C − M (exact, = J), by C alone, by M alone (less is better), "
              "against the realized ranking: the success within 20 steps, and the plain "
              "(KL-free) discounted return:", "",
              ranking_table(s), ""]
  summ = summary(result)
  parts += ["## Across families", "",
            f"- The frozen comparison rejects {summ['num_selected']} of {summ['num_pairs']} "
            f"ordered swaps with T > 0 (paper: nine). Adapted, raising C: "
            f"{summ['wins']['raises_C']['wins']} / {summ['wins']['raises_C']['adapted']} win "
            f"(paper 7 / 7); lowering C: {summ['wins']['lowers_C']['wins']} / "
            f"{summ['wins']['lowers_C']['adapted']} (paper 0 / 2).",
            f"- Adapted swaps: {summ['num_swaps']}; {summ['of_those_adapted_wins']} of the "
            f"{summ['frozen_rejects_T_positive']} rejected with T > 0 win."]
  if "spearman_T_gain" in summ:
    parts += [f"- Spearman rank correlation with the realized gain: T = ΔC + M_H(π) "
              f"{summ['spearman_T_gain']:+.2f}; the frozen return change "
              f"{summ['spearman_frozen_gain']:+.2f} (paper: 0.95 and 0.17)."]
  if len(pi_refs) > 1 or "by_pi_ref" in result:
    parts += ["", "## The reference policy π_ref and the sign of the H1 ceiling change", "",
              "'uniform': uniform over each state's available actions. 'base': the initial "
              "model's own semantic policy under each harness; for the log-linear family "
              "that model has zero weights, so it is uniform over the candidate outputs "
              "(not over the actions): the outputs a harness decodes as invalid, and the "
              "batch commands under a harness without them, all execute wait.", "",
              pi_ref_table(result), ""]
    parts += [f"- {x}" for x in pi_ref_verdict(result)]
  return "\n".join(parts) + "\n"


def pi_ref_verdict(result, family: str = "click-checkboxes") -> list[str]:
  """Which reference policy gives the paper's sign of the H1 ceiling change on `family`."""
  out = []
  for ref, studies in result.get("by_pi_ref", {}).items():
    s = studies.get(family)
    h1 = h1_metrics(s) if s is not None else None
    if h1 is not None:
      ok = h1["delta_ceiling"] > 0
      out.append(f"π_ref = {ref} on {family}: ΔC = {h1['delta_ceiling']:+.4f}, "
                 + ("the paper's sign (H1 raises C)." if ok else
                    "not the paper's sign (the paper: H1 raises C slightly)."))
  return out


def plot(result, path: str) -> None:
  """Per family: C, J of the H0 model (frozen) and of each own model; T vs gain; and below,
  the checkpoint × harness score-error matrix of each family."""
  # matplotlib is an optional extra (`plots`): imported only when a figure is asked for.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fams = list(result["families"].items())
  fig, grid = plt.subplots(2, len(fams) + 1, figsize=(4.2 * (len(fams) + 1), 7.4),
                           squeeze=False)
  axes = grid[0]
  for ax, (family, s) in zip(axes, fams):
    x = np.arange(len(s.harnesses))
    ax.bar(x - 0.27, s.ceiling, 0.27, label="C (ceiling)")
    ax.bar(x, s.frozen.value[0], 0.27, label="J, H0 model (frozen)")
    ax.bar(x + 0.27, np.diag(s.frozen.value), 0.27, label="J, own model")
    ax.set_xticks(x, s.harnesses)
    ax.set_title(family)
    ax.axhline(0, color="k", lw=0.5)
  axes[0].legend(fontsize=7, loc="lower left")
  ax = axes[-1]
  for family, s in fams:
    rows = miniwob.swap_rows(s)
    ax.scatter([r["threshold"] for r in rows], [r["realized_gain"] for r in rows], label=family,
               s=18)
  lim = ax.get_xlim()
  ax.plot(lim, lim, "k--", lw=0.5)
  ax.axhline(0, color="k", lw=0.5)
  ax.set_xlabel("T = ΔC + M_H(π)")
  ax.set_ylabel("realized gain after adapting")
  ax.set_title("adapted swaps, every family")
  ax.legend(fontsize=7)
  for ax, (family, s) in zip(grid[1], fams):
    e = np.asarray(s.errors)
    im = ax.imshow(e, cmap="viridis")
    n = len(s.harnesses)
    ax.set_xticks(range(n), s.harnesses)
    ax.set_yticks(range(n), [f"π_{h}" for h in s.harnesses])
    for i in range(n):
      ax.text(int(np.argmin(e[i])), i, "*", ha="center", va="center", color="w")
    ax.set_xlabel("read through harness")
    ax.set_title(f"{family}: score error (* row min)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
  ax = grid[1][-1]
  width = 0.8 / max(len(fams), 1)
  for k, (family, s) in enumerate(fams):
    red = errors(s)["reduction"]
    ax.bar(np.arange(len(s.harnesses)) + k * width, 100 * red, width, label=family)
  ax.axhspan(100 * tm.PAPER["error_reduction"][0], 100 * tm.PAPER["error_reduction"][1],
             color="0.85", zorder=0, label="paper: 69–90 %")
  ax.set_xticks(np.arange(len(fams[0][1].harnesses)) + 0.4 - width / 2, fams[0][1].harnesses)
  ax.set_ylabel("error reduction on own harness (%)")
  ax.set_title("post-training vs base model")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.ndarray, np.generic)):
    return np.asarray(x).tolist()
  return x


def family_metrics(s: miniwob.FamilyStudy) -> dict:
  """The per-checkpoint metrics of one family (JSON-ready): selection and wins, the error
  matrix, the decompositions, the rankings and the H1 quantities."""
  name = lambda k: "→".join(s.harnesses[i] for i in k)  # noqa: E731
  sel = selection(s)
  return _jsonable({
      "selection": {"rule": s.selection, "max_swaps": s.max_swaps,
                    "num_pairs": sel["num_pairs"], "num_selected": sel["num_selected"],
                    "wins": sel["wins"], "pairs": sel["pairs"],
                    "paper": {"num_selected": tm.PAPER["swaps_selected"],
                              "wins_raises_C": tm.PAPER["wins_dc_up"],
                              "wins_lowers_C": tm.PAPER["wins_dc_down"]}},
      "errors": {**errors(s), "adapted": {name(k): v for k, v in s.adapted_errors.items()},
                 "paper_reduction": tm.PAPER["error_reduction"]},
      "decompositions": {name(k): v for k, v in s.decompositions.items()},
      "reversal_decompositions": dict(zip(s.harnesses, s.reversal_decompositions)),
      "rankings": rankings(s),
      "h1": h1_metrics(s)})


def metrics(result) -> dict:
  """The JSON metrics of a run."""
  out = {"seconds": result["seconds"], "summary": _jsonable(summary(result)), "families": {}}
  for family, s in result["families"].items():
    out["families"][family] = {
        "harnesses": list(s.harnesses), "ceiling": s.ceiling.tolist(),
        "reference": {k: np.asarray(v).tolist() for k, v in s.reference._asdict().items()},
        "frozen": {k: np.asarray(v).tolist() for k, v in s.frozen._asdict().items()},
        "reversed_own": {k: np.asarray(v).tolist()
                         for k, v in s.reversed_frozen._asdict().items()},
        "decision_flips": s.decision_flips.tolist(),
        "success": {k: ({"→".join(s.harnesses[i] for i in np.atleast_1d(kk)): float(vv)
                         for kk, vv in v.items()} if isinstance(v, dict)
                        else np.asarray(v).tolist()) for k, v in s.success.items()},
        "base": {k: np.asarray(v).tolist() for k, v in s.base._asdict().items()},
        "continued": {s.harnesses[i]: {k: float(x) for k, x in sc._asdict().items()}
                      for i, sc in s.continued.items()},
        "policy": s.policy, "pi_ref": s.pi_ref,
        "optimal_return": s.optimal_return.tolist(),
        "optimal_decisions_unchanged": s.optimal_decisions_unchanged,
        "swaps": [{k: (v if k in ("swap", "selected") else float(v)) for k, v in r.items()}
                  for r in miniwob.swap_rows(s)],
        **(family_metrics(s) if s.errors is not None else {})}
  if len(result.get("by_pi_ref", {})) > 1:
    out["pi_refs"] = {ref: {f: {"h1": h1_metrics(s), "ceiling": s.ceiling.tolist()}
                            for f, s in studies.items()}
                      for ref, studies in result["by_pi_ref"].items()}
    out["pi_ref_verdict"] = pi_ref_verdict(result)
  return out
