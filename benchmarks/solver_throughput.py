"""Throughput of harnax's soft-Bellman solvers, per problem class, against NumPy float64.

Run from the repository root with harnax installed (`pip install -e .`):

  python benchmarks/solver_throughput.py            # full run, about 5 minutes on 2 cores
  python benchmarks/solver_throughput.py --quick    # small sizes, a smoke test (< 1 minute)

Options: `--out PATH` (default `benchmarks/results/solver_throughput.md`), `--repeats N`.
NumPy uses whatever BLAS kernel it picks by itself: unset `OPENBLAS_CORETYPE` and
`OPENBLAS_L2_SIZE` in the shell if they are set for other reasons. One progress line per
measured row goes to stderr.

Two measurements, each a function returning plain numbers; `write_report` turns them into
markdown and is the only place that formats anything:

1. `measure_targets`: the default method on 128 dense MDPs (S=64, A=8, gamma=0.99, tau=0.1,
   rewards U(0, 1)) in float32 and float64 against a vectorized NumPy float64 value iteration
   with the same MacQueen stopping rule, every method at the default tolerance, at 1e-3, and
   at 1e-6 (below float32's floor there: what stopping at the floor costs).
2. `measure_classes`: every method on each problem class that `method="auto"` distinguishes
   (well-mixing dense at several gamma, near-deterministic dense, a deterministic cycle, a
   large sparse deterministic MDP), float32 at the default tolerance.

Timings: `jax.jit(...).lower(...).compile()` first (compile time listed separately), then the
median of `--repeats` runs with `block_until_ready`. Every solver, float32 or float64, gets the
same float32-representable problem (probabilities on a 2^-24 grid so rows sum to exactly 1,
float32 rewards and discount), so errors against the float64 reference measure the solver, not
input rounding.
"""

import argparse
import datetime
import logging
import os
import platform
import statistics
import sys
import time

import children  # benchmarks/children.py (this folder is on sys.path when run as a script)
import jax
import jax.numpy as jnp
import numpy as np

import harnax as hx

FULL = dict(batch=128, states=64, actions=8, sparse_states=10**5, sparse_actions=8, repeats=21)
QUICK = dict(batch=8, states=16, actions=4, sparse_states=2000, sparse_actions=4, repeats=3)
TAU = 0.1
# The tolerances: one float32 reaches, one at float64's usual level (below float32's
# floor when |V*| ~ 100).
TOL_REACHABLE = 1e-3
TOL_TIGHT = 1e-6
SOFT_METHODS = ("auto", "value_iteration", "anderson", "policy_iteration")


_START = time.perf_counter()


def log(msg):
  """One progress line on stderr (the report goes to a file)."""
  print(f"[{time.perf_counter() - _START:7.1f} s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Problems (NumPy, float32-exact, returned in float64)
# ---------------------------------------------------------------------------

def dense_problem(seed, batch, s, a, concentration=1.0):
  """Dirichlet(concentration) rows on the 2^-24 grid, rewards U(0, 1); both float32-exact.

  Probabilities are multiples of 2^-24 with the remainder on each row's largest entry, so
  every row sums to exactly 1 in float32 and float64 and `T(V + c) = T V + gamma c` holds
  exactly: MacQueen's bounds are then statements about the same problem in both precisions.
  """
  rng = np.random.default_rng(seed)
  if concentration == 1.0:
    p = rng.exponential(size=(batch, s, a, s))  # Dirichlet(1) = normalized exponentials
  else:
    p = rng.gamma(concentration, size=(batch, s, a, s))
    p[p.sum(-1) == 0, 0] = 1.0  # tiny concentrations can draw an all-zero row
  p /= p.sum(-1, keepdims=True)
  grid = 2.0**24
  q = np.floor(p * grid)
  top = q.argmax(-1)[..., None]
  np.put_along_axis(q, top, np.take_along_axis(q, top, -1) + (grid - q.sum(-1))[..., None], -1)
  r = np.asarray(rng.uniform(size=(batch, s, a)), np.float32).astype(np.float64)
  return q / grid, r


def cycle_problem(seed, batch, s, a):
  """Deterministic moves one step either way round a cycle (other actions: stay)."""
  rng = np.random.default_rng(seed)
  offsets = np.array([1, -1] + [0] * (a - 2))
  succ = (np.arange(s)[:, None] + offsets[None, :]) % s
  p = np.zeros((s, a, s))
  np.put_along_axis(p, succ[..., None], 1.0, axis=-1)
  r = np.asarray(rng.uniform(size=(batch, s, a)), np.float32).astype(np.float64)
  return np.broadcast_to(p, (batch, s, a, s)).copy(), r


def to_harnax(p, r, gamma, dtype):
  batch, s = r.shape[0], r.shape[1]
  return hx.TabularMDP(transitions=jnp.asarray(p, dtype), rewards=jnp.asarray(r, dtype),
                       discount=jnp.full(batch, gamma, dtype),
                       initial=jnp.full((batch, s), 1.0 / s, dtype))


# ---------------------------------------------------------------------------
# NumPy float64: baseline and reference
# ---------------------------------------------------------------------------

def np_soft_value(q, tau, log_ref):
  z = q / tau + log_ref
  m = z.max(-1)
  return tau * (m + np.log(np.exp(z - m[..., None]).sum(-1)))


def np_macqueen_vi(p2, r, gamma, tau, log_ref, tol, max_iters=100_000):
  """Batched relative value iteration with MacQueen's stop (the baseline).

  `p2` is `P` reshaped to `[B, S*A, S]`. Runs until every MDP's bound is `<= tol`;
  returns (certified midpoints `[B, S]`, sweeps executed).
  """
  b, s = r.shape[:2]
  g = gamma / (1.0 - gamma)
  h = np.zeros((b, s))
  v_out = np.zeros((b, s))
  active = np.ones(b, bool)
  k = 0
  while active.any() and k < max_iters:
    k += 1
    y = np_soft_value(r + gamma * np.matmul(p2, h[:, :, None])[..., 0].reshape(r.shape), tau,
                      log_ref)
    kappa = y.mean(1)
    delta = y - h - kappa[:, None]
    lo, hi = delta.min(1), delta.max(1)
    done = active & (g * (hi - lo) / 2.0 <= tol)
    v_out[done] = (y + ((gamma * kappa + gamma * (lo + hi) / 2.0) / (1.0 - gamma))[:, None])[done]
    active &= ~done
    h = y - kappa[:, None]
  return v_out, k


def np_soft_reference(p, r, gamma, tau, log_ref, steps=400):
  """Float64 soft policy iteration (exact evaluations), then Newton in correction form: `V*`.

  Returns `[B, S]`, at float64's rounding level (below the solvers' float64 floors).
  """
  b, s, a, _ = p.shape
  eye = np.eye(s)
  v = np.zeros((b, s))
  for _ in range(steps):
    q = r + gamma * np.einsum("bsat,bt->bsa", p, v)
    z = q / tau + log_ref
    log_pi = z - (z.max(-1, keepdims=True)
                  + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    pi = np.exp(log_pi)
    cost = (pi * (r - tau * (log_pi - log_ref))).sum(-1)
    p_pi = np.einsum("bsa,bsat->bst", pi, p)
    v_new = np.linalg.solve(eye - gamma * p_pi, cost[..., None])[..., 0]
    change = np.abs(v_new - v).max()
    v = v_new
    if change < 1e-9 * max(1.0, np.abs(v).max()):
      break
  # A direct solve for V carries cond * eps * |V| ~ 1e-11 of rounding; finish with Newton steps
  # in correction form, v += (I - gamma P_pi)^-1 (T v - v), whose rounding is relative to the
  # residual.
  for _ in range(3):
    q = r + gamma * np.einsum("bsat,bt->bsa", p, v)
    z = q / tau + log_ref
    pi = np.exp(z - z.max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    p_pi = np.einsum("bsa,bsat->bst", pi, p)
    residual = np_soft_value(q, tau, log_ref) - v
    v = v + np.linalg.solve(eye - gamma * p_pi, residual[..., None])[..., 0]
  return v


# ---------------------------------------------------------------------------
# harnax timing
# ---------------------------------------------------------------------------

def compile_and_time(fn, args, repeats):
  """AOT-compiles `jax.jit(fn)`; returns (output, compile s, median run s)."""
  t = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t
  out = jax.block_until_ready(compiled(*args))
  runs = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    runs.append(time.perf_counter() - t)
  return out, compile_s, statistics.median(runs)


def batched_solver(pi_ref, method, tol):
  return jax.vmap(lambda m: hx.solve_soft_bellman(m, pi_ref, TAU, method=method, tol=tol))


def summarize(sol, v_star, run, compile_s):
  """Plain numbers of one (batched) solve."""
  v = np.asarray(sol.v, np.float64)
  return dict(run=run, compile=compile_s, iters_max=int(np.max(sol.iterations)),
              iters_mean=float(np.mean(sol.iterations)),
              converged=float(np.mean(sol.converged)), bound=float(np.max(sol.error_bound)),
              floor=float(np.max(sol.rounding_floor)), tol=float(np.max(sol.tol)),
              err=None if v_star is None else float(np.max(np.abs(v - v_star))),
              within=None if v_star is None else bool(np.all(
                  np.max(np.abs(v - v_star), axis=-1)
                  <= np.asarray(sol.error_bound) + reference_slack(v_star))))


def reference_slack(v_star):
  """The float64 reference's own rounding, per MDP: `64 eps64 max|V*|` (~1e-12 at |V*| ~ 70).

  Float64 certificates at the default tolerance (~1e-13) are below what a float64 reference
  can confirm; errors are checked against `bound + slack`.
  """
  return 64 * np.finfo(np.float64).eps * np.max(np.abs(v_star), axis=-1)


def time_dense(name, p, r, gamma, v_star, method, tol, dtype, repeats):
  s, a = r.shape[1], r.shape[2]
  mdps = to_harnax(p, r, gamma, dtype)
  pi_ref = hx.uniform_reference(s, a, dtype=dtype)
  sol, comp, run = compile_and_time(batched_solver(pi_ref, method, tol), (mdps,), repeats)
  row = summarize(sol, v_star, run, comp)
  log(f"{name}: {method} {np.dtype(dtype).name} tol={tol}: {run * 1e3:.1f} ms, "
      f"{row['iters_max']} iterations, converged {row['converged']:.0%}")
  return row


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------

def measure_targets(cfg):
  """The issue's workload: default method vs NumPy float64 MacQueen VI at equal tolerance."""
  b, s, a, n = cfg["batch"], cfg["states"], cfg["actions"], cfg["repeats"]
  gamma = float(np.float32(0.99))
  p, r = dense_problem(0, b, s, a)
  log_ref = np.full((s, a), -np.log(a))
  v_star = np_soft_reference(p, r, gamma, TAU, log_ref)
  p2 = p.reshape(b, s * a, s)

  def numpy_row(tol):
    runs = []
    for _ in range(max(3, n // 2)):
      t = time.perf_counter()
      v, sweeps = np_macqueen_vi(p2, r, gamma, TAU, log_ref, tol)
      runs.append(time.perf_counter() - t)
    log(f"targets: NumPy float64 MacQueen VI tol={tol:g}: {statistics.median(runs) * 1e3:.1f} ms")
    return dict(run=statistics.median(runs), sweeps=sweeps, err=float(np.abs(v - v_star).max()))

  out = dict(batch=b, states=s, actions=a, gamma=gamma, v_max=float(np.abs(v_star).max()))
  out["f32"] = {m: time_dense("targets", p, r, gamma, v_star, m, None, jnp.float32, n)
                for m in SOFT_METHODS}
  out["f32_reachable"] = {m: time_dense("targets", p, r, gamma, v_star, m, TOL_REACHABLE,
                                        jnp.float32, n) for m in SOFT_METHODS}
  out["f32_unreachable"] = {m: time_dense("targets", p, r, gamma, v_star, m, TOL_TIGHT,
                                          jnp.float32, n) for m in SOFT_METHODS}
  with jax.enable_x64(True):
    out["f64"] = {m: time_dense("targets", p, r, gamma, v_star, m, TOL_TIGHT, jnp.float64, n)
                  for m in SOFT_METHODS}
  default_tol = out["f32"]["auto"]["tol"]
  out["numpy"] = {TOL_REACHABLE: numpy_row(TOL_REACHABLE), TOL_TIGHT: numpy_row(TOL_TIGHT),
                  "default": numpy_row(default_tol)}
  return out


def measure_classes(cfg):
  """Every method on each class `"auto"` tells apart; float32, default tolerance."""
  b, s, a, n = cfg["batch"], cfg["states"], cfg["actions"], cfg["repeats"]
  classes = [
      ("dense, Dirichlet(1), gamma=0.9", 0.9, lambda: dense_problem(1, b, s, a)),
      ("dense, Dirichlet(1), gamma=0.99", 0.99, lambda: dense_problem(2, b, s, a)),
      ("dense, Dirichlet(1), gamma=0.999", 0.999, lambda: dense_problem(3, b, s, a)),
      ("dense near-deterministic, Dirichlet(0.05), gamma=0.999", 0.999,
       lambda: dense_problem(4, b, s, a, concentration=0.05)),
      ("dense deterministic cycle, gamma=0.99", 0.99, lambda: cycle_problem(5, b, s, a)),
  ]
  rows = []
  for name, gamma, make in classes:
    gamma = float(np.float32(gamma))
    p, r = make()
    log(f"classes: {name}: float64 reference")
    v_star = np_soft_reference(p, r, gamma, TAU, np.full((s, a), -np.log(a)))
    for method in SOFT_METHODS:
      rows.append(dict(cls=name, method=method, **time_dense(
          "classes", p, r, gamma, v_star, method, None, jnp.float32, n)))
  rows += measure_sparse(cfg)
  return rows


def measure_sparse(cfg):
  """One large deterministic sparse MDP (a random graph: it mixes fast)."""
  s, a = cfg["sparse_states"], cfg["sparse_actions"]
  gamma = float(np.float32(0.99))
  name = f"sparse deterministic, S={s:,}, A={a}, gamma=0.99 (one MDP)"
  mdp = hx.random_deterministic_mdp(jax.random.key(0), s, a, discount=gamma, dtype=jnp.float32)
  pi_ref = hx.uniform_reference(s, a, dtype=jnp.float32)
  succ = np.asarray(mdp.successors)[..., 0]
  r = np.asarray(mdp.rewards, np.float64)
  log_ref = np.full((1, a), -np.log(a))
  log(f"classes: {name}: float64 reference (NumPy value iteration to 1e-10)")
  g = gamma / (1 - gamma)
  h = np.zeros(s)
  for _ in range(100_000):
    y = np_soft_value(r + gamma * h[succ], TAU, log_ref)
    kappa = y.mean()
    delta = y - h - kappa
    h = y - kappa
    if g * (delta.max() - delta.min()) / 2 <= 1e-10:
      break
  v_star = y + (gamma * kappa + gamma * (delta.max() + delta.min()) / 2) / (1 - gamma)
  rows = []
  for method in ("auto", "value_iteration", "anderson"):
    fn = lambda m, method=method: hx.solve_soft_bellman(m, pi_ref, TAU, method=method)
    sol, comp, run = compile_and_time(fn, (mdp,), max(2, cfg["repeats"] // 2))
    row = summarize(sol, v_star, run, comp)
    log(f"classes: {name}: {method}: {run * 1e3:.1f} ms, {row['iters_max']} iterations")
    rows.append(dict(cls=name, method=method, **row))
  return rows


def mesh_child(cfg):
  """In a process with one XLA host device per core: the default method on the targets'
  workload with the batch axis split over a mesh (`harnax.parallel.shard_batch`; each device
  runs its slice's loop). Prints one JSON line of plain numbers."""
  import json

  from harnax.parallel import batch_mesh
  from harnax.parallel import shard_batch
  b, s, a, n = cfg["batch"], cfg["states"], cfg["actions"], cfg["repeats"]
  gamma = float(np.float32(0.99))
  p, r = dense_problem(0, b, s, a)
  mesh = batch_mesh("data")
  out = dict(devices=jax.device_count())
  for key, dtype, tol in [("f32", jnp.float32, None), ("f32_reachable", jnp.float32,
                                                          TOL_REACHABLE),
                          ("f64", jnp.float64, TOL_TIGHT)]:
    with jax.enable_x64(dtype == jnp.float64):
      mdps = shard_batch(to_harnax(p, r, gamma, dtype), mesh)
      pi_ref = hx.uniform_reference(s, a, dtype=dtype)
      sol, comp, run = compile_and_time(batched_solver(pi_ref, "auto", tol), (mdps,), n)
      out[key] = summarize(sol, None, run, comp)
  print(json.dumps(out))


def measure_mesh(cfg, quick):
  """Runs `mesh_child` in a subprocess whose XLA sees one host device per core."""
  import json
  import subprocess
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  if cores < 2:
    return None
  log(f"mesh: the default method on {cores} host devices (subprocess)")
  env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                    + f" --xla_force_host_platform_device_count={cores}"))
  cmd = [sys.executable, os.path.abspath(__file__), "--mesh-child", "--repeats",
         str(cfg["repeats"])] + (["--quick"] if quick else [])
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
  if proc.returncode != 0:
    log("mesh child failed: " + proc.stderr[-500:])
    return None
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  for key in ("f32", "f32_reachable", "f64"):
    log(f"mesh: auto {key}: {out[key]['run'] * 1e3:.1f} ms on {out['devices']} devices")
  return out


# ---------------------------------------------------------------------------
# Report (formatting only)
# ---------------------------------------------------------------------------

def table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def fmt_t(seconds):
  return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def fmt_e(x):
  return "-" if x is None else f"{x:.1e}"


def machine_rows():
  import subprocess
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "harnax", "benchmarks"],
                           capture_output=True, text=True, check=True).stdout.strip()
    source = f"commit {commit}" + (" plus uncommitted edits" if dirty else " (clean)")
  except (OSError, subprocess.CalledProcessError):
    source = "not a git checkout"
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return [("harnax", f"{hx.__version__}, {source}"),
          ("date (UTC)", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
          ("CPU", f"{cpu}, {cores} cores usable"), ("python", platform.python_version()),
          ("jax", f"{jax.__version__} (backend {jax.default_backend()})"),
          ("numpy", np.__version__)]


def method_rows(results, numpy_run=None):
  rows = []
  for method, res in results.items():
    rows.append([f"`{method}`", fmt_t(res["run"]), fmt_t(res["compile"]),
                 f"{res['iters_mean']:.1f} / {res['iters_max']}", f"{res['converged']:.0%}",
                 fmt_e(res["tol"]), fmt_e(res["bound"]), fmt_e(res["floor"]), fmt_e(res["err"]),
                 "yes" if res["within"] else "**no**"]
                + ([f"{numpy_run / res['run']:.1f}x"] if numpy_run is not None else []))
  return rows


METHOD_HEADER = ["method", "wall (batch, median)", "compile", "iterations mean / max",
                 "converged", "tol (max)", "bound (max)", "rounding floor (max)",
                 "error vs f64 ref (max)", "error within bound (+ ref. rounding)"]


def mesh_lines(mesh, np_default, np_reach, np_tight):
  if mesh is None:
    return ""
  rows = []
  for key, title, base in [("f32_reachable", f"float32 at tol {TOL_REACHABLE:g}", np_reach),
                           ("f32", "float32 at the default tol", np_default),
                           ("f64", f"float64 at tol {TOL_TIGHT:g}", np_tight)]:
    res = mesh[key]
    rows.append([title, fmt_t(res["run"]), fmt_t(base["run"]), f"{base['run'] / res['run']:.1f}x",
                 f"{res['iters_max']}", f"{res['converged']:.0%}"])
  return (f"XLA runs a batched sweep on one core, NumPy's BLAS on all of them. The same code with "
          f"the batch split over a mesh of {mesh['devices']} host devices, one per core "
          f"(`XLA_FLAGS=--xla_force_host_platform_device_count={mesh['devices']}`, "
          "`harnax.parallel.shard_batch`; a subprocess of this script):\n\n"
          + table(["default method on the mesh", "harnax", "NumPy f64 (same tol)", "ratio",
                   "iterations max", "converged"], rows) + "\n")


def write_report(targets, mesh, classes, cfg, quick, total_s, load):
  t = targets
  np_tight, np_reach, np_default = (t["numpy"][TOL_TIGHT], t["numpy"][TOL_REACHABLE],
                                    t["numpy"]["default"])
  auto32, reach32, tight32, auto64 = (t["f32"]["auto"], t["f32_reachable"]["auto"],
                                      t["f32_unreachable"]["auto"], t["f64"]["auto"])
  lines = [
      "# Solver throughput\n",
      "Reproduce from the repository root, harnax installed (`pip install -e .`):\n",
      "```\npython benchmarks/solver_throughput.py" + (" --quick" if quick else "") + "\n```\n",
      ("**A `--quick` run: reduced sizes; the numbers are a smoke test.**\n" if quick else ""),
      "## Machine\n", table(["", ""], machine_rows()), "",
      "## Targets (default method)\n",
      f"{t['batch']} random dense MDPs, S={t['states']}, A={t['actions']}, gamma = 0.99 (float32: "
      f"{t['gamma']:.8g}), tau = {TAU}, rewards U(0, 1) (|V*| up to {t['v_max']:.0f}), uniform "
      f"pi_ref; `jax.jit(jax.vmap(hx.solve_soft_bellman))`. Baseline: NumPy float64 relative "
      f"value iteration with the same MacQueen stop, batched (`np.matmul`), run until every MDP "
      f"stops. Medians of {cfg['repeats']} runs (NumPy: of {max(3, cfg['repeats'] // 2)}).\n",
      table(["target", "harnax", "baseline", "ratio", "goal", "met"], [
          [f"float32 at tol {TOL_REACHABLE:g} vs NumPy f64 at {TOL_REACHABLE:g}",
           fmt_t(reach32["run"]), fmt_t(np_reach["run"]),
           f"{np_reach['run'] / reach32['run']:.1f}x", ">= 3x",
           children.met(np_reach["run"] / reach32["run"], 3, digits=1)],
          [f"float32 at the default tol (<= {auto32['tol']:.1e}) vs NumPy f64 at that tol",
           fmt_t(auto32["run"]), fmt_t(np_default["run"]),
           f"{np_default['run'] / auto32['run']:.1f}x", ">= 3x",
           children.met(np_default["run"] / auto32["run"], 3, digits=1)],
          [f"float64 at tol {TOL_TIGHT:g} vs NumPy f64 at {TOL_TIGHT:g}", fmt_t(auto64["run"]),
           fmt_t(np_tight["run"]), f"{np_tight['run'] / auto64['run']:.1f}x", ">= 2x",
           children.met(np_tight["run"] / auto64["run"], 2, digits=1)],
          [f"float32: unreachable tol {TOL_TIGHT:g} vs the default (reachable) tol",
           fmt_t(tight32["run"]), fmt_t(auto32["run"]),
           f"{tight32['run'] / auto32['run']:.2f}x", "<= 2x",
           children.met(tight32["run"] / auto32["run"], 2, at_most=True)],
      ]), "",
      mesh_lines(mesh, np_default, np_reach, np_tight),
      f"NumPy sweeps to tolerance: {np_reach['sweeps']} at {TOL_REACHABLE:g}, "
      f"{np_default['sweeps']} at {auto32['tol']:.1e}, {np_tight['sweeps']} at {TOL_TIGHT:g}.\n",
      "Every method on this workload (last column: NumPy float64 at the same tolerance over "
      "harnax):\n"]
  for key, title, np_run in [
      ("f32", "float32, default tol", np_default["run"]),
      ("f32_reachable", f"float32, tol {TOL_REACHABLE:g}", np_reach["run"]),
      ("f32_unreachable", f"float32, tol {TOL_TIGHT:g} (below the floor)", None),
      ("f64", f"float64, tol {TOL_TIGHT:g}", np_tight["run"])]:
    lines += [f"**{title}**\n",
              table(METHOD_HEADER + (["vs NumPy f64"] if np_run is not None else []),
                    method_rows(t[key], np_run)), ""]
  lines += [
      "## Problem classes (float32, default tol)\n",
      f"Dense classes: {cfg['batch']} MDPs each, S={cfg['states']}, A={cfg['actions']}, batched "
      f"with `jax.vmap`; the sparse class is one MDP. tau = {TAU}, rewards U(0, 1), uniform "
      "pi_ref. The float64 reference is NumPy soft policy iteration (dense) or NumPy value "
      "iteration to a 1e-10 bound (sparse). `auto` should match the fastest method of each "
      "class, or come close: it is value iteration until the certificate's contraction predicts "
      "a slow finish, then Anderson.\n",
      table(["class"] + METHOD_HEADER,
            [[row["cls"]] + method_rows({row["method"]: row})[0] for row in classes]), "",
      f"Total benchmark time: {total_s:.0f} s. Load average (1 min) {load[0]:.1f} at the start, "
      f"{load[1]:.1f} at the end (other processes share this machine; medians damp, not "
      "remove, that).\n"]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
  parser.add_argument("--out", default=None, help="markdown output path")
  parser.add_argument("--repeats", type=int, default=None, help="timed runs per row (median)")
  parser.add_argument("--no-mesh", action="store_true",
                      help="skip the rows on a mesh of one host device per core")
  parser.add_argument("--mesh-child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  # Backend discovery logs a warning per platform it cannot load; not news on a CPU run.
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
  cfg = dict(QUICK if args.quick else FULL)
  if args.repeats:
    cfg["repeats"] = args.repeats
  out_path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                      "solver_throughput.md")
  if args.mesh_child:
    mesh_child(cfg)
    return
  start, load_start = time.perf_counter(), os.getloadavg()[0]
  targets = measure_targets(cfg)
  mesh = None if args.no_mesh else measure_mesh(cfg, args.quick)
  classes = measure_classes(cfg)
  report = write_report(targets, mesh, classes, cfg, args.quick, time.perf_counter() - start,
                        (load_start, os.getloadavg()[0]))
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "w") as f:
    f.write(report)
  log(f"wrote {out_path}")


if __name__ == "__main__":
  main()
