"""Harness swaps: ceiling change, threshold T, frozen and adapted returns.

With `J = C - M` on every harness (docs/theory.md), for a policy `pi` on H
and any policy `pi'` on H':

  J_H'(pi') - J_H(pi) = (C_H' - C_H) + M_H(pi) - M_H'(pi') = T - M_H'(pi'),
  T = dC + M_H(pi).

So a policy adapted to H' beats the original pair iff its mismatch falls below
T. The *frozen* comparison deploys the same weights on H' without adapting
(`pi'` = the model read through H'); the harness-transfer study's point is that
it can reject a swap (`frozen_change < 0`) whose threshold is positive, i.e. one
that adapting can still turn into a gain.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import evaluation
from harnax.core import objectives
from harnax.core import solvers
from harnax.harness import interface

Array = jax.Array


def swap_threshold(source_ceiling, target_ceiling, source_mismatch) -> Array:
  """`T = (C_H' - C_H) + M_H(pi)`: the mismatch an adapted policy must beat."""
  return target_ceiling - source_ceiling + source_mismatch


class SwapPair(NamedTuple):
  """One ordered swap H -> H' (all scalars; NaN where no adapted policy is given).

  Attributes:
    source_ceiling: `C_H`. target_ceiling: `C_H'`.
    delta_ceiling: `C_H' - C_H`.
    source_return: `J_H(pi)` (exact evaluation).
    source_mismatch: `M_H(pi)`.
    threshold: `T = delta_ceiling + source_mismatch`.
    frozen_return: `J_H'(pi_frozen)`, the same weights read through H'.
    frozen_mismatch: `M_H'(pi_frozen)`.
    frozen_change: `J_H'(pi_frozen) - J_H(pi)`.
    adapted_return: `J_H'(pi_adapted)`.
    adapted_mismatch: `M_H'(pi_adapted)`.
    realized_gain: `J_H'(pi_adapted) - J_H(pi)` (`= T - adapted_mismatch`).
  """

  source_ceiling: Array
  target_ceiling: Array
  delta_ceiling: Array
  source_return: Array
  source_mismatch: Array
  threshold: Array
  frozen_return: Array
  frozen_mismatch: Array
  frozen_change: Array
  adapted_return: Array
  adapted_mismatch: Array
  realized_gain: Array


def _return_and_mismatch(harness, policy, tau, solution):
  j = evaluation.evaluate_policy(harness.mdp, policy, harness.pi_ref, tau).value
  m = objectives.mismatch(harness.mdp, policy, harness.pi_ref, tau, solution=solution)
  return j, m


def swap_pair(source: interface.TabularHarness, target: interface.TabularHarness, policy,
              frozen_policy, adapted_policy, tau, *,
              source_solution: solvers.SoftBellmanSolution | None = None,
              target_solution: solvers.SoftBellmanSolution | None = None,
              **solver_options) -> SwapPair:
  """Ceilings, mismatches and returns of one ordered swap H -> H'.

  Returns are computed by exact evaluation, independently of `C` and `M`, so
  `realized_gain == threshold - adapted_mismatch` is a check, not a definition.

  Args:
    source: H. target: H'.
    policy: `pi`, the model's semantic policy on H, `[S, A]`.
    frozen_policy: the same model read through H', `[S, A']`.
    adapted_policy: a policy adapted to H', `[S, A']`, or `None` (no adaptation).
    tau: temperature > 0.
    source_solution, target_solution: precomputed optima to reuse.
    **solver_options: forwarded to `hx.solve_soft_bellman`.

  Returns:
    `SwapPair` of scalars.
  """
  if source_solution is None:
    source_solution = solvers.solve_soft_bellman(source.mdp, source.pi_ref, tau, **solver_options)
  if target_solution is None:
    target_solution = solvers.solve_soft_bellman(target.mdp, target.pi_ref, tau, **solver_options)
  c_src = objectives.ceiling(source.mdp, source.pi_ref, tau, solution=source_solution)
  c_tgt = objectives.ceiling(target.mdp, target.pi_ref, tau, solution=target_solution)
  j_src, m_src = _return_and_mismatch(source, policy, tau, source_solution)
  j_frz, m_frz = _return_and_mismatch(target, frozen_policy, tau, target_solution)
  if adapted_policy is None:
    j_ad = m_ad = jnp.full_like(c_tgt, jnp.nan)
  else:
    j_ad, m_ad = _return_and_mismatch(target, adapted_policy, tau, target_solution)
  return SwapPair(source_ceiling=c_src, target_ceiling=c_tgt, delta_ceiling=c_tgt - c_src,
                  source_return=j_src, source_mismatch=m_src,
                  threshold=swap_threshold(c_src, c_tgt, m_src), frozen_return=j_frz,
                  frozen_mismatch=m_frz, frozen_change=j_frz - j_src, adapted_return=j_ad,
                  adapted_mismatch=m_ad, realized_gain=j_ad - j_src)


class SwapAnalysis(NamedTuple):
  """Every ordered swap among n harnesses: `SwapPair` fields as `[n, n]` arrays.

  Entry `[i, j]` is the swap `H_i -> H_j` of the model trained on `H_i`; the
  diagonal is the trivial swap (`delta_ceiling = 0`, `frozen_change = 0`).

  Attributes:
    pairs: a `SwapPair` whose leaves are `[n, n]`.
    rejected_but_positive: bool `[n, n]`, `frozen_change < 0` and `threshold > 0`
      (the frozen comparison rejects a swap that adaptation can win).
    adapted_wins: bool `[n, n]`, `realized_gain > 0` (False where not given).
    predicted_win: bool `[n, n]`, `adapted_mismatch < threshold`; equals
      `adapted_wins` wherever an adapted policy is given.
  """

  pairs: SwapPair
  rejected_but_positive: Array
  adapted_wins: Array
  predicted_win: Array


def swap_analysis(harnesses: Sequence[interface.TabularHarness], policies: Sequence,
                  frozen: Sequence[Sequence], adapted: Sequence[Sequence] | None, tau,
                  **solver_options) -> SwapAnalysis:
  """All ordered swaps among `harnesses` (each optimum is solved once).

  Args:
    harnesses: `[H_0, ..., H_{n-1}]` (action counts may differ).
    policies: `policies[i]` is the model trained on `H_i`, read through `H_i`.
    frozen: `frozen[i][j]` is that model read through `H_j` (the diagonal may be
      `None`, meaning `policies[i]`).
    adapted: `adapted[i][j]` is it adapted to `H_j`, or `None` (entries or the
      whole argument) for swaps without adaptation.
    tau: temperature > 0.
    **solver_options: forwarded to `hx.solve_soft_bellman`.

  Returns:
    `SwapAnalysis`.
  """
  n = len(harnesses)
  for field, x in (("policies", policies), ("frozen", frozen)):
    if len(x) != n:
      raise ValueError(f"{field}: expected {n} entries (one per harness), got {len(x)}")
  for i, row in enumerate(frozen):
    if len(row) != n:
      raise ValueError(f"frozen[{i}]: expected {n} entries, got {len(row)}")
  if adapted is not None:
    if len(adapted) != n or any(len(row) != n for row in adapted):
      raise ValueError(f"adapted: expected a {n} x {n} nested sequence (None entries allowed)")
  solutions = [solvers.solve_soft_bellman(h.mdp, h.pi_ref, tau, **solver_options)
               for h in harnesses]
  rows = []
  for i in range(n):
    row = []
    for j in range(n):
      frz = frozen[i][j] if frozen[i][j] is not None or i != j else policies[i]
      if frz is None:
        raise ValueError(f"frozen[{i}][{j}]: expected the policy of model {i} read through "
                         f"harness {j}, got None")
      ad = adapted[i][j] if adapted is not None else None
      row.append(swap_pair(harnesses[i], harnesses[j], policies[i], frz, ad, tau,
                           source_solution=solutions[i], target_solution=solutions[j]))
    rows.append(row)
  pairs = jax.tree.map(lambda *xs: jnp.stack(xs).reshape(n, n), *[p for r in rows for p in r])
  return SwapAnalysis(
      pairs=pairs,
      rejected_but_positive=(pairs.frozen_change < 0) & (pairs.threshold > 0),
      adapted_wins=pairs.realized_gain > 0,
      predicted_win=pairs.adapted_mismatch < pairs.threshold)


def _fmt(x, digits):
  x = float(x)
  return "—" if np.isnan(x) else f"{x:+.{digits}f}"


def swap_table(analysis: SwapAnalysis, names: Sequence[str], *, digits: int = 3) -> str:
  """A markdown table of the off-diagonal swaps of a `SwapAnalysis`."""
  p = analysis.pairs
  n = p.delta_ceiling.shape[0]
  if len(names) != n:
    raise ValueError(f"names: expected {n} names, got {len(names)}")
  head = ("| swap | ΔC | M_H(π) | T | frozen ΔJ | M_H'(π_adapted) | realized gain "
          "| frozen rejects, T > 0 | adapted wins |")
  lines = [head, "|" + "---|" * 9]
  for i in range(n):
    for j in range(n):
      if i == j:
        continue
      has_adapted = not np.isnan(float(p.adapted_mismatch[i, j]))
      lines.append(
          f"| {names[i]} → {names[j]} | {_fmt(p.delta_ceiling[i, j], digits)} | "
          f"{_fmt(p.source_mismatch[i, j], digits)} | {_fmt(p.threshold[i, j], digits)} | "
          f"{_fmt(p.frozen_change[i, j], digits)} | {_fmt(p.adapted_mismatch[i, j], digits)} | "
          f"{_fmt(p.realized_gain[i, j], digits)} | "
          f"{'yes' if bool(analysis.rejected_but_positive[i, j]) else 'no'} | "
          f"{('yes' if bool(analysis.adapted_wins[i, j]) else 'no') if has_adapted else '—'} |")
  return "\n".join(lines)
