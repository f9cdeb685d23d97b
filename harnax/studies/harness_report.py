"""C, M, J, T per harness of the checkbox family: exact values beside deployment estimates.

For the harness family of the config: trains a log-linear text policy on every harness by
exact policy gradient (`harnax.train.fit_log_linear`), deploys the configured one on all
harnesses, and reports

* per harness: ceiling C, exact mismatch M and return J (J = C - M), sampled mismatch
  estimates M_hat with bootstrap intervals (geometric stopping + N action samples per
  state), the predicted return C - M_hat, and the frequency-rollout return J_hat with its
  interval, at the stated budgets;
* every ordered swap: delta C, T = delta C + M_H(pi), the frozen return change, the
  adapted mismatch and the realized gain.

`scripts/harness_report.py` runs it from `configs/harness_report.py`.
"""

from __future__ import annotations

import jax

import harnax as hx
from harnax import estimate as he
from harnax import harness as hh
from harnax import policies
from harnax import train
from harnax.envs import checkbox
from harnax.studies import results

FAMILIES = ("checkbox",)


def _harnesses(cfg):
  if cfg.family not in FAMILIES:
    raise ValueError(f"family: expected one of {FAMILIES}, got {cfg.family!r}")
  return checkbox.checkbox_harnesses(targets=tuple(cfg.targets), discount=cfg.discount)


def _train(cfg, harnesses, features):
  fit = lambda h, f, theta=None: train.fit_log_linear(  # noqa: E731
      h, f, cfg.tau, theta=theta, num_steps=cfg.train.steps,
      learning_rate=cfg.train.learning_rate).params
  theta = {k: fit(h, features[k]) for k, h in harnesses.items()}
  adapted = {}
  if cfg.adapt:
    adapted = {(i, j): fit(harnesses[j], features[j], theta[i])
               for i in harnesses for j in harnesses if i != j}
  return theta, adapted


def _estimates(cfg, key, harness, policy, solution):
  e = cfg.estimate
  out = {}
  for name in e.estimators:
    key, sub = jax.random.split(key)
    m = he.estimate_mismatch(sub, harness.mdp, policy, solution.policy, cfg.tau,
                             num_states=e.num_states, num_action_samples=e.num_action_samples,
                             estimator=name, confidence=e.confidence,
                             num_resamples=e.num_resamples)
    out[name] = m
  key, sub = jax.random.split(key)
  rollout = he.rollout_return(sub, harness.mdp, policy, harness.pi_ref, cfg.tau,
                              num_rollouts=e.num_rollouts, horizon=e.horizon,
                              confidence=e.confidence, num_resamples=e.num_resamples)
  return out, rollout


def run(cfg, *, log: results.Log | None = None) -> dict:
  """Trains, deploys and estimates; returns `{"names", "rows", "swaps"}`.

  `log`, when given, receives a line per stage.
  """
  log = log or (lambda _: None)
  if cfg.policy not in ("H0", "H1", "H2"):
    raise ValueError(f"policy: expected a harness name H0/H1/H2, got {cfg.policy!r}")
  harnesses = _harnesses(cfg)
  names = list(harnesses)
  features = {k: checkbox.checkbox_features(h) for k, h in harnesses.items()}
  theta, adapted = _train(cfg, harnesses, features)
  log(f"trained a model on each of {names} ({cfg.train.steps} exact policy-gradient steps)")
  read = lambda th, j: policies.harness_semantic_policy(th, features[j], harnesses[j])  # noqa: E731

  key = jax.random.key(cfg.seed)
  rows = []
  for j in names:
    h = harnesses[j]
    policy = read(theta[cfg.policy], j)
    sol = hx.solve_soft_bellman(h.mdp, h.pi_ref, cfg.tau, tol=1e-10)
    c = float(hx.ceiling(h.mdp, h.pi_ref, cfg.tau, solution=sol))
    m = float(hx.mismatch(h.mdp, policy, h.pi_ref, cfg.tau, solution=sol))
    jv = float(hx.regularized_return(h.mdp, policy, h.pi_ref, cfg.tau))
    key, sub = jax.random.split(key)
    ests, roll = _estimates(cfg, sub, h, policy, sol)
    rows.append(dict(
        harness=j, C=c, M=m, J=jv,
        M_hat={k: dict(value=float(v.value), ci=[float(v.ci_low), float(v.ci_high)],
                       budget=int(v.env_steps) + int(v.action_samples))
               for k, v in ests.items()},
        J_rollout=dict(value=float(roll.value), ci=[float(roll.ci_low), float(roll.ci_high)],
                       truncation_bias=float(roll.truncation_bias),
                       budget=int(roll.env_steps) + int(roll.action_samples))))
    log(f"deployed on {j}: exact C, M, J and the sampled estimates")

  own = [read(theta[i], i) for i in names]
  frozen = [[read(theta[i], j) for j in names] for i in names]
  adapted_pol = None
  if cfg.adapt:
    adapted_pol = [[None if i == j else read(adapted[i, j], j) for j in names] for i in names]
  swaps = hh.swap_analysis([harnesses[k] for k in names], own, frozen, adapted_pol,
                           tau=cfg.tau, tol=1e-10)
  return dict(names=names, rows=rows, swaps=swaps)


def metrics(result) -> dict:
  """The JSON metrics: the per-harness rows and every swap quantity."""
  return dict(rows=result["rows"], swaps=result["swaps"].pairs._asdict())


def render(cfg, result) -> str:
  """The markdown report."""
  e = cfg.estimate
  lines = [f"# Harness report: {cfg.family}, targets {tuple(cfg.targets)}, "
           f"gamma={cfg.discount}, tau={cfg.tau}", "",
           f"Model trained on {cfg.policy} by exact policy gradient ({cfg.train.steps} steps), "
           "deployed on every harness. Exact C, M, J (J = C - M) beside estimates from "
           f"{e.num_states} states x {e.num_action_samples} actions (mismatch) and "
           f"{e.num_rollouts} rollouts of {e.horizon} steps (frequency rollout); "
           f"{int(100 * e.confidence)}% bootstrap intervals; budget = environment steps + "
           "action samples.", ""]
  head = "| harness | C | M | J |"
  sep = "|---|---|---|---|"
  for name in e.estimators:
    head += f" M_hat ({name}) [CI] | C - M_hat ({name}) |"
    sep += "---|---|"
  head += " J_hat (rollouts) [CI] | budgets (mismatch / rollouts) |"
  sep += "---|---|"
  lines += [head, sep]
  for r in result["rows"]:
    line = f"| {r['harness']} | {r['C']:.4f} | {r['M']:.4f} | {r['J']:.4f} |"
    for name in e.estimators:
      mh = r["M_hat"][name]
      line += (f" {mh['value']:.4f} [{mh['ci'][0]:.4f}, {mh['ci'][1]:.4f}] |"
               f" {r['C'] - mh['value']:.4f} |")
    jr = r["J_rollout"]
    first = r["M_hat"][e.estimators[0]]
    line += (f" {jr['value']:.4f} [{jr['ci'][0]:.4f}, {jr['ci'][1]:.4f}] |"
             f" {first['budget']} / {jr['budget']} |")
    lines.append(line)
  lines += ["", "## Swaps", "", "Entry H -> H': the model trained on H deployed on H'. "
            "T = delta C + M_H(pi); the adapted model beats the original pair iff "
            "M_H'(pi_adapted) < T.", "", hh.swap_table(result["swaps"], result["names"])]
  return "\n".join(lines) + "\n"
