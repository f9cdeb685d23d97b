"""The harness-transfer study's reported quantities, as small functions of a study's results.

`harnax.studies.miniwob.run_family` measures; this module turns its matrices into the numbers
the paper reports (docs/harnesses.md), for any policy family:

* **swap selection**: for every ordered pair `(H, H')` of the `n` harnesses, from the frozen
  matrix (checkpoint `i` read through harness `j`),
  `ΔC = C_H' − C_H`, `T = ΔC + M_H(π_H)` and the frozen change `J_H'(π_H) − J_H(π_H)`;
  the paper adapts along the swaps the frozen comparison rejects (frozen change < 0) while
  `T > 0`, and counts wins split by the sign of `ΔC`;
* **geometric error**: the occupancy-weighted RMS centred score error against `π*`
  (`harnax.studies.families.score_error_rms`) of every checkpoint on every harness, its
  reduction by post-training, and whether each checkpoint is best on its own harness;
* **rankings** of the harnesses by `C − M`, by `C` alone and by `M` alone against a realized
  ranking (Spearman, Kendall tau-b, and whether the full order is right);
* **the three-way decomposition** (`harnax.harness.transfer_decomposition`) on padded batches
  of MiniWoB++ instances, summarized by its RMS norms.

Array conventions: `n` harnesses, `N` instances, `S` states, `A` actions (padded).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import evaluation
from harnax.estimate import rank
from harnax.harness import readout
from harnax.policies import lm
from harnax.studies import families

Array = jax.Array

PAPER = {
    "swaps_selected": 9,          # rejected by the frozen comparison with T > 0
    "wins_dc_up": (7, 7),         # (wins, swaps) among those raising C
    "wins_dc_down": (0, 2),       # among those lowering C
    "error_reduction": (0.69, 0.90),
    "reversal_success": (0.850, 0.192),
    "reversal_flips": 0.5,        # "about half" of the states
    "h1_mismatch_ratio": 10.0,    # "about ten times"
}
"""The paper's figures (the harness-transfer study's summary), shown beside ours."""


# -- swap selection -------------------------------------------------------------------------


def swap_quantities(ceiling, own_mismatch, frozen_value) -> tuple[Array, Array, Array]:
  """`(ΔC, T, frozen change)`, each `[n, n]`, entry `[i, j]` for the swap `H_i -> H_j`.

  Args:
    ceiling: `[n]`, `C` of each harness.
    own_mismatch: `[n]`, `M_{H_i}(π_i)` of each checkpoint on its own harness.
    frozen_value: `[n, n]`, `J_{H_j}(π_i)`: checkpoint `i` read through harness `j`.

  Returns:
    `ΔC[i, j] = C_j − C_i`, `T[i, j] = ΔC[i, j] + M_i(π_i)`, and
    `frozen[i, j] = J_j(π_i) − J_i(π_i)` (zero on the diagonal).
  """
  c, m, v = (jnp.asarray(x) for x in (ceiling, own_mismatch, frozen_value))
  dc = c[None, :] - c[:, None]
  return dc, dc + m[:, None], v - jnp.diagonal(v)[:, None]


def selected_swaps(threshold, frozen_change) -> Array:
  """bool `[n, n]`: the paper's rule, frozen change < 0 and `T > 0` (never the diagonal)."""
  t, f = jnp.asarray(threshold), jnp.asarray(frozen_change)
  return (f < 0) & (t > 0) & ~jnp.eye(t.shape[0], dtype=bool)


def select_swaps(ceiling, own_mismatch, frozen_value, names: Sequence[str], *,
                 max_swaps: int | None = None) -> tuple[tuple[str, str], ...]:
  """The ordered pairs `(H, H')` the paper adapts along (`selected_swaps`).

  Args:
    ceiling, own_mismatch, frozen_value: as in `swap_quantities`.
    names: the `n` harness names.
    max_swaps: keep at most this many, those with the largest `T` (a cap for cheap
      configs); None keeps all.

  Returns:
    `((source, target), ...)`, in row-major order of the pairs (source, then target).
  """
  n = len(names)
  v = np.asarray(frozen_value)
  if v.shape != (n, n):
    raise ValueError(f"frozen_value: expected shape [{n}, {n}] (one row and column per "
                     f"harness name), got {list(v.shape)}")
  if max_swaps is not None and (not isinstance(max_swaps, (int, np.integer)) or max_swaps < 0):
    raise ValueError(f"max_swaps: expected None or a non-negative int, got {max_swaps!r}")
  _, t, f = (np.asarray(x) for x in swap_quantities(ceiling, own_mismatch, v))
  sel = np.asarray(selected_swaps(t, f))
  pairs = [(i, j) for i in range(n) for j in range(n) if sel[i, j]]
  if max_swaps is not None and len(pairs) > max_swaps:
    keep = sorted(pairs, key=lambda p: -t[p])[:int(max_swaps)]
    pairs = [p for p in pairs if p in keep]
  return tuple((names[i], names[j]) for i, j in pairs)


def swap_wins(rows: Sequence[dict]) -> dict:
  """Wins after adaptation among the selected swaps, split by the sign of `ΔC`.

  Args:
    rows: one dict per swap with `delta_ceiling`, `selected` (bool), `realized_gain`
      (`J_H'(adapted) − J_H(π)`, NaN where not adapted) and `gain_vs_continued`
      (`J_H'(adapted) − J_H(continued)`, NaN where there is no control).

  Returns:
    `{"raises_C": {...}, "lowers_C": {...}}`, each with `selected`, `adapted`, `wins`
    (adapted beats the original pair), `with_control` and `wins_vs_control`.
  """
  out = {}
  for key, up in (("raises_C", True), ("lowers_C", False)):
    sel = [r for r in rows if r["selected"] and ((r["delta_ceiling"] > 0) == up)]
    ad = [r for r in sel if np.isfinite(r["realized_gain"])]
    ctl = [r for r in ad if np.isfinite(r.get("gain_vs_continued", np.nan))]
    out[key] = {"selected": len(sel), "adapted": len(ad),
                "wins": int(sum(r["realized_gain"] > 0 for r in ad)),
                "with_control": len(ctl),
                "wins_vs_control": int(sum(r["gain_vs_continued"] > 0 for r in ctl))}
  return out


# -- geometric error ------------------------------------------------------------------------


def semantic_log_policy(policy: families.PolicyFamily, params, batch) -> Array:
  """`log Pi(a | s)`, `[N, S, A]`, of any policy family read through a padded batch.

  From the family's candidate log-probs (one model pass): the invalid outputs and the rest
  of the model's mass execute `wait`, as in both families' `semantic_policy`. Log-space keeps
  the score error finite where a probability would underflow.
  """
  lp = policy.output_log_probs(params, batch)
  out = lm.semantic_log_policy_from_outputs(lp, batch.decode_table,
                                            num_actions=batch.pi_ref.shape[-1], invalid="noop",
                                            noop_action=families.WAIT)
  return out.astype(batch.pi_ref.dtype)


@jax.jit
def score_errors(mdp, log_policy, pi_ref, optimal, tau) -> Array:
  """`score_error_rms` of every instance of a padded batch, `[N]` (`optimal`: `pi*`)."""
  return jax.vmap(lambda m, lp, r, o: families.score_error_rms(m, lp, r, tau, optimal=o))(
      mdp, log_policy, pi_ref, optimal)


def error_summary(errors, base_errors) -> dict:
  """The paper's reading of the checkpoint × harness error matrix.

  Args:
    errors: `[n, n]`, error of checkpoint `i` read through harness `j`.
    base_errors: `[n]`, the base (pre-post-training) model's error on each harness.

  Returns:
    `reduction` `[n]` = `1 − errors[i, i] / base_errors[i]` (on each checkpoint's own
    harness); `own_lowest_in_row` bool `[n]`: checkpoint `i`'s error is lowest on harness
    `i` (the paper's claim); `own_lowest_in_column` bool `[n]`: on harness `j`, checkpoint
    `j` has the lowest error.
  """
  e, b = np.asarray(errors, float), np.asarray(base_errors, float)
  n = b.shape[0]
  if e.shape != (n, n):
    raise ValueError(f"errors: expected shape [{n}, {n}] like base_errors [{n}], got "
                     f"{list(e.shape)}")
  own = np.diagonal(e)
  return {"reduction": 1.0 - own / b,
          "own_lowest_in_row": np.array([np.all(e[i, i] <= np.delete(e[i], i))
                                         for i in range(n)]),
          "own_lowest_in_column": np.array([np.all(e[i, i] <= np.delete(e[:, i], i))
                                            for i in range(n)])}


# -- rankings -------------------------------------------------------------------------------


def discordant_pairs(predicted, realized, *, decimals: int = 9) -> int:
  """Pairs `(a, b)` ordered strictly one way by `predicted` and strictly the other by
  `realized`; 0 iff the prediction gets the full ranking right (ties in `realized` leave
  any order of their pair right). Values equal to `decimals` places are ties: two harnesses
  that give the same numbers up to rounding (H0 and H4 for a model whose reading ignores
  the instructions) are not ordered by float noise."""
  p, r = (np.round(np.asarray(x, float), decimals) for x in (predicted, realized))
  sp = np.sign(p[:, None] - p[None, :])
  sr = np.sign(r[:, None] - r[None, :])
  return int(np.sum(np.triu(sp * sr < 0, 1)))


def ranking_agreement(ceiling, mismatch, realized, *, decimals: int = 9) -> dict:
  """How `C − M`, `C` alone and `M` alone rank the harnesses against a realized ranking.

  Args:
    ceiling: `[n]`, `C` per harness; mismatch: `[n]`, `M` of the deployed policy on each.
    realized: `[n]`, the realized outcome (e.g. the success rate), higher is better.

  Returns:
    `{"C − M": ..., "C": ..., "M": ...}`, each `{"spearman", "kendall", "discordant",
    "exact"}`; `M` ranks by `−M` (less mismatch predicts more return). Values equal to
    `decimals` places are ties (`discordant_pairs`). A constant predictor gives NaN
    correlations (and is not exact unless `realized` is constant).
  """
  c, m, y = (np.asarray(x, float) for x in (ceiling, mismatch, realized))
  y = np.round(y, decimals)
  out = {}
  for name, pred in (("C − M", c - m), ("C", c), ("M", -m)):
    pred = np.round(pred, decimals)
    d = discordant_pairs(pred, y, decimals=decimals)
    const = np.ptp(pred) == 0 or np.ptp(y) == 0
    out[name] = {"spearman": np.nan if const else float(rank.spearman(pred, y)),
                 "kendall": np.nan if const else float(rank.kendall_tau_b(pred, y)),
                 "discordant": d,
                 "exact": bool(d == 0 and (np.ptp(pred) > 0 or np.ptp(y) == 0))}
  return out


# -- the three-way decomposition on MiniWoB++ -----------------------------------------------


def action_map(source_names: Sequence[str], target_names: Sequence[str],
               num_actions: int) -> np.ndarray:
  """int32 `[num_actions]`: target action `a'` -> the source action of the same name, -1 for
  actions only the target has and for padding (`harnax.harness.match_actions`)."""
  src, tgt = tuple(source_names), tuple(target_names)
  if len(tgt) > num_actions:
    raise ValueError(f"num_actions: expected at least {len(tgt)} (the target's actions), got "
                     f"{num_actions}")
  amap = readout.match_actions(src, tgt, only_in_source=[a for a in src if a not in tgt],
                               only_in_target=[a for a in tgt if a not in src])
  return np.concatenate([amap, np.full(num_actions - len(tgt), -1, np.int32)])


def batch_decomposition(source_scores, target_scores, source_log_policy, target_log_policy,
                        source_pi_ref, target_pi_ref, action_maps,
                        tau) -> readout.TransferDecomposition:
  """`transfer_decomposition` of every instance of a padded batch, stacked `[N, S, A']`.

  Padded states and actions take part as they are: a padded state has only `wait`, a single
  common action, so every part is exactly 0 there. States are matched by index; in the
  MiniWoB++ compilation (`harnax.envs.miniwob.CompiledHarness`) index `k` below the page
  count is the same unverified page in every harness, and the states without a counterpart
  (verified pages, the end state) meet a state with `wait` alone, so they contribute 0.

  Args:
    source_scores, target_scores: `F*_H`, `F*_H'`, `[N, S, A]` and `[N, S, A']`.
    source_log_policy, target_log_policy: `log Pi_H`, `log Pi_H'` of one checkpoint.
    source_pi_ref, target_pi_ref: `[N, S, A]`, `[N, S, A']`.
    action_maps: int `[N, A']` (`action_map` per instance).
    tau: temperature > 0.
  """
  arrays = [np.asarray(x) for x in (source_scores, target_scores, source_log_policy,
                                    target_log_policy, source_pi_ref, target_pi_ref)]
  maps = np.asarray(action_maps)
  n = arrays[0].shape[0]
  if any(a.shape[0] != n for a in arrays) or maps.shape[0] != n:
    raise ValueError(f"action_maps: expected {n} instances in every argument, got "
                     f"{[a.shape[0] for a in arrays] + [maps.shape[0]]}")
  parts = [readout.transfer_decomposition(
      source_scores=arrays[0][k], target_scores=arrays[1][k], source_log_policy=arrays[2][k],
      target_log_policy=arrays[3][k], source_pi_ref=arrays[4][k], target_pi_ref=arrays[5][k],
      action_map=maps[k], tau=tau) for k in range(n)]
  return readout.TransferDecomposition(*(jnp.stack(x) for x in zip(*parts)))


def decomposition_summary(decomposition: readout.TransferDecomposition, weights) -> dict:
  """Mean over instances of each part's RMS norm (`harnax.harness.decomposition_norms`).

  Args:
    decomposition: stacked `[N, S, A']` (`batch_decomposition`).
    weights: `[N, S]` state weights, e.g. the deployed policy's occupancy on H'.

  Returns:
    `{"error", "target_shift", "learning_residual", "readout_drift"}` (floats). The parts
    add state by state; their norms do not (the triangle inequality bounds the error's).
  """
  w = jnp.asarray(weights)
  norms = jax.vmap(lambda d, x: readout.decomposition_norms(d, weights=x))(decomposition, w)
  return {k: float(np.mean(np.asarray(v))) for k, v in norms._asdict().items()}


@jax.jit
def occupancies(mdp, policy) -> Array:
  """`d^Pi`, `[N, S]`, of a padded batch's instances."""
  return jax.vmap(evaluation.occupancy)(mdp, policy)
