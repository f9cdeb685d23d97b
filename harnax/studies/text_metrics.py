"""The HAD paper's evaluation metrics, computed from per-turn episode traces.

Every metric is a share of episodes or of events, defined in docs/text_eval.md; this module is
their one implementation. An episode trace holds, per turn, what the harness saw (it runs in
shadow when a component is hidden from the agent, so the same quantities exist in every
evaluation setting):

* ``accepted[t]``: the action monitor would accept the action (it is admissible);
* ``consistent[t]``: the action does not contradict the harness record;
* ``stalled[t]``: the loop detector reports an unproductive loop after turn ``t``;

and per episode ``won`` (the task was solved within the turn limit).

Definitions (T turns in an episode, E episodes):

* success = (1/E) Σ_e won_e.
* harness utilization = Σ_{e,t} accepted·consistent / Σ_e T_e: the share of the agent's actions
  that agree with what the harness knows (admissible and not contradicting the record).
* stall prevention = the share of episodes with no stalled turn.
* stall escape (within k turns) = escapes / entries, where an *entry* is a turn t with
  stalled[t] and not stalled[t-1] (or t = 0), and it *escapes* when some turn in t+1..t+k is not
  stalled. An entry in the last k turns of an episode that ends while stalled does not escape;
  one that ends by a win escapes (winning leaves every loop).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class EpisodeTrace:
  """Per-turn harness observations of one episode.

  Attributes:
    won: the task was solved.
    accepted: [T] bool, the action monitor accepts the turn's action.
    consistent: [T] bool, the action does not contradict the harness record.
    stalled: [T] bool, the loop detector reports a loop after the turn.
  """

  won: bool
  accepted: np.ndarray
  consistent: np.ndarray
  stalled: np.ndarray

  def __post_init__(self):
    lengths = set()
    for name in ("accepted", "consistent", "stalled"):
      x = np.asarray(getattr(self, name))
      if x.ndim != 1 or x.dtype != bool:
        raise ValueError(f"{name}: expected a 1-D bool array, got {x.dtype} of shape {x.shape}")
      lengths.add(x.shape[0])
      object.__setattr__(self, name, x)
    if len(lengths) != 1:
      raise ValueError("accepted, consistent, stalled: expected one length (turns), got "
                       f"{sorted(lengths)}")

  @property
  def turns(self) -> int:
    return int(self.accepted.shape[0])


@dataclasses.dataclass(frozen=True)
class Rate:
  """A share with its counts and a 95 % Wilson interval (None when there are no trials)."""

  successes: int
  trials: int

  @property
  def value(self) -> float:
    return self.successes / self.trials if self.trials else math.nan

  def interval(self, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval: well-behaved at 0 and 1 and for few trials."""
    n, k = self.trials, self.successes
    if n == 0:
      return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))

  def __str__(self) -> str:
    if not self.trials:
      return "n/a"
    return f"{100 * self.value:.1f}% ({self.successes}/{self.trials})"


def _episodes(episodes: Sequence[EpisodeTrace]) -> Sequence[EpisodeTrace]:
  episodes = list(episodes)
  for i, ep in enumerate(episodes):
    if not isinstance(ep, EpisodeTrace):
      raise ValueError(f"episodes[{i}]: expected an EpisodeTrace, got {type(ep).__name__}")
  return episodes


def success(episodes: Sequence[EpisodeTrace]) -> Rate:
  """The share of episodes won."""
  episodes = _episodes(episodes)
  return Rate(sum(bool(ep.won) for ep in episodes), len(episodes))


def harness_utilization(episodes: Sequence[EpisodeTrace]) -> Rate:
  """The share of actions that are admissible and consistent with the harness record."""
  episodes = _episodes(episodes)
  good = sum(int(np.sum(ep.accepted & ep.consistent)) for ep in episodes)
  return Rate(good, sum(ep.turns for ep in episodes))


def stall_prevention(episodes: Sequence[EpisodeTrace]) -> Rate:
  """The share of episodes that never enter an unproductive loop."""
  episodes = _episodes(episodes)
  return Rate(sum(not ep.stalled.any() for ep in episodes), len(episodes))


def stall_entries(stalled: np.ndarray) -> np.ndarray:
  """Turn indices where a stall begins: stalled now and not at the previous turn."""
  stalled = np.asarray(stalled, bool)
  before = np.concatenate([[False], stalled[:-1]])
  return np.flatnonzero(stalled & ~before)


def stall_escape(episodes: Sequence[EpisodeTrace], *, within: int = 5) -> Rate:
  """The share of stall entries left within ``within`` turns (see the module docstring)."""
  if not isinstance(within, int) or within < 1:
    raise ValueError(f"within: expected a positive number of turns, got {within!r}")
  episodes = _episodes(episodes)
  entries = escapes = 0
  for ep in episodes:
    for t in stall_entries(ep.stalled):
      entries += 1
      after = ep.stalled[t + 1:t + 1 + within]
      if (~after).any() or (ep.won and ep.turns - 1 <= t + within):
        escapes += 1
  return Rate(escapes, entries)


def summarize(episodes: Sequence[EpisodeTrace], *, within: int = 5) -> dict[str, Rate]:
  """All four metrics of one evaluation setting."""
  return {"success": success(episodes),
          "harness_utilization": harness_utilization(episodes),
          "stall_prevention": stall_prevention(episodes),
          "stall_escape": stall_escape(episodes, within=within)}


@dataclasses.dataclass(frozen=True)
class PairedWins:
  """Two models' wins on the same tasks, episode by episode (`paired_wins`).

  Attributes:
    gained: episodes `after` won and `before` did not.
    lost: episodes `before` won and `after` did not.
    both, neither: episodes both won, and neither won.
    p_value: the exact two-sided McNemar test of "no change": the probability, under
      Binomial(gained + lost, 1/2), of a split of the discordant episodes at least as uneven
      as this one; 1 when no episode differs.
  """

  gained: int
  lost: int
  both: int
  neither: int
  p_value: float


def mcnemar_exact(gained: int, lost: int) -> float:
  """Exact two-sided McNemar p-value of `gained` against `lost` discordant pairs:
  ``min(1, 2 · P[Binomial(n, 1/2) <= min(gained, lost)])`` with ``n = gained + lost``."""
  for name, v in (("gained", gained), ("lost", lost)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
      raise ValueError(f"{name}: expected a count (int >= 0), got {v!r}")
  n = int(gained) + int(lost)
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(min(int(gained), int(lost)) + 1))
  return min(1.0, 2.0 * tail / 2.0 ** n)


def paired_wins(before: Sequence[EpisodeTrace], after: Sequence[EpisodeTrace]) -> PairedWins:
  """Compares two evaluations of the same tasks in the same order, episode by episode.

  A paired test sees what two Wilson intervals on the same tasks hide: most tasks are won (or
  lost) by both models, and only the discordant ones carry information about a change.
  """
  before, after = _episodes(before), _episodes(after)
  if len(before) != len(after):
    raise ValueError(f"after: expected the {len(before)} episodes of `before` (the same tasks "
                     f"in the same order), got {len(after)}")
  a = np.array([bool(ep.won) for ep in before], bool)
  b = np.array([bool(ep.won) for ep in after], bool)
  gained, lost = int(np.sum(b & ~a)), int(np.sum(a & ~b))
  return PairedWins(gained=gained, lost=lost, both=int(np.sum(a & b)),
                    neither=int(np.sum(~a & ~b)), p_value=mcnemar_exact(gained, lost))


@dataclasses.dataclass(frozen=True)
class PooledPairedWins:
  """Two methods' wins on the same tasks over several seeds (`pooled_paired_wins`).

  Attributes:
    gained, lost: discordant episodes summed over seeds (`PairedWins.gained`, `.lost`).
    ahead, behind: tasks whose seed-summed difference d_t = Σ_k (after_k,t - before_k,t) is
      positive, and negative.
    seeds: how many seed pairs were pooled.
    p_value: the exact two-sided paired sign-flip test on d_t (`sign_flip_p_value`); with one
      seed it is McNemar's exact test (`mcnemar_exact`).
  """

  gained: int
  lost: int
  ahead: int
  behind: int
  seeds: int
  p_value: float


def sign_flip_p_value(scores: Sequence[int]) -> float:
  """Exact two-sided p-value of the paired sign-flip (permutation) test on integer scores.

  Under "no difference" each task's score is as likely to have either sign, so the observed
  total is compared with the 2^m totals Σ ±|d_t| of the m non-zero scores:
  ``P(|Σ ε_t |d_t|| >= |Σ d_t|)`` with independent fair signs ε_t. The distribution of the
  total is built exactly by convolution over the integer scores (O(m · Σ|d_t|)), not sampled.
  With every |d_t| = 1 it is McNemar's exact test.
  """
  values = []
  for i, d in enumerate(scores):
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
      raise ValueError(f"scores[{i}]: expected an int, got {d!r}")
    values.append(int(d))
  observed = abs(sum(values))
  sizes = [abs(d) for d in values if d]
  counts = {0: 1}  # total -> number of sign patterns giving it (exact integers)
  for size in sizes:
    nxt: dict[int, int] = {}
    for total, c in counts.items():
      for v in (total + size, total - size):
        nxt[v] = nxt.get(v, 0) + c
    counts = nxt
  tail = sum(c for total, c in counts.items() if abs(total) >= observed)
  return tail / 2 ** len(sizes)


def pooled_paired_wins(before: Sequence[Sequence[EpisodeTrace]],
                       after: Sequence[Sequence[EpisodeTrace]]) -> PooledPairedWins:
  """Compares two methods over seeds on the same tasks: seed k of `before` against seed k of
  `after`, each a list of episodes on the same tasks in the same order.

  Pooling the seeds' discordant episodes into one McNemar test would count one task several
  times as if independent (the runs of every seed meet the same task, and its difficulty is
  shared). The test instead sums each task's differences over the seeds, d_t ∈ [-K, K] for K
  seeds, and applies the exact sign-flip test to the tasks: the task stays the unit, as in a
  single-seed McNemar test. It assumes each task's d_t is symmetric about 0 under "no
  difference" (exact when the two methods' runs are exchangeable).
  """
  before, after = list(before), list(after)
  if not before:
    raise ValueError("before: expected at least one seed's episodes, got none")
  if len(after) != len(before):
    raise ValueError(f"after: expected {len(before)} seeds (one per seed of `before`), got "
                     f"{len(after)}")
  diffs, gained, lost = None, 0, 0
  for k, (b, a) in enumerate(zip(before, after)):
    b, a = _episodes(b), _episodes(a)
    if diffs is None:
      diffs = np.zeros(len(b), int)
    for name, group in (("before", b), ("after", a)):
      if len(group) != len(diffs):
        raise ValueError(f"{name}[{k}]: expected the {len(diffs)} episodes of before[0] (the "
                         f"same tasks in the same order), got {len(group)}")
    won_b = np.array([bool(ep.won) for ep in b], bool)
    won_a = np.array([bool(ep.won) for ep in a], bool)
    gained += int(np.sum(won_a & ~won_b))
    lost += int(np.sum(won_b & ~won_a))
    diffs += won_a.astype(int) - won_b.astype(int)
  return PooledPairedWins(gained=gained, lost=lost, ahead=int(np.sum(diffs > 0)),
                          behind=int(np.sum(diffs < 0)), seeds=len(before),
                          p_value=sign_flip_p_value(diffs.tolist()))


def seed_bootstrap(groups: Sequence[Sequence[EpisodeTrace]], *, samples: int = 2000,
                   seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
  """Success pooled over training seeds, with a two-stage (cluster) bootstrap interval.

  Each group holds the evaluation episodes of one training seed. A bootstrap sample draws the
  seeds with replacement, then each drawn seed's episodes with replacement, and pools them;
  the interval is the percentile interval of the pooled success over `samples` draws. Seed
  to seed variation (how a distilled student depends on its training run) thus widens the
  interval, which a Wilson interval on the pooled episodes would ignore. With one group it is
  the ordinary bootstrap over episodes.

  Returns:
    (success of the pooled episodes, lower, upper), in [0, 1]; NaNs without episodes.
  """
  if not isinstance(samples, int) or samples < 1:
    raise ValueError(f"samples: expected a positive int, got {samples!r}")
  if not 0.0 < level < 1.0:
    raise ValueError(f"level: expected a probability in (0, 1), got {level!r}")
  won = [np.array([bool(ep.won) for ep in _episodes(g)], np.float64) for g in groups]
  won = [w for w in won if w.size]
  if not won:
    return (math.nan, math.nan, math.nan)
  value = float(np.concatenate(won).mean())
  rng = np.random.default_rng(seed)
  stats = np.empty(samples)
  for b in range(samples):
    picked = rng.integers(0, len(won), size=len(won))
    total = count = 0.0
    for g in picked:
      draw = rng.integers(0, won[g].size, size=won[g].size)
      total += won[g][draw].sum()
      count += won[g].size
    stats[b] = total / count
  lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
  return (value, float(lo), float(hi))
