"""The tabular MiniWoB++ study: C, M and J across H0–H5, and the nine swaps.

For one family: task instances split into train and held-out sets, each
compiled under every harness; a log-linear text policy (`harnax.policies.log_linear`
over `harnax.envs.miniwob.features`) trained by
exact policy gradient on the training instances of each harness (one weight
vector per harness, shared by all instances), then read through every
harness on the held-out instances ("frozen") and adapted to the harness it is
swapped to. Everything is exact: `C` by the soft-Bellman solver, `J` by policy
evaluation, `M` by its own formula (docs/theory.md), so `J = C - M` is a
check. Training is `harnax.train.fit` (Adam on the exact gradient).

Instances of different sizes are padded to one shape and vmapped: padded
states are unreachable absorbing states whose only action is `wait`, padded
actions are unavailable (`pi_ref = 0`), padded outputs get probability 0.
None of them changes `C`, `J` or `M` of the real instance.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import evaluation
from harnax.core import mdp as mdp_lib
from harnax.core import objectives
from harnax.core import solvers
from harnax.envs.miniwob import features as features_lib
from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.harness import interface
from harnax.studies import families
from harnax.studies import transfer_metrics

Log = Callable[[str], None]
PI_REFS = ("uniform", "base")

Array = jax.Array


class PaddedBatch(NamedTuple):
  """Compiled harnesses of several instances padded to one shape (all arrays).

  Attributes:
    mdp: `TabularMDP` with leaves `[N, S, A, S]`, `[N, S, A]`, `[N]`, `[N, S]`.
    pi_ref: `[N, S, A]`.
    decode_table: int32 `[N, S, O]`.
    output_mask: bool `[N, O]`.
    inputs: the policy family's inputs (`harnax.studies.families`): text features
      `[N, S, O, D]` for the log-linear model, `CandidateTokens` `[N, S]` for an LM.
  """

  mdp: mdp_lib.TabularMDP
  pi_ref: Array
  decode_table: Array
  output_mask: Array
  inputs: Any


def batch_shape(compiled: Sequence[harnesses_lib.CompiledHarness]) -> tuple[int, int, int]:
  """`(S, A, O)`: the largest state, action and output counts."""
  return (max(c.harness.num_states for c in compiled),
          max(c.harness.num_actions for c in compiled),
          max(c.harness.num_outputs for c in compiled))


def pad_batch(compiled: Sequence[harnesses_lib.CompiledHarness], shape=None,
              dtype=None, *, policy: families.PolicyFamily | None = None) -> PaddedBatch:
  """Stacks compiled harnesses, padded to `shape = (S, A, O)` (default: the largest), with
  the inputs of `policy` (default: the log-linear family's text features)."""
  s_max, a_max, o_max = shape if shape is not None else batch_shape(compiled)
  dtype = jax.dtypes.canonicalize_dtype(dtype if dtype is not None else jnp.float64)
  mdps, refs, tables, masks = [], [], [], []
  for c in compiled:
    h = c.harness
    s, a, o = h.num_states, h.num_actions, h.num_outputs
    if s > s_max or a > a_max or o > o_max:
      raise ValueError(f"shape: expected at least ({s}, {a}, {o}) for {c!r}, got "
                       f"{(s_max, a_max, o_max)}")
    p = np.zeros((s_max, a_max, s_max))
    p[np.arange(s_max), :, np.arange(s_max)] = 1.0  # padding: self-loops
    p[:s, :a, :] = 0.0
    p[:s, :a, :s] = np.asarray(h.mdp.transitions)
    r = np.zeros((s_max, a_max))
    r[:s, :a] = np.asarray(h.mdp.rewards)
    mu0 = np.zeros(s_max)
    mu0[:s] = np.asarray(h.mdp.initial)
    ref = np.zeros((s_max, a_max))
    ref[:s, :a] = np.asarray(h.pi_ref)
    ref[s:, harnesses_lib.WAIT] = 1.0
    table = np.full((s_max, o_max), interface.INVALID, np.int32)
    table[:s, :o] = np.asarray(h.decode_table)
    mask = np.arange(o_max) < o
    mdps.append(mdp_lib.TabularMDP(transitions=p.astype(dtype), rewards=r.astype(dtype),
                                   discount=np.asarray(h.mdp.discount, dtype),
                                   initial=mu0.astype(dtype)))
    refs.append(ref.astype(dtype))
    tables.append(table)
    masks.append(mask)
  policy = policy if policy is not None else families.LogLinearFamily()
  inputs = policy.inputs(compiled, (s_max, a_max, o_max))
  if not isinstance(policy, families.LMFamily):
    inputs = jax.tree.map(lambda x: x.astype(dtype), inputs)
  return PaddedBatch(mdp=mdp_lib.stack(mdps), pi_ref=jnp.asarray(np.stack(refs)),
                     decode_table=jnp.asarray(np.stack(tables)),
                     output_mask=jnp.asarray(np.stack(masks)), inputs=inputs)


def semantic_policy(theta: Array, batch: PaddedBatch) -> Array:
  """`Pi_H(a | s)` of the log-linear model on every instance, `[N, S, A]` (invalid -> wait)."""
  return families.LogLinearFamily().semantic_policy(theta, batch)


class Scores(NamedTuple):
  """Per-instance exact quantities, each `[N]`."""

  ceiling: Array
  value: Array
  mismatch: Array


@jax.jit
def _evaluate(policy, mdp, pi_ref, tau):
  def one(m, pol, ref):
    c = objectives.ceiling(m, ref, tau)
    j = evaluation.evaluate_policy(m, pol, ref, tau).value
    mm = objectives.mismatch(m, pol, ref, tau)
    return c, j, mm
  return Scores(*jax.vmap(one)(mdp, policy, pi_ref))


def evaluate(policy: Array, batch: PaddedBatch, tau: float) -> Scores:
  """`C`, `J` and `M` of a semantic policy `[N, S, A]` on every instance."""
  return _evaluate(policy, batch.mdp, batch.pi_ref, jnp.asarray(tau, batch.pi_ref.dtype))


def evaluate_model(theta: Array, batch: PaddedBatch, tau: float) -> Scores:
  """`C`, `J` and `M` of the text model `theta` on every instance."""
  return evaluate(semantic_policy(theta, batch), batch, tau)


def success_rate(policy: Array, batch: PaddedBatch, horizon: int = 20) -> Array:
  """Probability of finishing successfully (raw reward 1) within `horizon` steps, `[N]`.

  The harness-transfer study's success rate; `horizon` matches the gymnasium environments'
  truncation. Exact (propagates the state distribution), nothing sampled.
  """
  if not isinstance(horizon, (int, np.integer)) or horizon < 1:
    raise ValueError(f"horizon: expected a positive int, got {horizon!r}")
  return families.success_within(policy, batch.mdp, int(horizon))


def train(batch: PaddedBatch, *, tau: float, steps: int = 200, learning_rate: float = 0.1,
          theta: Array | None = None) -> tuple[Array, Array]:
  """Exact policy-gradient ascent (Adam) on the mean `J` over the batch.

  Gradients are exact (autodiff through the policy evaluation's linear
  solve); nothing is sampled.

  Args:
    batch: a `PaddedBatch` of training instances.
    tau: temperature > 0.
    steps: optimizer steps.
    learning_rate: Adam step size.
    theta: initial weights `[D]` (zeros if None), e.g. a model to adapt.

  Returns:
    `(theta [D], mean J before each step [steps])`.
  """
  if not isinstance(steps, (int, np.integer)) or steps < 0:
    raise ValueError(f"steps: expected a non-negative int, got {steps!r}")
  if not float(tau) > 0:
    raise ValueError(f"tau: expected a positive float, got {tau!r}")
  dtype = batch.pi_ref.dtype
  theta = (jnp.zeros(features_lib.NUM_FEATURES, dtype) if theta is None
           else jnp.asarray(theta, dtype))
  params, values = families.LogLinearFamily(float(learning_rate)).train(
      theta, batch, tau=tau, steps=int(steps))
  return params, jnp.asarray(values)


@dataclasses.dataclass
class FamilyStudy:
  """Results of `run_family` (means over held-out instances unless noted).

  Attributes:
    family: the family name.
    harnesses: harness names, in order (`n` of them).
    swaps: the `(source, target)` harness pairs adapted along.
    ceiling: `[n]`, mean `C` per harness.
    reference: `Scores` of the reference policy per harness (`[n]` each).
    frozen: `Scores` of the model trained on harness i read through harness j
      (`[n, n]` each; the diagonal is the model on its own harness).
    adapted: `{(i, j): Scores}` of model i adapted to harness j (scalars).
    continued: `{i: Scores}` of model i trained `adapt_steps` more on its own harness i
      (the control of a swap i -> j at the same budget).
    base: `Scores` of the initial (pre-trained) model per harness (`[n]` each).
    policy: the policy family's name; pi_ref: `"uniform"` or `"base"`.
    train_curves: `{i: [steps]}` mean training `J` of model i.
    optimal_decisions_unchanged: True when the field-reversed harnesses have
      the same optimal decisions as the originals on every held-out instance.
    decision_flips: `[n]`, fraction of non-terminal states whose most probable
      output of the model trained on harness i changes when its fields are
      reversed.
    reversed_frozen: `Scores` of model i on harness i with reversed fields.
    success: success rates within `horizon` steps (`success_rate`):
      `"optimal"` `[n]` (the soft optimum pi*), `"reference"` `[n]`,
      `"frozen"` `[n, n]` (model i on harness j), `"reversed"` `[n]`, `"base"` `[n]`
      (the initial model), `"adapted"` `{(i, j): rate}`, `"continued"` `{i: rate}`.
    optimal_return: `[n]`, pi*'s expected discounted raw reward (no KL term).
    num_train, num_test: instance counts.
    selection: how `swaps` were chosen: `"select"` (the paper's rule on the frozen
      matrix, `transfer_metrics.select_swaps`) or `"given"` (an explicit list).
    max_swaps: the cap on the selected swaps (None: no cap).
    errors: `[n, n]`, the centred score error (`families.score_error_rms`, occupancy-
      weighted RMS against pi*) of model i read through harness j, mean over instances.
    base_errors: `[n]`, the same of the initial (pre-trained) model on each harness.
    adapted_errors: `{(i, j): error}` of model i adapted to harness j, on harness j.
    decompositions: `{(i, j): summary}` for every adapted swap i -> j: the three-way
      decomposition of model i's score error on harness j (`transfer_metrics.
      decomposition_summary`, weighted by its occupancy on j).
    reversal_decompositions: `[n]` summaries of model i on harness i with reversed fields.
    plain_return: the expected discounted raw reward (no KL term): `"frozen"` `[n, n]`
      (model i on harness j) and `"base"` `[n]`.
  """

  family: str
  harnesses: tuple[str, ...]
  swaps: tuple[tuple[str, str], ...]
  ceiling: np.ndarray
  reference: Scores
  frozen: Scores
  adapted: dict
  continued: dict
  base: Scores
  policy: str
  pi_ref: str
  train_curves: dict
  optimal_decisions_unchanged: bool
  decision_flips: np.ndarray
  reversed_frozen: Scores
  success: dict
  optimal_return: np.ndarray
  num_train: int
  num_test: int
  selection: str = "given"
  max_swaps: int | None = None
  errors: np.ndarray | None = None
  base_errors: np.ndarray | None = None
  adapted_errors: dict = dataclasses.field(default_factory=dict)
  decompositions: dict = dataclasses.field(default_factory=dict)
  reversal_decompositions: list = dataclasses.field(default_factory=list)
  plain_return: dict = dataclasses.field(default_factory=dict)


def _mean(scores: Scores) -> Scores:
  return Scores(*(float(np.mean(np.asarray(x))) for x in scores))


def run_family(family: str, train_tasks, test_tasks, *, tau: float = 0.1,
               discount: float = 0.9, steps: int = 200, adapt_steps: int = 100,
               learning_rate: float = 0.1, harnesses: Sequence[str] = harnesses_lib.HARNESSES,
               swaps: Sequence[tuple[str, str]] | str = harnesses_lib.SWAPS,
               max_swaps: int | None = None,
               policy: families.PolicyFamily | None = None, pi_ref: str = "uniform",
               controls: Sequence[str] | None = None, log: Log | None = None) -> FamilyStudy:
  """Trains one model per harness and measures every harness and swap (module doc).

  Args:
    family: the task family's name (for the log and the result).
    train_tasks, test_tasks: training and held-out task instances.
    tau, discount: temperature and discount of every compiled MDP.
    steps, adapt_steps: exact-gradient steps per harness, and to adapt along a swap (also
      the budget of the continued-training control).
    learning_rate: the log-linear family's step size (when `policy` is None).
    harnesses: which harnesses.
    swaps: the ordered pairs to adapt along, or `"select"`: the paper's rule, every pair
      the frozen comparison rejects while `T > 0` (`transfer_metrics.select_swaps`, on the
      held-out frozen matrix).
    max_swaps: at most this many swaps (selected: those with the largest `T`; given: the
      first ones); None: all. A cap for cheap configs.
    policy: a `harnax.studies.families.PolicyFamily` (default: the log-linear model).
    pi_ref: the KL reference of every objective: `"uniform"` over the available actions,
      or `"base"`, the initial (pre-trained) model's own semantic policy under each harness.
    controls: the source harnesses whose swaps get the continued-training control (the
      source model trained `adapt_steps` more on its own harness); None: every source.
    log: receives one line per stage (progress of a run that takes minutes).
  """
  log = log or (lambda _: None)
  if pi_ref not in PI_REFS:
    raise ValueError(f"pi_ref: expected one of {PI_REFS}, got {pi_ref!r}")
  policy = policy if policy is not None else families.LogLinearFamily(learning_rate)
  names = tuple(harnesses)
  select = isinstance(swaps, str)
  if select and swaps != "select":
    raise ValueError(f"swaps: expected 'select' or a sequence of (source, target) pairs, got "
                     f"{swaps!r}")
  for a, b in (() if select else swaps):
    if a not in names or b not in names:
      raise ValueError(f"swaps: ({a!r}, {b!r}) names a harness not in {names}")
  if max_swaps is not None and (not isinstance(max_swaps, (int, np.integer)) or max_swaps < 0):
    raise ValueError(f"max_swaps: expected None or a non-negative int, got {max_swaps!r}")

  def compiled(tasks, reverse=False):
    return {h: [harnesses_lib.compile_harness(t, h, discount=discount, reverse_fields=reverse)
                for t in tasks] for h in names}

  train_c, test_c, test_r = compiled(train_tasks), compiled(test_tasks), compiled(test_tasks,
                                                                                  True)
  # One padded shape per family: one compile for every harness and split.
  shape = tuple(max(x) for x in zip(*(batch_shape(cs) for d in (train_c, test_c)
                                      for cs in d.values())))
  policy.prepare([c for d in (train_c, test_c, test_r) for cs in d.values() for c in cs])
  base = policy.initial_params()

  def batch(cs):
    b = pad_batch(cs, shape, policy=policy)
    if pi_ref == "base":  # the base model's own semantic policy: positive wherever available
      b = b._replace(pi_ref=policy.semantic_policy(base, b))
    return b

  train_b = {h: batch(train_c[h]) for h in names}
  test_b = {h: batch(test_c[h]) for h in names}
  test_rb = {h: batch(test_r[h]) for h in names}

  log(f"{family}: compiled {len(train_tasks)} + {len(test_tasks)} instances x {len(names)} "
      f"harnesses, padded to (S, A, O) = {shape}; policy {policy.name}, pi_ref {pi_ref}")
  thetas, curves = {}, {}
  for h in names:
    thetas[h], curves[h] = policy.train(base, train_b[h], tau=tau, steps=steps, name=h, log=log)
    log(f"{family}: trained on {h} ({steps} steps), mean J {float(curves[h][-1]):+.3f}")
  n = len(names)

  def stack(cells):
    return Scores(*(np.array([[getattr(c, f) for c in row] for row in cells])
                    for f in Scores._fields))

  def rate(pol, b):
    return float(np.mean(np.asarray(success_rate(pol, b))))

  def read(params, b):
    """`(log Pi, Pi)`, `[N, S, A]` each, from one pass of the model."""
    log_pol = transfer_metrics.semantic_log_policy(policy, params, b)
    return log_pol, jnp.exp(log_pol)

  solve = jax.vmap(lambda m, r: solvers.solve_soft_bellman(m, r, tau))
  sol = {h: solve(test_b[h].mdp, test_b[h].pi_ref) for h in names}
  sol_r = {h: solve(test_rb[h].mdp, test_rb[h].pi_ref) for h in names}

  def errors(log_pol, h):
    b = test_b[h]
    return float(np.mean(np.asarray(transfer_metrics.score_errors(
        b.mdp, log_pol, b.pi_ref, sol[h].policy, jnp.asarray(tau, b.pi_ref.dtype)))))

  # Each semantic policy is built once and both evaluated and rolled forward.
  frozen_log = [[read(thetas[hi], test_b[hj]) for hj in names] for hi in names]
  frozen_pol = [[p for _, p in row] for row in frozen_log]
  frozen = stack([[_mean(evaluate(frozen_pol[i][j], test_b[hj], tau))
                   for j, hj in enumerate(names)] for i in range(n)])
  error_matrix = np.array([[errors(frozen_log[i][j][0], hj) for j, hj in enumerate(names)]
                           for i in range(n)])
  reference = stack([[_mean(evaluate(test_b[h].pi_ref, test_b[h], tau)) for h in names]])
  reference = Scores(*(x[0] for x in reference))
  base_log = {h: read(base, test_b[h]) for h in names}
  base_scores = stack([[_mean(evaluate(base_log[h][1], test_b[h], tau)) for h in names]])
  base_scores = Scores(*(x[0] for x in base_scores))
  base_errors = np.array([errors(base_log[h][0], h) for h in names])
  if select:
    swaps = transfer_metrics.select_swaps(np.diagonal(frozen.ceiling),
                                          np.diagonal(frozen.mismatch), frozen.value, names,
                                          max_swaps=max_swaps)
    log(f"{family}: adapting along {len(swaps)} swaps the frozen comparison rejects with "
        f"T > 0" + (f" (at most {max_swaps}, largest T)" if max_swaps is not None else ""))
  elif max_swaps is not None:
    swaps = tuple(swaps)[:max_swaps]
  adapted, continued, continued_params = {}, {}, {}
  adapted_pol, adapted_errors, decompositions = {}, {}, {}
  for a, b in swaps:
    i, j = names.index(a), names.index(b)
    th, _ = policy.train(thetas[a], train_b[b], tau=tau, steps=adapt_steps, name=f"{a}->{b}")
    log_pol, adapted_pol[(i, j)] = read(th, test_b[b])
    adapted[(i, j)] = _mean(evaluate(adapted_pol[(i, j)], test_b[b], tau))
    adapted_errors[(i, j)] = errors(log_pol, b)
    decompositions[(i, j)] = _decomposition(
        test_b[a], test_b[b], sol[a], sol[b], frozen_log[i][i][0], frozen_log[i][j][0],
        [transfer_metrics.action_map(ca.harness.action_names, cb.harness.action_names,
                                     shape[1]) for ca, cb in zip(test_c[a], test_c[b])], tau)
    log(f"{family}: adapted {a} -> {b} ({adapt_steps} steps)")
    if i not in continued and (controls is None or a in controls):
      # The control at the same budget: the source model trained further on its own harness.
      th, _ = policy.train(thetas[a], train_b[a], tau=tau, steps=adapt_steps, name=f"{a}+")
      continued_params[i] = th
      continued[i] = _mean(evaluate(policy.semantic_policy(th, test_b[a]), test_b[a], tau))
  reversed_log = [read(thetas[h], test_rb[h]) for h in names]
  reversed_pol = [p for _, p in reversed_log]
  identity = np.arange(shape[1], dtype=np.int32)
  reversal_decompositions = [
      _decomposition(test_b[h], test_rb[h], sol[h], sol_r[h], frozen_log[i][i][0],
                     reversed_log[i][0], [identity] * len(test_tasks), tau)
      for i, h in enumerate(names)]
  reversed_frozen = stack([[_mean(evaluate(pol, test_rb[h], tau))
                            for pol, h in zip(reversed_pol, names)]])
  reversed_frozen = Scores(*(x[0] for x in reversed_frozen))

  # Success within the episode cap, and pi*'s plain (KL-free) return.
  success = {
      "frozen": np.array([[rate(frozen_pol[i][j], test_b[hj]) for j, hj in enumerate(names)]
                          for i in range(n)]),
      "reference": np.array([rate(test_b[h].pi_ref, test_b[h]) for h in names]),
      "base": np.array([rate(base_log[h][1], test_b[h]) for h in names]),
      "continued": {i: rate(policy.semantic_policy(th, test_b[names[i]]), test_b[names[i]])
                    for i, th in continued_params.items()},
      "adapted": {k: rate(pol, test_b[names[k[1]]]) for k, pol in adapted_pol.items()},
      "reversed": np.array([rate(pol, test_rb[h]) for pol, h in zip(reversed_pol, names)])}
  def plain(pol, b):  # with pi_ref = pi the KL term vanishes: the plain discounted return
    return float(np.mean(np.asarray(_plain_return(b.mdp, pol, jnp.asarray(tau,
                                                                          pol.dtype)))))

  plain_return = {"frozen": np.array([[plain(frozen_pol[i][j], test_b[hj])
                                       for j, hj in enumerate(names)] for i in range(n)]),
                  "base": np.array([plain(base_log[h][1], test_b[h]) for h in names])}
  optimal, optimal_return = [], []
  unchanged, flips = True, []
  for h in names:
    b = test_b[h]
    pol = sol[h].policy
    optimal.append(rate(pol, b))
    # With pi_ref = pi the KL term vanishes: this is the plain discounted return.
    optimal_return.append(float(np.mean(np.asarray(jax.vmap(
        lambda m, p: evaluation.evaluate_policy(m, p, p, tau).value)(b.mdp, pol)))))
    # Field reversal: the optimum's decisions stay, the model's top output moves.
    unchanged &= bool(np.array_equal(np.argmax(np.asarray(pol), -1),
                                     np.argmax(np.asarray(sol_r[h].policy), -1)))
    top, top_r = (np.argmax(np.asarray(policy.output_log_probs(thetas[h], x)), -1)
                  for x in (b, test_rb[h]))
    live = np.array([[st < c.done_state for st in range(shape[0])] for c in test_c[h]])
    flips.append(float(np.sum((top != top_r) & live) / np.sum(live)))
  success["optimal"] = np.array(optimal)

  return FamilyStudy(
      family=family, harnesses=names, swaps=tuple((a, b) for a, b in swaps),
      ceiling=reference.ceiling, reference=reference,
      frozen=frozen, adapted=adapted, continued=continued, base=base_scores,
      policy=policy.name, pi_ref=pi_ref, train_curves={h: np.asarray(c) for h, c in curves.items()},
      optimal_decisions_unchanged=unchanged, decision_flips=np.array(flips),
      reversed_frozen=reversed_frozen, success=success, optimal_return=np.array(optimal_return),
      num_train=len(train_tasks), num_test=len(test_tasks),
      selection="select" if select else "given", max_swaps=max_swaps, errors=error_matrix,
      base_errors=base_errors, adapted_errors=adapted_errors, decompositions=decompositions,
      reversal_decompositions=reversal_decompositions, plain_return=plain_return)


@jax.jit
def _plain_return(mdp, policy, tau):
  return jax.vmap(lambda m, p: evaluation.evaluate_policy(m, p, p, tau).value)(mdp, policy)


def _decomposition(source, target, source_solution, target_solution, source_log_policy,
                   target_log_policy, action_maps, tau) -> dict:
  """The three-way split of one checkpoint's score error on `target` (module doc), summarized
  by RMS norms weighted by the checkpoint's occupancy on `target`; also the occupancy mass
  on the states with a counterpart and at least two common actions (`coverage`)."""
  dec = transfer_metrics.batch_decomposition(
      source_solution.scores, target_solution.scores, source_log_policy, target_log_policy,
      source.pi_ref, target.pi_ref, np.stack(action_maps), tau)
  weights = transfer_metrics.occupancies(target.mdp, jnp.exp(target_log_policy))
  out = transfer_metrics.decomposition_summary(dec, weights)
  live = np.sum(np.asarray(dec.common), -1) >= 2
  out["coverage"] = float(np.mean(np.sum(np.where(live, np.asarray(weights), 0.0), -1)))
  return out


def swap_rows(study: FamilyStudy, swaps: Sequence[tuple[str, str]] | None = None
              ) -> list[dict]:
  """The swap quantities of the harness layer (docs/harness.md) per swap H -> H'.

  `T = ΔC + M_H(pi)`; the frozen change is `J_H'(pi read through H') - J_H(pi)`;
  the realized gain is `J_H'(pi adapted) - J_H(pi)`, and `gain_vs_continued` is
  `J_H'(pi adapted) - J_H(pi trained as long on H)` (NaN without that control); `selected`:
  the paper's rule, frozen change < 0 and T > 0. `swaps` defaults to the study's own.
  """
  names = study.harnesses
  rows = []
  for a, b in (study.swaps if swaps is None else swaps):
    i, j = names.index(a), names.index(b)
    f = study.frozen
    dc = f.ceiling[j, j] - f.ceiling[i, i]
    t = dc + f.mismatch[i, i]
    ad = study.adapted.get((i, j))
    ctl = study.continued.get(i)
    frozen_change = f.value[i, j] - f.value[i, i]
    rows.append(dict(
        swap=f"{a} → {b}", delta_ceiling=dc, source_mismatch=f.mismatch[i, i], threshold=t,
        frozen_change=frozen_change, frozen_mismatch=f.mismatch[i, j],
        adapted_mismatch=ad.mismatch if ad else np.nan,
        realized_gain=(ad.value - f.value[i, i]) if ad else np.nan,
        gain_vs_continued=(ad.value - ctl.value) if ad and ctl else np.nan,
        selected=bool(frozen_change < 0 < t)))
  return rows


def all_pairs(study: FamilyStudy) -> tuple[tuple[str, str], ...]:
  """Every ordered pair of distinct harnesses of the study (30 for H0–H5)."""
  return tuple((a, b) for a in study.harnesses for b in study.harnesses if a != b)
