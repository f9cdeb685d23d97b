"""Distillation losses for agents behind a harness: on-policy response distillation and HAD's
harness-aware action preference (docs/distillation.md).

All functions are pure, work under `jax.jit`, `jax.vmap` and `jax.grad`, and take per-token
arrays of one padded batch: `B` responses of `T` tokens with a mask that is true on the tokens
that count.

**Direction.** Response distillation here is the *reverse* KL, `KL(student ‖ teacher)`, on the
student's own samples (on-policy distillation, GKD with β = 1 in TRL's naming): the student is
pulled toward the teacher's modes and pays for mass the teacher does not give.

* :func:`reverse_kl_full` — per token, the full-vocabulary form
  `Σ_v π_S(v) (log π_S(v) − log π_T(v))`.
* :func:`reverse_kl_sampled` — the sampled-token estimator: its value is the k1 estimate
  `mean_t (log π_S(y_t) − log π_T(y_t))`; its gradient is the policy-gradient surrogate
  `−mean_t sg[log π_T(y_t) − log π_S(y_t)] · log π_S(y_t)`, whose expectation over
  `y_t ~ π_S` equals the gradient of the full form (tests/train/test_distill.py enumerates it).
* :func:`mean_action_logprob` — `ℓ̄(a) = mean over the action tokens of log π(a_t | ·)`.
* :func:`action_preference_loss` — HAD's term: `m_i · softplus(−β (ℓ̄(a⁺_i) − ℓ̄(a⁻_i)))` where
  `a⁺ ≠ a⁻`, i.e. `−log σ(β · margin)`, a Bradley–Terry loss on the length-normalized margin;
  exactly zero where the two actions agree or the validity mask drops the pair.
* :func:`gradient_norm_ratio` — `λ = sg[‖∇L_RD‖ / ‖∇L_pref‖]`, balancing the two terms by their
  minibatch gradient norms; :func:`balanced_gradient` returns `∇L_RD + λ ∇L_pref`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def _masked_mean(x: Array, mask: Array) -> Array:
  mask = jnp.asarray(mask, x.dtype)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1)


def reverse_kl_full(student_logits: Array, teacher_logits: Array, mask: Array) -> tuple[Array,
                                                                                         Array]:
  """Per-token and mean `KL(student ‖ teacher)` over the full vocabulary.

  Args:
    student_logits: [B, T, V] the student's next-token logits at the response positions.
    teacher_logits: [B, T, V] the teacher's, at the same positions (same vocabulary).
    mask: [B, T] true on the response tokens that count.

  Returns:
    (loss, per_token): the masked mean over tokens (scalar) and the per-token KL [B, T]
    (nats; 0 where masked).
  """
  if student_logits.shape != teacher_logits.shape:
    raise ValueError(f"teacher_logits: expected the student's shape {student_logits.shape}, got "
                     f"{teacher_logits.shape}")
  ls = jax.nn.log_softmax(student_logits.astype(jnp.promote_types(student_logits.dtype,
                                                                  jnp.float32)), axis=-1)
  lt = jax.nn.log_softmax(teacher_logits.astype(ls.dtype), axis=-1)
  per_token = jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1)
  per_token = jnp.where(mask, per_token, 0.0)
  return _masked_mean(per_token, mask), per_token


def reverse_kl_sampled(student_logprobs: Array, teacher_logprobs: Array, mask: Array
                       ) -> tuple[Array, Array]:
  """The sampled-token reverse-KL loss of tokens drawn from the student.

  Args:
    student_logprobs: [B, T] `log π_S(y_t | y_<t)` of the sampled tokens (differentiable).
    teacher_logprobs: [B, T] `log π_T(y_t | y_<t)` of the same tokens (no gradient taken).
    mask: [B, T] true on the response tokens that count.

  Returns:
    (surrogate, estimate): the scalar whose gradient is the policy-gradient estimate of
    `∇ KL(student ‖ teacher)`, and the k1 estimate of the KL itself (mean over tokens).
  """
  if student_logprobs.shape != teacher_logprobs.shape:
    raise ValueError(f"teacher_logprobs: expected the student's shape {student_logprobs.shape}, "
                     f"got {teacher_logprobs.shape}")
  advantage = jax.lax.stop_gradient(teacher_logprobs - student_logprobs)
  surrogate = -_masked_mean(advantage * student_logprobs, mask)
  estimate = _masked_mean(jax.lax.stop_gradient(student_logprobs - teacher_logprobs), mask)
  return surrogate, estimate


def mean_action_logprob(token_logprobs: Array, action_mask: Array) -> Array:
  """`ℓ̄(a)` [B]: the mean log-probability of each row's action tokens (0 for a row without
  any; such a pair must be inactive in :func:`action_preference_loss`)."""
  mask = jnp.asarray(action_mask, token_logprobs.dtype)
  return jnp.sum(token_logprobs * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1)


def action_preference_loss(positive: Array, negative: Array, differ: Array, valid: Array, *,
                           beta: float = 1.0) -> tuple[Array, Array]:
  """HAD's harness-aware action preference, averaged over the batch's states.

  Args:
    positive: [B] `ℓ̄(a⁺)`: the mean action-token log-probability, under the student after its
      own reasoning, of the action the teacher chose WITH the harness information.
    negative: [B] `ℓ̄(a⁻)`: the same for the action the teacher chose WITHOUT it.
    differ: [B] bool, `a⁺ ≠ a⁻` (the term is active only there).
    valid: [B] bool, the validity mask `m_i`: false when `a⁺` contradicts the harness record.
    beta: the logistic scale (> 0).

  Returns:
    (loss, active): `(1/B) Σ_i [differ_i ∧ valid_i] · softplus(−β (ℓ̄⁺_i − ℓ̄⁻_i))` and the
    number of active pairs. Inactive pairs contribute exactly zero, value and gradient.
  """
  if not beta > 0:
    raise ValueError(f"beta: expected > 0, got {beta!r}")
  active = jnp.logical_and(jnp.asarray(differ, bool), jnp.asarray(valid, bool))
  margin = positive - negative
  per_pair = jnp.where(active, jax.nn.softplus(-beta * jnp.where(active, margin, 0.0)), 0.0)
  return jnp.mean(per_pair), jnp.sum(active)


def gradient_norm_ratio(grads_rd, grads_pref, *, eps: float = 1e-12) -> Array:
  """`λ = ‖∇L_RD‖ / ‖∇L_pref‖` (global norms over the pytrees), without gradient; 0 when the
  preference gradient vanishes (no active pair: the term adds nothing either way)."""
  n_rd = optax.tree.norm(grads_rd)
  n_pref = optax.tree.norm(grads_pref)
  lam = jnp.where(n_pref > eps, n_rd / jnp.maximum(n_pref, eps), 0.0)
  return jax.lax.stop_gradient(lam)


def balanced_gradient(rd_loss_fn: Callable, pref_loss_fn: Callable, params, *args):
  """`∇(L_RD + λ L_pref)` with `λ` = :func:`gradient_norm_ratio` of this minibatch.

  Args:
    rd_loss_fn, pref_loss_fn: `(params, *args) -> scalar`.
    params: the student's parameters (a pytree).

  Returns:
    (grads, aux): the combined gradient pytree and ``{"rd": L_RD, "pref": L_pref, "lambda": λ,
    "loss": L_RD + λ L_pref}``.
  """
  rd, g_rd = jax.value_and_grad(rd_loss_fn)(params, *args)
  pref, g_pref = jax.value_and_grad(pref_loss_fn)(params, *args)
  lam = gradient_norm_ratio(g_rd, g_pref)
  grads = jax.tree.map(lambda a, b: a + lam * b, g_rd, g_pref)
  return grads, {"rd": rd, "pref": pref, "lambda": lam, "loss": rd + lam * pref}
