"""Estimator comparisons of the harness-transfer study: large changes and small differences.

Both findings predict a return `J = C - M` (docs/theory.md) where `C` is exact (the soft-Bellman
solve of a known harness) and `M` is *sampled* through the deployed policy
(`harnax.estimate`, docs/estimation.md); docs/transfer_estimators.md states the method,
the budget accounting and the results.

1. **Large changes.** A checkpoint trained on harness H is deployed frozen on H'. Its new
   return is predicted by `C' - M_hat'` (`M_hat'`: geometric stopping from the frozen policy's
   discounted occupancy, N actions per state, `estimate_mismatch`) and by `C'` alone, whose
   error is exactly `M'`. The direction of the change `J' - J` is predicted by
   `(C' - M_hat') - (C - M_hat)` and by `C' - C`.
2. **Small differences during adaptation.** Along two training runs from one checkpoint
   (adapted to H1, continued on H0) the difference `D = J_H1(adapted) - J_H0(continued)` is
   estimated at every evaluated step by `(C_H1 - M_hat_H1) - (C_H0 - M_hat_H0)` (every-step
   mismatch along rollouts, `every_step_mismatch`) and by frequency rollouts — of the
   regularized return (`rollout_return`, unbiased for `J`) and of the plain discounted reward
   (success counts, unbiased for the KL-free value) — at equal budgets (below), over seeds.

**Budget units.** One unit is one sampled environment transition or one query of the deployed
policy (one sampled action). A rollout step samples an action and a transition: 2 units. A
frequency rollout of H steps costs `2H`; a mismatch rollout of H steps additionally samples N
actions at each visited state: `(2 + N) H`. Exact quantities (`C`, `pi*`) come from the known
harness and cost no units. `match_budget` gives each side the largest number of rollouts that
fits the same budget; both spend at most it. Steps after an episode ends are charged too (the
fixed horizon of a vmapped rollout), on both sides alike.

The computations take semantic policies `[N, S, A]` of any policy family; `run` trains the
log-linear family (`harnax.studies.families.LogLinearFamily`) to produce them.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax import estimate as he
from harnax import train as train_lib
from harnax.core import evaluation
from harnax.core import objectives
from harnax.core import sampling as core_sampling
from harnax.core import solvers
from harnax.envs import miniwob as mw
from harnax.studies import families
from harnax.studies import miniwob
from harnax.studies import results

Array = jax.Array

PAPER = {
    "large_error_ratio": "~100× less error with the mismatch",
    "large_direction": "almost always right (mismatch)",
    "small_error_ratio": "mismatch ~10× more accurate",
    "small_call": "rollouts overestimate the gap and call the reversal too early",
}
ADAPT_SOURCE, ADAPT_TARGET = "H0", "H1"


# ---------------------------------------------------------------------------
# Budgets.
# ---------------------------------------------------------------------------

class Budget(NamedTuple):
  """Equal budgets for the two sides of the small-difference comparison (module doc).

  Attributes:
    budget: units per arm, instance and evaluated step.
    num_mismatch_rollouts: rollouts of the mismatch side.
    num_return_rollouts: rollouts of the frequency side.
    mismatch_units, return_units: units each side spends (both `<= budget`).
  """

  budget: int
  num_mismatch_rollouts: int
  num_return_rollouts: int
  mismatch_units: int
  return_units: int


def _positive_int(name: str, x) -> int:
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
    raise ValueError(f"{name}: expected a positive int, got {x!r}")
  return int(x)


def return_rollout_units(*, horizon: int) -> int:
  """Units of one frequency rollout of `horizon` steps: an action and a transition per step."""
  return 2 * _positive_int("horizon", horizon)


def mismatch_rollout_units(*, horizon: int, num_action_samples: int) -> int:
  """Units of one every-step mismatch rollout: `(2 + N)` per step (N extra action queries)."""
  return (2 + _positive_int("num_action_samples", num_action_samples)) * _positive_int(
      "horizon", horizon)


def match_budget(budget: int, *, horizon: int, num_action_samples: int) -> Budget:
  """The largest rollout counts of each side that fit `budget` units (at least one each)."""
  budget = _positive_int("budget", budget)
  cm = mismatch_rollout_units(horizon=horizon, num_action_samples=num_action_samples)
  cr = return_rollout_units(horizon=horizon)
  if budget < cm:
    raise ValueError(f"budget: expected at least {cm} units (one mismatch rollout of "
                     f"{horizon} steps with {num_action_samples} actions per state), got {budget}")
  nm, nr = budget // cm, budget // cr
  return Budget(budget, nm, nr, nm * cm, nr * cr)


# ---------------------------------------------------------------------------
# A family's compiled harnesses and exact quantities.
# ---------------------------------------------------------------------------

class FamilyData(NamedTuple):
  """Train and held-out instances of one family under each harness, padded to one shape.

  Attributes:
    family: the family name; harnesses: names in order.
    train, test: `{harness: miniwob.PaddedBatch}`.
  """

  family: str
  harnesses: tuple[str, ...]
  train: dict
  test: dict


def compile_family(family: str, *, num_train: int, num_test: int, split_seed: int = 0,
                   discount: float = 0.9,
                   harnesses: Sequence[str] = mw.HARNESSES) -> FamilyData:
  """Compiles `task_split(family, ...)` under every harness, one padded shape for all."""
  if family not in mw.FAMILIES:
    raise ValueError(f"family: expected one of {mw.FAMILIES}, got {family!r}")
  bad = [h for h in harnesses if h not in mw.HARNESSES]
  if bad or not harnesses:
    raise ValueError(f"harnesses: expected a non-empty tuple of names from {mw.HARNESSES}, "
                     f"got {tuple(harnesses)}")
  _positive_int("num_train", num_train)
  _positive_int("num_test", num_test)
  tr, te = mw.task_split(family, num_train, num_test, seed=split_seed)
  comp = {split: {h: [mw.compile_harness(t, h, discount=discount) for t in tasks]
                  for h in harnesses} for split, tasks in (("train", tr), ("test", te))}
  shape = tuple(max(x) for x in zip(*(miniwob.batch_shape(cs) for d in comp.values()
                                      for cs in d.values())))
  pad = {split: {h: miniwob.pad_batch(cs, shape) for h, cs in d.items()}
         for split, d in comp.items()}
  return FamilyData(family, tuple(harnesses), pad["train"], pad["test"])


class Exact(NamedTuple):
  """Exact per-instance quantities of semantic policies, each `[N]` (`pi_star` `[N, S, A]`).

  Attributes:
    ceiling, value, mismatch: `C`, `J` and `M` (by its own formula, so `J = C - M` checks).
    plain_value: the KL-free discounted reward `mu0^T (I - gamma P_pi)^{-1} r_pi` (what
      success counts estimate).
    pi_star: the soft optimum.
  """

  ceiling: Array
  value: Array
  mismatch: Array
  plain_value: Array
  pi_star: Array


@jax.jit
def exact(policy: Array, mdp, pi_ref: Array, tau) -> Exact:
  """`C`, `J`, `M`, the plain value and `pi*` of policies `[N, S, A]` on stacked instances."""
  def one(m, pol, ref):
    sol = solvers.solve_soft_bellman(m, ref, tau)
    c = objectives.ceiling(m, ref, tau, solution=sol)
    j = evaluation.evaluate_policy(m, pol, ref, tau).value
    mm = objectives.mismatch(m, pol, ref, tau, solution=sol)
    # With pi_ref = pi the KL term vanishes: the plain discounted reward.
    plain = evaluation.evaluate_policy(m, pol, pol, tau).value
    return c, j, mm, plain, sol.policy
  return Exact(*jax.vmap(one)(mdp, policy, pi_ref))


# ---------------------------------------------------------------------------
# Finding 1: large changes.
# ---------------------------------------------------------------------------

class MismatchSamples(NamedTuple):
  """Sampled mismatch of every (trained on H, deployed on H') cell, pooled over instances.

  Attributes:
    value: `[seeds, H, H']`, `M_hat` (mean over instances).
    ci_low, ci_high: `[seeds, H, H']`, percentile-bootstrap interval of `value`.
    units: `[seeds, H, H']`, budget units spent (`2 sum T + n N` per instance, summed).
  """

  value: Array
  ci_low: Array
  ci_high: Array
  units: Array


def sample_mismatch_matrix(key, policies: Array, mdp, pi_star: Array, tau: float, *,
                           num_seeds: int, num_states: int, num_action_samples: int,
                           estimator: str = "miller_madow", max_steps: int = 200,
                           confidence: float = 0.9, num_resamples: int = 500) -> MismatchSamples:
  """`M_hat` of every cell by geometric stopping (`estimate_mismatch`), over seeds.

  Args:
    key: a `jax.random` key.
    policies: `[H, H', N, S, A]`, the model trained on H read through H' (N instances).
    mdp: `TabularMDP` stacked `[H', N, ...]`; pi_star: `[H', N, S, A]`.
    tau: temperature > 0.
    num_seeds: independent repetitions; num_states: n states per instance and cell;
    num_action_samples: N actions per state; estimator: one of `he.ESTIMATORS`;
    max_steps: rollout cap (bias in total variation `<= gamma^max_steps`).
    confidence, num_resamples: the bootstrap interval (over the pooled per-state values,
      every instance contributing `num_states`, so their mean is the mean over instances).

  Returns:
    `MismatchSamples`.
  """
  _positive_int("num_seeds", num_seeds)
  _positive_int("num_states", num_states)
  _positive_int("num_action_samples", num_action_samples)
  if estimator not in he.ESTIMATORS:
    raise ValueError(f"estimator: expected one of {he.ESTIMATORS}, got {estimator!r}")
  he.bootstrap.check_bootstrap_options(confidence, num_resamples)
  if not float(tau) > 0:
    raise ValueError(f"tau: expected a positive float, got {tau!r}")
  policies = jnp.asarray(policies)
  if policies.ndim != 5 or policies.shape[1:] != pi_star.shape:
    raise ValueError(f"policies: expected [H, {', '.join(map(str, pi_star.shape))}] "
                     f"(trained on H, read through each H' of pi_star), got "
                     f"{list(policies.shape)}")
  dtype = pi_star.dtype
  return MismatchSamples(*_sample_mismatch_matrix(
      key, policies.astype(dtype), mdp, pi_star, jnp.asarray(tau, dtype),
      jnp.asarray(confidence, dtype), int(num_seeds), int(num_states), int(num_action_samples),
      estimator, int(max_steps), int(num_resamples)))


# Module-level and static in the sizes, so that equal problems share one compilation.
@functools.partial(jax.jit, static_argnums=(6, 7, 8, 9, 10, 11))
def _sample_mismatch_matrix(key, policies, mdp, pi_star, tau, confidence, num_seeds,
                            num_states, num_action_samples, estimator, max_steps,
                            num_resamples):
  def instance(k, m, pol, star):
    est = he.estimate_mismatch(k, m, pol, star, tau, num_states=num_states,
                               num_action_samples=num_action_samples, estimator=estimator,
                               max_steps=max_steps, num_resamples=1)
    return est.samples, est.env_steps + est.action_samples

  def cell(k, m, pol, star):  # one (H, H') cell: instances pooled
    ks = jax.random.split(k, pol.shape[0] + 1)
    kls, units = jax.lax.map(lambda x: instance(*x), (ks[1:], m, pol, star))
    scale = tau / (1.0 - m.discount[0])
    lo, hi = he.bootstrap_ci(ks[0], kls.reshape(-1), confidence=confidence,
                             num_resamples=num_resamples, scale=scale)
    return scale * jnp.mean(kls), lo, hi, jnp.sum(units)

  h, hp = policies.shape[:2]

  over_target = jax.vmap(cell, in_axes=(0, 0, 0, 0))

  def seed(k):
    ks = jax.random.split(k, h * hp).reshape(h, hp)
    # The models one after another: each vmap level around the samplers' while loops
    # multiplies the compile time, a loop level does not.
    return jax.lax.map(lambda x: over_target(x[0], mdp, x[1], pi_star), (ks, policies))

  return jax.lax.map(seed, jax.random.split(key, num_seeds))


def large_change_metrics(ceiling: Array, value: Array, samples: MismatchSamples) -> dict:
  """Errors and directions of the two predictions of a frozen deployment, over seeds.

  Args:
    ceiling: `[H]`, exact mean `C` of each harness.
    value: `[H, H']`, exact mean `J` of the model trained on H read through H'.
    samples: `MismatchSamples` of the same cells.

  Returns:
    dict of NumPy values over the `H (H - 1)` ordered pairs `H != H'` and the seeds:
    `error_mismatch [seeds, pairs]` `|C' - M_hat' - J'|`, `error_ceiling [pairs]`
    `|C' - J'| (= M')`, their means and ratio, `direction_mismatch` / `direction_ceiling`
    (fraction of (seed, pair) whose predicted sign of `J' - J` is right; `J` is the
    model on its own harness H, predicted by `C - M_hat`), `coverage` (fraction whose
    interval `C' - [M_hi, M_lo]` holds `J'`), and `pairs` (index pairs).
  """
  c = np.asarray(ceiling, np.float64)
  v = np.asarray(value, np.float64)
  mh = np.asarray(samples.value, np.float64)
  n = c.shape[0]
  if v.shape != (n, n) or mh.shape[1:] != (n, n):
    raise ValueError(f"value: expected [{n}, {n}] and samples [seeds, {n}, {n}], got "
                     f"{list(v.shape)} and {list(mh.shape)}")
  if n < 2:
    raise ValueError("ceiling: expected at least 2 harnesses (ordered pairs H != H')")
  i, j = np.nonzero(~np.eye(n, dtype=bool))
  pred = c[j] - mh[:, i, j]                          # [seeds, pairs]
  err_m = np.abs(pred - v[i, j])
  err_c = np.abs(c[j] - v[i, j])
  true_dir = np.sign(v[i, j] - v[i, i])
  pred_src = c[i] - mh[:, i, i]
  dir_m = np.mean(np.sign(pred - pred_src) == true_dir)
  dir_c = np.mean(np.sign(c[j] - c[i]) == true_dir)
  lo = c[j] - np.asarray(samples.ci_high)[:, i, j]
  hi = c[j] - np.asarray(samples.ci_low)[:, i, j]
  cover = np.mean((lo <= v[i, j]) & (v[i, j] <= hi))
  mean_m, mean_c = float(np.mean(err_m)), float(np.mean(err_c))
  return dict(pairs=np.stack([i, j], -1), error_mismatch=err_m, error_ceiling=err_c,
              mean_error_mismatch=mean_m, mean_error_ceiling=mean_c,
              error_ratio=mean_c / mean_m if mean_m > 0 else np.inf,
              median_pair_ratio=float(np.median(err_c / np.maximum(np.mean(err_m, 0), 1e-300))),
              direction_mismatch=float(dir_m), direction_ceiling=float(dir_c),
              coverage=float(cover), num_true_changes=int(np.sum(true_dir != 0)))


# ---------------------------------------------------------------------------
# Finding 2: small differences during adaptation.
# ---------------------------------------------------------------------------

class Difference(NamedTuple):
  """Estimates of `D = J_1 - J_0` at one evaluated step (scalars, or stacked by vmap).

  Attributes:
    mismatch, mismatch_low, mismatch_high: `(C_1 - M_hat_1) - (C_0 - M_hat_0)` and its interval.
    rollout, rollout_low, rollout_high: frequency rollouts of the regularized return
      (`rollout_return`, unbiased for `J`) and their interval.
    success, success_low, success_high: frequency rollouts of the plain discounted reward
      (success counts; unbiased for the plain value, not for `J`) and their interval.
    mismatch_units, rollout_units: units spent by the mismatch side and by each frequency
      side (both arms, all instances).
  """

  mismatch: Array
  mismatch_low: Array
  mismatch_high: Array
  rollout: Array
  rollout_low: Array
  rollout_high: Array
  success: Array
  success_low: Array
  success_high: Array
  mismatch_units: Array
  rollout_units: Array


def _paired_mean(key, x: Array, *, confidence, num_resamples):
  """Mean of arm 1 minus arm 0 (`x` `[2, N, n]`) and its bootstrap interval.

  The arms are independent with equal counts, so the difference of means is the mean of the
  paired differences `z = x_1 - x_0`, and resampling the `z` bootstraps the difference.
  """
  z = (x[1] - x[0]).reshape(-1)
  lo, hi = he.bootstrap_ci(key, z, confidence=confidence, num_resamples=num_resamples)
  return jnp.mean(z), lo, hi


def difference_from_samples(key, ceiling_gap, kl_sums: Array, returns: Array,
                            plain_returns: Array, tau, *, confidence: float = 0.9,
                            num_resamples: int = 500) -> Difference:
  """The three estimates of `D = J_1 - J_0` from per-rollout samples of the two arms.

  Args:
    key: a `jax.random` key (the intervals).
    ceiling_gap: scalar, exact `mean C_1 - mean C_0`.
    kl_sums: `[2, N, n_M]`, per-rollout discounted KL sums (`every_step_mismatch` samples,
      unscaled: `M_hat = tau * mean`) of arm 0 and arm 1 on N instances.
    returns: `[2, N, n_R]`, per-rollout regularized returns (`rollout_return` samples).
    plain_returns: `[2, N, n_R]`, per-rollout plain discounted rewards.
    tau: temperature > 0.
    confidence, num_resamples: bootstrap options.

  Returns:
    `Difference` (units left 0: the caller knows the budget).
  """
  k1, k2, k3 = jax.random.split(key, 3)
  opts = dict(confidence=confidence, num_resamples=num_resamples)
  dm, lo_m, hi_m = _paired_mean(k1, tau * kl_sums, **opts)
  zero = jnp.zeros((), jnp.int32)
  return Difference(ceiling_gap - dm, ceiling_gap - hi_m, ceiling_gap - lo_m,
                    *_paired_mean(k2, returns, **opts), *_paired_mean(k3, plain_returns, **opts),
                    zero, zero)


def estimate_differences(key, arms, tau: float, *, budget: Budget, horizon: int,
                         num_action_samples: int, num_seeds: int, estimator: str = "k1",
                         confidence: float = 0.9, num_resamples: int = 500) -> Difference:
  """The estimates of `D` at every evaluated step, over seeds, at equal budgets.

  Args:
    key: a `jax.random` key.
    arms: `(mdp, policies, pi_star, pi_ref, ceiling)`, each stacked `[2, ...]` over the arms
      (0: the control, 1: the other): `mdp` `[2, N, ...]`, `policies` `[2, K, N, S, A]` at K
      evaluated steps, `pi_star` and `pi_ref` `[2, N, S, A]`, `ceiling` `[2, N]` (exact `C`).
    tau: temperature > 0.
    budget: `match_budget(...)` (per arm, instance and step; each frequency side gets it).
    horizon: H steps per rollout (every side); num_action_samples: N per visited state.
    num_seeds: repetitions; estimator: per-state KL estimator (`he.ESTIMATORS`).
    confidence, num_resamples: bootstrap options.

  Returns:
    `Difference` with fields `[num_seeds, K]`.
  """
  _positive_int("num_seeds", num_seeds)
  if estimator not in he.ESTIMATORS:
    raise ValueError(f"estimator: expected one of {he.ESTIMATORS}, got {estimator!r}")
  if not isinstance(budget, Budget):
    raise ValueError(f"budget: expected a Budget from match_budget, got {budget!r}")
  if budget != match_budget(budget.budget, horizon=horizon,
                            num_action_samples=num_action_samples):
    raise ValueError(f"budget: {budget} was not matched for horizon {horizon} and "
                     f"{num_action_samples} actions per state")
  he.bootstrap.check_bootstrap_options(confidence, num_resamples)
  mdp, policies, pi_star, pi_ref, ceiling = arms
  policies = jnp.asarray(policies)
  if policies.ndim != 5 or policies.shape[0] != 2:
    raise ValueError(f"arms: expected policies [2, K, N, S, A], got {list(policies.shape)}")
  dtype = pi_star.dtype
  d = _estimate_differences(key, mdp, policies.astype(dtype), pi_star, pi_ref,
                            jnp.asarray(ceiling, dtype), jnp.asarray(tau, dtype),
                            jnp.asarray(confidence, dtype), budget.num_mismatch_rollouts,
                            budget.num_return_rollouts, int(horizon), int(num_action_samples),
                            int(num_seeds), estimator, int(num_resamples))
  units = 2 * policies.shape[2]                           # arms x instances
  return d._replace(mismatch_units=jnp.full(d.mismatch.shape, units * budget.mismatch_units),
                    rollout_units=jnp.full(d.mismatch.shape, units * budget.return_units))


@functools.partial(jax.jit, static_argnums=tuple(range(8, 15)))
def _estimate_differences(key, mdp, policies, pi_star, pi_ref, ceiling, tau, confidence, nm, nr,
                          horizon, num_action_samples, num_seeds, estimator, num_resamples):
  num_inst = policies.shape[2]
  gap = jnp.mean(ceiling[1]) - jnp.mean(ceiling[0])

  def instance(k, m, pol, star, ref):
    km, kr, kp = jax.random.split(k, 3)
    kl = he.every_step_mismatch(km, m, pol, star, tau, num_rollouts=nm, horizon=horizon,
                                num_action_samples=num_action_samples, estimator=estimator,
                                num_resamples=1).samples
    ret = he.rollout_return(kr, m, pol, ref, tau, num_rollouts=nr, horizon=horizon,
                            num_resamples=1).samples
    plain = core_sampling.rollout(kp, m, pol, num_envs=nr, num_steps=horizon).returns
    return kl, ret, plain

  # Arms and instances one after another: a vmap level around the samplers multiplies the
  # compile time, a loop level does not.
  flat = jax.tree.map(lambda x: x.reshape((2 * num_inst,) + x.shape[2:]), (mdp, pi_star, pi_ref))

  def step(k, pol):                                       # pol [2, N, S, A]
    ks = jax.random.split(k, 2 * num_inst + 1)
    m, star, ref = flat
    kl, ret, plain = jax.lax.map(
        lambda x: instance(*x),
        (ks[1:], m, pol.reshape((2 * num_inst,) + pol.shape[2:]), star, ref))
    kl, ret, plain = (x.reshape((2, num_inst) + x.shape[1:]) for x in (kl, ret, plain))
    return difference_from_samples(ks[0], gap, kl, ret, plain, tau, confidence=confidence,
                                   num_resamples=num_resamples)

  steps_first = jnp.swapaxes(policies, 0, 1)              # [K, 2, N, S, A]

  def seed(k):
    return jax.vmap(step)(jax.random.split(k, steps_first.shape[0]), steps_first)

  return jax.lax.map(seed, jax.random.split(key, num_seeds))


def reversal_step(values: Array, lower: Array | None = None) -> Array:
  """Index of the first evaluated step at which the difference is called positive.

  The rank reversal of the adaptation study: the adapted arm overtakes the control, so
  `D` turns from negative to positive. Point rule: the first `k` with `values[k] > 0`;
  interval rule (pass `lower`): the first `k` whose interval excludes zero from above,
  `lower[k] > 0`. `-1` when never. Works under `jit`/`vmap` (last axis = steps).

  Args:
    values: `[..., K]` estimates (or the exact curve).
    lower: `[..., K]` lower interval ends, or None.

  Returns:
    int32 `[...]`.
  """
  x = jnp.asarray(values if lower is None else lower)
  if x.ndim < 1 or x.shape[-1] == 0:
    raise ValueError(f"values: expected [..., K] with K >= 1 steps, got {list(x.shape)}")
  hit = x > 0
  return jnp.where(jnp.any(hit, -1), jnp.argmax(hit, -1), -1).astype(jnp.int32)


def small_difference_metrics(exact_difference: Array, est: Difference,
                             steps: Sequence[int], *, plain_difference: Array | None = None
                             ) -> dict:
  """Errors, interval coverage and reversal calls of the estimators against the exact `D`.

  Args:
    exact_difference: `[K]`, exact `D` at the evaluated steps.
    est: `Difference` with fields `[seeds, K]`.
    steps: the K training steps evaluated.
    plain_difference: `[K]`, the exact difference of plain values (the success counts' own
      target), or None.

  Returns:
    dict: per estimator (`"mismatch"`, `"rollout"`, `"success"`): `rmse`, `mean_abs_error`,
    `bias` (mean signed error), `overestimate` (mean `|D_hat| - |D|`), `coverage`, and the
    reversal calls (`point_calls`, `interval_calls`: training step per seed, -1 never;
    `point`, `interval`: `early`, `exact`, `late` (never included), `never` fractions and the
    median called step); `"success"` also has `rmse_own_target` when `plain_difference` is
    given; `rmse_ratio` and `rmse_ratio_success` (each rollout side over the mismatch side);
    `true_step` (training step of the exact reversal, -1 none); `mismatch_units`,
    `rollout_units`.
  """
  d = np.asarray(exact_difference, np.float64)
  steps = np.asarray(steps)
  if d.ndim != 1 or d.shape[0] != steps.shape[0]:
    raise ValueError(f"steps: expected {d.shape[0]} evaluated steps, got {steps.shape[0]}")
  ti = int(reversal_step(jnp.asarray(d)))
  true_step = int(steps[ti]) if ti >= 0 else -1
  out = {"true_step": true_step, "steps": steps}

  def calls(idx):
    idx = np.asarray(idx)
    st = np.where(idx >= 0, steps[np.maximum(idx, 0)], -1)
    never = idx < 0
    if true_step < 0:
      early, late = ~never, np.zeros_like(never)
    else:
      early = ~never & (st < true_step)
      late = never | (st > true_step)
    return st, dict(early=float(np.mean(early)), late=float(np.mean(late)),
                    never=float(np.mean(never)), exact=float(np.mean(st == true_step)),
                    median_step=float(np.median(st[~never])) if np.any(~never) else -1.0)

  for name, v, lo, hi in (("mismatch", est.mismatch, est.mismatch_low, est.mismatch_high),
                          ("rollout", est.rollout, est.rollout_low, est.rollout_high),
                          ("success", est.success, est.success_low, est.success_high)):
    v, lo, hi = (np.asarray(x, np.float64) for x in (v, lo, hi))
    err = v - d[None]
    pst, pstat = calls(reversal_step(jnp.asarray(v)))
    ist, istat = calls(reversal_step(jnp.asarray(v), jnp.asarray(lo)))
    out[name] = dict(rmse=float(np.sqrt(np.mean(err ** 2))),
                     mean_abs_error=float(np.mean(np.abs(err))), bias=float(np.mean(err)),
                     overestimate=float(np.mean(np.abs(v) - np.abs(d)[None])),
                     coverage=float(np.mean((lo <= d) & (d <= hi))),
                     point_calls=pst, interval_calls=ist, point=pstat, interval=istat)
  if plain_difference is not None:
    plain = np.asarray(plain_difference, np.float64)
    out["success"]["rmse_own_target"] = float(np.sqrt(np.mean(
        (np.asarray(est.success) - plain[None]) ** 2)))
  out["rmse_ratio"] = out["rollout"]["rmse"] / max(out["mismatch"]["rmse"], 1e-300)
  out["rmse_ratio_success"] = out["success"]["rmse"] / max(out["mismatch"]["rmse"], 1e-300)
  out["mismatch_units"] = int(np.asarray(est.mismatch_units).reshape(-1)[0])
  out["rollout_units"] = int(np.asarray(est.rollout_units).reshape(-1)[0])
  return out


# ---------------------------------------------------------------------------
# The pipeline (log-linear family).
# ---------------------------------------------------------------------------

def _mean_return(theta, data):
  batch, tau = data
  pol = families.LogLinearFamily().semantic_policy(theta, batch)
  return jnp.mean(jax.vmap(lambda m, p, r: evaluation.evaluate_policy(m, p, r, tau).value)(
      batch.mdp, pol, batch.pi_ref))


def training_path(theta, batch: miniwob.PaddedBatch, *, tau: float, steps: int,
                  learning_rate: float) -> Array:
  """Log-linear weights at training steps `0..steps` of Adam on the exact mean `J`, `[steps+1, D]`.

  The same run as `LogLinearFamily(learning_rate).train` (a fresh Adam state), recorded
  step by step (`harnax.train.fit(keep_path=True)`).
  """
  dtype = batch.pi_ref.dtype
  theta = jnp.asarray(theta, dtype)
  out = train_lib.fit(_mean_return, theta, (batch, jnp.asarray(tau, dtype)),
                      optimizer=train_lib.adam(float(learning_rate)), num_steps=int(steps),
                      keep_path=True)
  return jnp.concatenate([out.path, out.params[None]], 0)


def check_config(cfg) -> None:
  """Raises `ValueError` naming the first bad field of a `configs/transfer_estimators.py` config."""
  unknown = [f for f in cfg.families if f not in mw.FAMILIES]
  if unknown or not cfg.families:
    raise ValueError(f"families: expected names from {mw.FAMILIES}, got {tuple(cfg.families)}")
  bad = [h for h in cfg.harnesses if h not in mw.HARNESSES]
  if bad or len(cfg.harnesses) < 2:
    raise ValueError(f"harnesses: expected at least 2 names from {mw.HARNESSES}, got "
                     f"{tuple(cfg.harnesses)}")
  for h in (ADAPT_SOURCE, ADAPT_TARGET):
    if h not in cfg.harnesses:
      raise ValueError(f"harnesses: the adaptation study needs {h}, got {tuple(cfg.harnesses)}")
  for name in ("num_train", "num_test", "steps", "adapt_steps", "eval_every"):
    _positive_int(name, cfg[name])
  for name in ("learning_rate", "adapt_learning_rate"):
    if not float(cfg[name]) > 0:
      raise ValueError(f"{name}: expected a positive float, got {cfg[name]!r}")
  for sec, names in (("large", ("num_seeds", "num_states", "num_action_samples", "max_steps")),
                     ("small", ("num_seeds", "budget", "horizon", "num_action_samples"))):
    for name in names:
      _positive_int(f"{sec}.{name}", cfg[sec][name])
    if cfg[sec].estimator not in he.ESTIMATORS:
      raise ValueError(f"{sec}.estimator: expected one of {he.ESTIMATORS}, got "
                       f"{cfg[sec].estimator!r}")
  if not float(cfg.tau) > 0:
    raise ValueError(f"tau: expected a positive float, got {cfg.tau!r}")
  if not 0.0 <= float(cfg.discount) < 1.0:
    raise ValueError(f"discount: expected 0 <= gamma < 1, got {cfg.discount!r}")
  if not 0.0 < float(cfg.confidence) < 1.0:
    raise ValueError(f"confidence: expected a level in (0, 1), got {cfg.confidence!r}")
  _positive_int("num_resamples", cfg.num_resamples)
  match_budget(cfg.small.budget, horizon=cfg.small.horizon,
               num_action_samples=cfg.small.num_action_samples)


def run_family(cfg, family: str, key, *, log: results.Log | None = None) -> dict:
  """Both findings on one family (module doc); NumPy results."""
  log = log or (lambda _: None)
  tau = float(cfg.tau)
  data = compile_family(family, num_train=cfg.num_train, num_test=cfg.num_test,
                        split_seed=cfg.split_seed, discount=cfg.discount,
                        harnesses=tuple(cfg.harnesses))
  names = data.harnesses
  fam = families.LogLinearFamily(float(cfg.learning_rate))
  theta0 = fam.initial_params()
  thetas = {}
  for h in names:
    thetas[h], _ = fam.train(theta0, data.train[h], tau=tau, steps=cfg.steps)
  log(f"{family}: trained on {', '.join(names)} ({cfg.steps} steps each)")

  # Finding 1: every (H, H') cell, exact and sampled.
  test = [data.test[h] for h in names]
  mdp = jax.tree.map(lambda *x: jnp.stack(x), *(b.mdp for b in test))
  pols = jnp.stack([jnp.stack([fam.semantic_policy(thetas[h], b) for b in test]) for h in names])
  cells = [[exact(pols[i, j], test[j].mdp, test[j].pi_ref, tau) for j in range(len(names))]
           for i in range(len(names))]
  value = np.array([[float(jnp.mean(c.value)) for c in row] for row in cells])
  mismatch = np.array([[float(jnp.mean(c.mismatch)) for c in row] for row in cells])
  ceiling = np.array([float(jnp.mean(cells[0][j].ceiling)) for j in range(len(names))])
  pi_star = jnp.stack([cells[0][j].pi_star for j in range(len(names))])
  k_large, k_small = jax.random.split(key)
  lc = cfg.large
  samples = sample_mismatch_matrix(
      k_large, pols, mdp, pi_star, tau, num_seeds=lc.num_seeds, num_states=lc.num_states,
      num_action_samples=lc.num_action_samples, estimator=lc.estimator,
      max_steps=lc.max_steps, confidence=cfg.confidence, num_resamples=cfg.num_resamples)
  large = large_change_metrics(ceiling, value, samples)
  large.update(ceiling=ceiling, value=value, mismatch=mismatch,
               mismatch_hat=np.asarray(samples.value), ci_low=np.asarray(samples.ci_low),
               ci_high=np.asarray(samples.ci_high),
               mean_units=float(np.mean(np.asarray(samples.units))))
  log(f"{family}: large changes, {len(names) * (len(names) - 1)} pairs x {lc.num_seeds} seeds: "
      f"error {large['mean_error_mismatch']:.4f} (C' - M_hat') vs "
      f"{large['mean_error_ceiling']:.4f} (C')")

  # Finding 2: the adaptation runs from the H0 checkpoint, step by step.
  sc = cfg.small
  src, tgt = ADAPT_SOURCE, ADAPT_TARGET
  path = {h: training_path(thetas[src], data.train[h], tau=tau, steps=cfg.adapt_steps,
                           learning_rate=cfg.adapt_learning_rate) for h in (src, tgt)}
  steps = np.arange(0, cfg.adapt_steps + 1, cfg.eval_every)
  arm_pols, arm_exact = [], []
  for h in (src, tgt):                                    # arm 0: continued; arm 1: adapted
    b = data.test[h]
    p = jnp.stack([fam.semantic_policy(path[h][k], b) for k in steps])
    arm_pols.append(p)
    arm_exact.append([exact(p[k], b.mdp, b.pi_ref, tau) for k in range(len(steps))])
  j_arm = np.array([[float(jnp.mean(e.value)) for e in ex] for ex in arm_exact])   # [2, K]
  plain_arm = np.array([[float(jnp.mean(e.plain_value)) for e in ex] for ex in arm_exact])
  diff = j_arm[1] - j_arm[0]
  budget = match_budget(sc.budget, horizon=sc.horizon, num_action_samples=sc.num_action_samples)
  b0, b1 = data.test[src], data.test[tgt]
  arms = (jax.tree.map(lambda *x: jnp.stack(x), b0.mdp, b1.mdp), jnp.stack(arm_pols),
          jnp.stack([arm_exact[0][0].pi_star, arm_exact[1][0].pi_star]),
          jnp.stack([b0.pi_ref, b1.pi_ref]),
          jnp.stack([arm_exact[0][0].ceiling, arm_exact[1][0].ceiling]))
  est = estimate_differences(k_small, arms, tau, budget=budget, horizon=sc.horizon,
                             num_action_samples=sc.num_action_samples, num_seeds=sc.num_seeds,
                             estimator=sc.estimator, confidence=cfg.confidence,
                             num_resamples=cfg.num_resamples)
  small = small_difference_metrics(diff, est, steps,
                                   plain_difference=plain_arm[1] - plain_arm[0])
  small.update(exact=diff, exact_plain=plain_arm[1] - plain_arm[0], value_adapted=j_arm[1],
               value_continued=j_arm[0],
               budget=budget._asdict(),
               estimates={k: np.asarray(v) for k, v in est._asdict().items()
                          if not k.endswith("units")})
  log(f"{family}: adaptation {src} -> {tgt} vs {src} continued, {len(steps)} steps x "
      f"{sc.num_seeds} seeds: RMSE {small['mismatch']['rmse']:.4f} (mismatch) vs "
      f"{small['rollout']['rmse']:.4f} (regularized rollouts), "
      f"{small['success']['rmse']:.4f} (success counts)")
  return {"harnesses": names, "large": large, "small": small}


def run(cfg, *, log: results.Log | None = None) -> dict:
  """Both findings on every family of the config: `{"families": {...}, "seconds": ...}`."""
  check_config(cfg)
  t0 = time.time()
  key = jax.random.key(int(cfg.seed))
  out = {}
  for i, family in enumerate(cfg.families):
    out[family] = run_family(cfg, family, jax.random.fold_in(key, i), log=log)
  return {"families": out, "seconds": time.time() - t0}


# ---------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------

def _pct(x):
  return f"{100 * float(x):.0f} %"


def _call(stat, true_step):
  if true_step < 0:
    return f"no true reversal; called in {_pct(1 - stat['never'])} of seeds"
  return (f"median step {stat['median_step']:.0f}; early {_pct(stat['early'])}, "
          f"on time {_pct(stat['exact'])}, late {_pct(stat['late'] - stat['never'])}, "
          f"never {_pct(stat['never'])}")


def render(cfg, result: dict) -> str:
  """The markdown report: every table has the paper's figure beside ours."""
  fams = result["families"]
  lc, sc = cfg.large, cfg.small
  lines = ["# Estimator comparisons of the harness-transfer study", "",
           f"Log-linear family, {cfg.num_train} training / {cfg.num_test} held-out instances "
           f"per family, γ = {cfg.discount}, τ = {cfg.tau}, {cfg.steps} training steps per "
           f"harness; {result['seconds']:.0f} s. Method and budget accounting: "
           "docs/transfer_estimators.md.", "",
           "## 1. Large changes: a frozen checkpoint deployed on another harness", "",
           f"Every ordered pair H → H' of {len(cfg.harnesses)} harnesses; `M̂'` by geometric "
           f"stopping ({lc.num_states} states per instance, N = {lc.num_action_samples} "
           f"actions per state, `{lc.estimator}`), {lc.num_seeds} seeds. Error = mean over "
           "pairs and seeds of |prediction − exact J'|. Direction: sign of the predicted "
           "J' − J (J: the checkpoint on its own harness, predicted as C − M̂) against the "
           "exact sign.", ""]
  rows = []
  for f, r in fams.items():
    lg = r["large"]
    rows.append([f, f"{lg['mean_error_ceiling']:.4f}", f"{lg['mean_error_mismatch']:.4f}",
                 f"{lg['error_ratio']:.0f}×", f"{lg['median_pair_ratio']:.0f}×",
                 PAPER["large_error_ratio"], _pct(lg["direction_mismatch"]),
                 _pct(lg["direction_ceiling"]), PAPER["large_direction"],
                 _pct(lg["coverage"]), f"{lg['mean_units']:.0f}"])
  lines.append(results.markdown_table(
      ["family", "error of C'", "error of C' − M̂'", "ratio (means)", "ratio (median pair)",
       "paper", "direction right, C' − M̂'", "direction right, C'", "paper",
       f"{_pct(cfg.confidence)} interval holds J'", "units per cell"], rows))
  lines += ["", "## 2. Small differences during adaptation", "",
            f"Checkpoint trained on {ADAPT_SOURCE}; arm 1 adapted to {ADAPT_TARGET}, arm 0 "
            f"continued on {ADAPT_SOURCE}, {cfg.adapt_steps} Adam steps of "
            f"{cfg.adapt_learning_rate}, evaluated every "
            f"{cfg.eval_every}. D = J_{ADAPT_TARGET}(adapted) − J_{ADAPT_SOURCE}(continued). "
            f"Budget per arm, instance and step: {sc.budget} units (one unit = one sampled "
            f"transition or one policy query) for each estimator; rollouts of H = {sc.horizon} "
            f"steps; mismatch side N = {sc.num_action_samples} actions per visited state "
            f"(`{sc.estimator}`); {sc.num_seeds} seeds. Two frequency estimators: rollouts of "
            "the regularized return (unbiased for J) and success counts (the plain discounted "
            "reward, unbiased for the plain value, not for J). Errors are against the exact D "
            "at every evaluated step and seed.", ""]
  rows = []
  names = {"mismatch": "C − M̂ (mismatch)", "rollout": "rollouts, regularized return",
           "success": "rollouts, success counts"}
  for f, r in fams.items():
    s = r["small"]
    b = s["budget"]
    for name in ("mismatch", "rollout", "success"):
      e = s[name]
      n_roll = b["num_mismatch_rollouts"] if name == "mismatch" else b["num_return_rollouts"]
      units = b["mismatch_units"] if name == "mismatch" else b["return_units"]
      ratio = ("1" if name == "mismatch" else
               f"{s['rmse_ratio' if name == 'rollout' else 'rmse_ratio_success']:.1f}×")
      rows.append([f, names[name], f"{n_roll} × {units // max(n_roll, 1)}", f"{e['rmse']:.4f}",
                   ratio, PAPER["small_error_ratio"] if name != "mismatch" else "—",
                   f"{e['bias']:+.4f}", f"{e['overestimate']:+.4f}", _pct(e["coverage"])])
  lines.append(results.markdown_table(
      ["family", "estimator", "rollouts × units", "RMSE of D̂", "RMSE / RMSE(C − M̂)", "paper",
       "bias", "mean |D̂| − |D|", "interval holds D"], rows))
  lines += ["", "Reversal calls (training step of the first call, per seed). True reversal: "
            "the first evaluated step with exact D > 0.", ""]
  rows = []
  for f, r in fams.items():
    s = r["small"]
    t = s["true_step"]
    for name in ("mismatch", "rollout", "success"):
      rows.append([f, "none" if t < 0 else str(t), names[name], _call(s[name]["point"], t),
                   _call(s[name]["interval"], t),
                   PAPER["small_call"] if name != "mismatch" else "—"])
  lines.append(results.markdown_table(
      ["family", "true reversal step", "estimator", "point rule (D̂ > 0)",
       "interval rule (lower end > 0)", "paper"], rows))
  return "\n".join(lines) + "\n"


def metrics(result: dict) -> dict:
  """The JSON metrics (arrays as lists)."""
  return results.to_json(result)


def plot(result: dict, path: str) -> None:
  """Both estimates of D with their intervals (seed 0) and the exact curve, per family."""
  import matplotlib  # noqa: PLC0415  (plots are the scripts' dependency, not the library's)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fams = result["families"]
  fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 4.8), squeeze=False)
  for ax, (f, r) in zip(axes[0], fams.items()):
    s = r["small"]
    steps, e = np.asarray(s["steps"]), s["estimates"]
    width = float(np.diff(steps[:2]).sum()) or 1.0
    for name, color, dx, label in (("mismatch", "C0", -0.2, "C − M̂"),
                                   ("rollout", "C1", 0.0, "rollouts, regularized"),
                                   ("success", "C2", 0.2, "rollouts, success counts")):
      v, lo, hi = (np.asarray(e[k])[0] for k in (name, f"{name}_low", f"{name}_high"))
      ax.errorbar(steps + dx * width, v, yerr=[v - lo, hi - v], fmt="o", color=color, ms=3,
                  capsize=2, label=f"{label} (seed 0, bootstrap interval)")
      ax.plot(steps, np.mean(np.asarray(e[name]), 0), color=color, lw=0.8, ls=":",
              label=f"{label}: mean over {np.asarray(e[name]).shape[0]} seeds")
    ax.plot(steps, s["exact"], "k-", lw=1.5, label="exact D")
    ax.plot(steps, s["exact_plain"], "k--", lw=0.8, label="exact plain-value difference")
    ax.axhline(0.0, color="grey", lw=0.5)
    if s["true_step"] >= 0:
      ax.axvline(s["true_step"], color="k", lw=0.5, ls="--")
    ax.set_title(f"{f}: J_{ADAPT_TARGET}(adapted) − J_{ADAPT_SOURCE}(continued)", fontsize=9)
    ax.set_xlabel("adaptation step")
    ax.set_ylabel("D")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
  fig.tight_layout(rect=(0, 0.14, 1, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


