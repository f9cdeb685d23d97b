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

`run` is the shared `lax.while_loop`: it stops on the certified bound, on a
stall at the rounding floor (`patience` iterations without a better bound) or
at `max_iters`, with no host round trip per sweep. `cfg` is any object with
`tol`, `max_iters`, `patience` (and `memory` for Anderson).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def shift_rewards(apply_t, h0, gamma):
  """`T' = T - rho` with `rho = mean(T h0)`: the operator of rewards `r - rho`.

  `T'` is monotone and constant-shifting like `T`, its fixed point is
  `V* - rho/(1-gamma)`, and the certificate is the same. Iterating on `T'`
  keeps `|T' h|` and `kappa` at the scale of the value differences instead of
  the mean reward, which lowers the rounding floor of every bound in float32.

  Returns:
    `(T', offset)`; add `offset = rho/(1-gamma)` to the fixed point of `T'`.
  """
  rho = jnp.mean(apply_t(h0))
  return (lambda h: apply_t(h) - rho), rho / (1.0 - gamma)


def certify(apply_t, h, gamma):
  """One application of T at `V = h + mean(T h)/(1-gamma)`: bound and midpoint.

  Returns:
    (next centred iterate, Delta, bound, certified midpoint V).
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
  # can be certified, so a tolerance under it ends in a stall, not a false claim.
  eps = jnp.finfo(y.dtype).eps
  rounding = (2.0 * g * eps * (jnp.max(jnp.abs(y)) + jnp.max(jnp.abs(h)) + jnp.abs(kappa))
              + eps * jnp.max(jnp.abs(v_mid)))
  bound = g * (hi - lo) / 2.0 + rounding
  return y - kappa, delta, bound, v_mid


class LoopState(NamedTuple):
  k: Array
  h: Array
  v: Array
  bound: Array
  best: Array
  since_best: Array
  extra: tuple


def run(step, h0, extra0, cfg):
  """Shared while-loop: `step(h, extra) -> (h_next, extra, bound, v_mid)`."""
  dtype = h0.dtype
  inf = jnp.asarray(jnp.inf, dtype)
  init = LoopState(jnp.asarray(0, jnp.int32), h0, h0, inf, inf, jnp.asarray(0, jnp.int32),
                    extra0)

  def cond(st):
    return ((st.k < cfg.max_iters) & (st.bound > cfg.tol) & (st.since_best < cfg.patience))

  def body(st):
    h, extra, bound, v_mid = step(st.h, st.extra)
    improved = bound < st.best
    # Keep the best certified midpoint: rounding can make later bounds worse.
    v = jnp.where(improved, v_mid, st.v)
    best = jnp.where(improved, bound, st.best)
    since = jnp.where(improved, 0, st.since_best + 1)
    return LoopState(st.k + 1, h, v, best, best, since, extra)

  out = lax.while_loop(cond, body, init)
  return out.v, out.k, out.best


def value_iteration(apply_t, gamma, h0, cfg):
  def step(h, extra):
    h_next, _, bound, v_mid = certify(apply_t, h, gamma)
    return h_next, extra, bound, v_mid
  return run(step, h0, (), cfg)


def anderson(apply_t, gamma, h0, cfg):
  """Type-II Anderson mixing of the relative map `G(h) = T h - mean(T h)`.

  The residual `G(h) - h` equals MacQueen's `Delta`, so every step is certified.
  """
  m = cfg.memory
  s = h0.shape[0]
  dtype = h0.dtype
  hist_g = jnp.zeros((m, s), dtype)
  hist_f = jnp.zeros((m, s), dtype)

  def step(h, extra):
    hist_g, hist_f, count = extra
    g_h, delta, bound, v_mid = certify(apply_t, h, gamma)
    slot = count % m
    hist_g = hist_g.at[slot].set(g_h)
    hist_f = hist_f.at[slot].set(delta)
    count = count + 1
    valid = jnp.arange(m) < jnp.minimum(count, m)
    gram = hist_f @ hist_f.T
    both = valid[:, None] & valid[None, :]
    scale = jnp.max(jnp.where(valid, jnp.diagonal(gram), 0.0))
    # Ridge relative to the largest residual keeps the small system solvable.
    ridge = 1e-10 * scale + jnp.finfo(dtype).tiny
    gram = jnp.where(both, gram, 0.0) + jnp.diag(jnp.where(valid, ridge, 1.0))
    alpha = jnp.linalg.solve(gram, valid.astype(dtype))
    alpha = alpha / jnp.sum(alpha)
    mixed = alpha @ hist_g
    ok = jnp.all(jnp.isfinite(mixed)) & (jnp.max(jnp.abs(alpha)) < 1e4)
    h_next = jnp.where(ok, mixed, g_h)
    return h_next - jnp.mean(h_next), (hist_g, hist_f, count), bound, v_mid

  return run(step, h0, (hist_g, hist_f, jnp.asarray(0, jnp.int32)), cfg)
