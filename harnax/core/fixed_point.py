"""Certified fixed-point iteration for monotone, constant-shifting operators.

Any operator with `T(V + c) = T V + gamma c` and `V <= W => T V <= T W` — the
soft and hard Bellman operators, and `T_pi V = c_pi + gamma P_pi V` for a fixed
policy — has MacQueen's bounds. Writing `V = h + kappa / (1 - gamma)` with
`kappa = mean(T h)`, one application of `T` to the centred iterate `h` gives

  Delta = T V - V = T h - h - kappa,
  T V + g min(Delta) <= V* <= T V + g max(Delta),     g = gamma / (1 - gamma),

so the midpoint is within `g * span(Delta) / 2` of the fixed point in sup-norm.
Iterating on `h` (relative value iteration) keeps rounding at the scale of value
*differences* instead of `|r| / (1 - gamma)`: about 1/(1-gamma) times more
accurate certificates in float32.

Every certificate is `contraction + floor`: MacQueen's span term, which the
iteration drives down, plus a rounding allowance (the *floor*) that no
iteration removes. `run` is the shared `lax.while_loop`. It stops as soon as
one of these holds, with no host round trip per sweep:

* converged: the best bound is `<= tol` (`tol=None`: `<= 2 * floor`, i.e. the
  contraction term is below the rounding term);
* at the floor: the contraction term is below the floor and `tol` is below the
  floor, so no later iterate can be certified to `tol`;
* stalled: `patience` iterations without a better bound (rounding noise that
  the allowance underestimates, or a non-monotone accelerated method);
* `max_iters`;
* optionally, slow: the contraction measured over the last sweep would need more
  than `slow_sweeps` further sweeps to reach the target, which hands the state
  to a faster method (`solvers`' `"auto"`).

`cfg` is any object with `tol` (float or None), `max_iters`, `patience`,
`slow_sweeps` (and `memory` for Anderson).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array


class Certificate(NamedTuple):
  """One application of `T` at a centred iterate, certified.

  Attributes:
    sweep: the plain next centred iterate `T h - mean(T h)`, `[S]`.
    delta: MacQueen's residual `Delta = T V - V`, `[S]`.
    v: the certified midpoint, `[S]`.
    bound: `||v - V*||_inf <= bound`, scalar: `g span(Delta) / 2 + floor`.
    floor: the rounding allowance inside `bound`, scalar.
  """

  sweep: Array
  delta: Array
  v: Array
  bound: Array
  floor: Array


def shift_rewards(apply_t, h0, gamma, *, t_h0=None):
  """`T' = T - rho` with `rho = mean(T h0)`: the operator of rewards `r - rho`.

  `T'` is monotone and constant-shifting like `T`, its fixed point is
  `V* - rho/(1-gamma)`, and the certificate is the same. Iterating on `T'`
  keeps `|T' h|` and `kappa` at the scale of the value differences instead of
  the mean reward, which lowers the rounding floor of every bound in float32.

  Args:
    apply_t: the operator, `[S] -> [S]`.
    h0: starting point, `[S]`.
    gamma: discount, scalar.
    t_h0: `T h0` when the caller has it without a sweep (e.g. `h0 = 0`, where
      `T 0` needs no transition product); else one sweep computes it.

  Returns:
    `(T', offset)`; add `offset = rho/(1-gamma)` to the fixed point of `T'`.
  """
  rho = jnp.mean(apply_t(h0) if t_h0 is None else t_h0)
  return (lambda h: apply_t(h) - rho), rho / (1.0 - gamma)


def certify(apply_t, h, gamma, *, offset=0.0) -> Certificate:
  """One application of T at `V = h + mean(T h)/(1-gamma)`: bound and midpoint.

  Args:
    apply_t: the (shifted) operator, `[S] -> [S]`.
    h: centred iterate, `[S]`.
    gamma: discount, scalar.
    offset: constant added to the returned values afterwards (the reward shift
      of `shift_rewards`), scalar; sizes the rounding of the returned values.
  """
  y = apply_t(h)
  kappa = jnp.mean(y)
  delta = y - h - kappa
  lo, hi = jnp.min(delta), jnp.max(delta)
  g = gamma / (1.0 - gamma)
  v_mid = y + (gamma * kappa + gamma * (lo + hi) / 2.0) / (1.0 - gamma)
  # The span is exact only in exact arithmetic: add the rounding of Delta (a few
  # ulps of the centred quantities, amplified by g) and of the returned values.
  # Negligible in float64; in float32 it is the floor below which no iterate
  # can be certified, so a tolerance under it ends at the floor, not in a false claim.
  eps = jnp.finfo(y.dtype).eps
  floor = (2.0 * g * eps * (jnp.max(jnp.abs(y)) + jnp.max(jnp.abs(h)) + jnp.abs(kappa))
           + eps * jnp.max(jnp.abs(v_mid + offset)))
  return Certificate(sweep=y - kappa, delta=delta, v=v_mid,
                     bound=g * (hi - lo) / 2.0 + floor, floor=floor)


class LoopState(NamedTuple):
  """State of `run`; a later `run` can continue from it (another method)."""

  k: Array           # iterations done
  h: Array           # next centred iterate, [S]
  v: Array           # best certified midpoint so far, [S]
  bound: Array       # its bound
  floor: Array       # its rounding floor
  since_best: Array  # iterations since the bound last improved
  last_span: Array   # contraction term of the latest certificate
  slow: Array        # the latest certificate predicts a slow finish
  extra: tuple       # method-specific state


def init_state(h0, extra=()) -> LoopState:
  dtype = h0.dtype
  inf = jnp.asarray(jnp.inf, dtype)
  zero = jnp.asarray(0, jnp.int32)
  return LoopState(k=zero, h=h0, v=h0, bound=inf, floor=jnp.zeros((), dtype), since_best=zero,
                   last_span=inf, slow=jnp.asarray(False), extra=extra)


def effective_tol(cfg, floor):
  """The tolerance a loop aims at: `cfg.tol`, or `2 * floor` when it is None."""
  if cfg.tol is None:
    return 2.0 * floor + jnp.finfo(floor.dtype).tiny
  return jnp.asarray(cfg.tol, floor.dtype)


def done(st: LoopState, cfg, *, exit_when_slow=False):
  """Why `st` is final (see the module docstring), as one boolean."""
  tol = effective_tol(cfg, st.floor)
  converged = st.bound <= tol
  at_floor = (st.bound - st.floor <= st.floor) & (tol < st.floor)
  out = converged | at_floor | (st.since_best >= cfg.patience) | (st.k >= cfg.max_iters)
  if exit_when_slow:
    out = out | st.slow
  return out


def run(step, state: LoopState, cfg, *, exit_when_slow=False) -> LoopState:
  """Shared while-loop: `step(h, extra) -> (h_next, extra, certificate)`."""

  def body(st):
    h, extra, cert = step(st.h, st.extra)
    improved = cert.bound < st.bound
    # Keep the best certified midpoint: rounding can make later bounds worse.
    pick = lambda new, old: jnp.where(improved, new, old)  # noqa: E731
    span = cert.bound - cert.floor
    slow = jnp.asarray(False)
    if exit_when_slow:
      # Sweeps still needed at the contraction rate of the last sweep, to bring
      # the contraction term to the tolerance's share (at least the floor).
      target = jnp.maximum(effective_tol(cfg, cert.floor) - cert.floor, cert.floor)
      rate = span / st.last_span
      slow = ((st.k >= 2) & (span > 4.0 * cert.floor)
              & (cfg.slow_sweeps * jnp.log(rate) > jnp.log(target / span)))
    return LoopState(k=st.k + 1, h=h, v=pick(cert.v, st.v), bound=pick(cert.bound, st.bound),
                     floor=pick(cert.floor, st.floor),
                     since_best=jnp.where(improved, 0, st.since_best + 1), last_span=span,
                     slow=slow, extra=extra)

  return lax.while_loop(lambda st: ~done(st, cfg, exit_when_slow=exit_when_slow), body, state)


def value_iteration(apply_t, gamma, state: LoopState, cfg, *, offset=0.0,
                    exit_when_slow=False) -> LoopState:
  def step(h, extra):
    cert = certify(apply_t, h, gamma, offset=offset)
    return cert.sweep, extra, cert
  return run(step, state, cfg, exit_when_slow=exit_when_slow)


def anderson(apply_t, gamma, state: LoopState, cfg, *, offset=0.0) -> LoopState:
  """Type-II Anderson mixing of the relative map `G(h) = T h - mean(T h)`.

  The residual `G(h) - h` equals MacQueen's `Delta`, so every step is certified.
  Starts a fresh history at `state.h` (its `extra` is replaced). Safeguard: after
  `m` steps without a better bound the history is dropped and the plain sweep
  taken (mixing can stall on nearly periodic chains, e.g. deterministic cycles).
  """
  m = cfg.memory
  s = state.h.shape[0]
  dtype = state.h.dtype
  hist_g = jnp.zeros((m, s), dtype)
  hist_f = jnp.zeros((m, s), dtype)

  def step(h, extra):
    hist_g, hist_f, count, best, since = extra
    cert = certify(apply_t, h, gamma, offset=offset)
    g_h = cert.sweep
    improved = cert.bound < best
    best = jnp.minimum(cert.bound, best)
    since = jnp.where(improved, 0, since + 1)
    restart = since >= m
    slot = count % m
    hist_g = hist_g.at[slot].set(g_h)
    hist_f = hist_f.at[slot].set(cert.delta)
    count = count + 1
    valid = jnp.arange(m) < jnp.minimum(count, m)
    gram = hist_f @ hist_f.T
    both = valid[:, None] & valid[None, :]
    scale = jnp.max(jnp.where(valid, jnp.diagonal(gram), 0.0))
    # Ridge relative to the largest residual keeps the small system solvable; in
    # float32 1e-10 is below the Gram matrix's own rounding, so it scales with eps.
    ridge = max(1e-10, 100 * float(jnp.finfo(dtype).eps)) * scale + jnp.finfo(dtype).tiny
    gram = jnp.where(both, gram, 0.0) + jnp.diag(jnp.where(valid, ridge, 1.0))
    alpha = jnp.linalg.solve(gram, valid.astype(dtype))
    alpha = alpha / jnp.sum(alpha)
    mixed = alpha @ hist_g
    ok = jnp.all(jnp.isfinite(mixed)) & (jnp.max(jnp.abs(alpha)) < 1e4) & ~restart
    h_next = jnp.where(ok, mixed, g_h)
    count = jnp.where(restart, 0, count)
    since = jnp.where(restart, 0, since)
    return h_next - jnp.mean(h_next), (hist_g, hist_f, count, best, since), cert

  zero = jnp.asarray(0, jnp.int32)
  extra = (hist_g, hist_f, zero, jnp.asarray(jnp.inf, dtype), zero)
  return run(step, state._replace(extra=extra), cfg)
