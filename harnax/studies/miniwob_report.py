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
from harnax.studies import miniwob
from harnax.studies import results


def run(cfg, *, log: results.Log | None = None) -> dict:
  """Runs the study; returns `{"families": {name: FamilyStudy}, "seconds": ...}`.

  `log`, when given, receives a progress line per stage (a full run takes minutes).
  """
  unknown = [f for f in cfg.families if f not in mw.FAMILIES]
  if unknown:
    raise ValueError(f"families: expected names from {mw.FAMILIES}, got {unknown}")
  out, t0 = {}, time.time()
  for family in cfg.families:
    train, test = mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)
    out[family] = miniwob.run_family(family, train, test, tau=cfg.tau, discount=cfg.discount,
                                steps=cfg.steps, adapt_steps=cfg.adapt_steps,
                                learning_rate=cfg.learning_rate, log=log)
  return {"families": out, "seconds": time.time() - t0}


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


def summary(result) -> dict:
  """Across all swaps of all families: how well T and the frozen change predict the gain."""
  rows = [r for s in result["families"].values() for r in miniwob.swap_rows(s)]
  t = np.array([r["threshold"] for r in rows])
  frozen = np.array([r["frozen_change"] for r in rows])
  gain = np.array([r["realized_gain"] for r in rows])
  rejected = (frozen < 0) & (t > 0)
  out = {"num_swaps": len(rows), "frozen_rejects_T_positive": int(rejected.sum()),
         "of_those_adapted_wins": int((rejected & (gain > 0)).sum())}
  if len(rows) > 2:
    out["spearman_T_gain"] = float(he.spearman(t, gain))
    out["spearman_frozen_gain"] = float(he.spearman(frozen, gain))
  return out


def render(cfg, result) -> str:
  """The markdown report of a run."""
  parts = ["# MiniWoB++ tabular study: H0–H5",
           "",
           f"Families {', '.join(cfg.families)}; {cfg.num_train} training and {cfg.num_test} "
           f"held-out task instances each (split seed {cfg.split_seed}); γ = {cfg.discount}, "
           f"τ = {cfg.tau}; {cfg.steps} exact policy-gradient steps per model, "
           f"{cfg.adapt_steps} to adapt. Means over held-out instances. Run time "
           f"{result['seconds']:.0f} s.",
           "",
           "Harnesses (docs/harnesses.md): H0 one click per step; H1 + batch clicks; "
           "H2 + automatic checking; H3 + verification tool; H4 + additional instructions; "
           "H5 all four. 'H0 model' is the model trained on H0 read through each harness "
           "(frozen); 'own model' is the one trained on that harness. J = C − M holds "
           "exactly in every cell (checked in the tests).", ""]
  for family, s in result["families"].items():
    parts += [f"## {family}", "", harness_table(s), "",
              "Success (raw reward 1) within 20 steps, exact:", "", success_table(s), "",
              f"Field reversal keeps every optimal decision: "
              f"**{'yes' if s.optimal_decisions_unchanged else 'NO'}** (all held-out "
              "instances, all harnesses).", "",
              "Swaps (the model trained on H, moved to H'):", "", swap_table(miniwob.swap_rows(s)),
              ""]
  summ = summary(result)
  parts += ["## Across families", "",
            f"- {summ['num_swaps']} swaps; the frozen comparison rejects "
            f"{summ['frozen_rejects_T_positive']} with T > 0, and adaptation wins "
            f"{summ['of_those_adapted_wins']} of those."]
  if "spearman_T_gain" in summ:
    parts += [f"- Spearman rank correlation with the realized gain: T = ΔC + M_H(π) "
              f"{summ['spearman_T_gain']:+.2f}; the frozen return change "
              f"{summ['spearman_frozen_gain']:+.2f}."]
  return "\n".join(parts) + "\n"


def plot(result, path: str) -> None:
  """Per family: C, J of the H0 model (frozen) and of each own model; T vs gain."""
  # matplotlib is an optional extra (`plots`): imported only when a figure is asked for.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fams = list(result["families"].items())
  fig, axes = plt.subplots(1, len(fams) + 1, figsize=(4.2 * (len(fams) + 1), 3.6))
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
  ax.set_title("swaps, every family")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def metrics(result) -> dict:
  """The JSON metrics of a run."""
  out = {"seconds": result["seconds"], "summary": summary(result), "families": {}}
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
        "swaps": [{k: (float(v) if k != "swap" else v) for k, v in r.items()}
                  for r in miniwob.swap_rows(s)]}
  return out
