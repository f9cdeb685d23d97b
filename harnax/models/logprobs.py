"""Token log-probabilities: the ONE function shared by the sampler, the learner and the teacher.

:func:`token_logprobs` is used by :mod:`harnax.models.decoding` for the log-probs it reports
and by :func:`sequence_logprobs` for teacher forcing, so sampled and re-scored log-probs agree
(tested). Everything here is differentiable in the model parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax import pytree

Array = jax.Array


def token_logprobs(logits: Array, tokens: Array, *, temperature: float = 1.0) -> Array:
  """``log softmax(logits / temperature)[token]`` in float32.

  Args:
    logits: [..., V] (any float dtype; upcast to float32 first).
    tokens: [...] int token ids.
    temperature: > 0; the distribution the log-probs refer to.
  Returns:
    [...] float32 log-probabilities.
  """
  if not temperature > 0:
    raise ValueError(f"temperature: expected > 0, got {temperature}")
  # float64 logits (a float64 model) stay float64; narrower ones are upcast to float32.
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
                            / temperature, axis=-1)
  return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sequence_logprobs(model, input_ids: Array, attention_mask: Array, *,
                      temperature: float = 1.0) -> Array:
  """Teacher-forced per-token log-probs ``[B, T]``.

  Entry ``t`` is ``log p(input_ids[:, t] | input_ids[:, :t])``; it is 0 where token t or its
  predecessor is padding (so the first real token of a left-padded row scores 0).
  """
  logits = model(input_ids, attention_mask=attention_mask)
  lp = token_logprobs(logits[:, :-1], input_ids[:, 1:], temperature=temperature)
  lp = jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)
  return jnp.where(has_context(attention_mask), lp, 0.0)


def has_context(attention_mask: Array) -> Array:
  """[B, T] bool: token t is real and so is its predecessor, i.e. it has a log-prob."""
  mask = attention_mask.astype(bool)
  return mask & jnp.concatenate([jnp.zeros_like(mask[:, :1]), mask[:, :-1]], axis=1)


@pytree.container
class SpanScore:
  """Log-prob of a span per sequence: ``total`` and ``mean`` [B], ``per_token`` [B, T]."""

  total: Array
  mean: Array
  per_token: Array
  num_tokens: Array


def score_spans(model, input_ids: Array, attention_mask: Array, span_mask: Array, *,
                temperature: float = 1.0) -> SpanScore:
  """Log-probs of the tokens selected by ``span_mask`` (e.g. only the action tokens after the
  reasoning), under teacher forcing.

  Args:
    input_ids, attention_mask: [B, T] context + completion (see :func:`concat_completion`).
    span_mask: [B, T], 1 on the tokens to score. Tokens without a real predecessor (the
      first token of a row) have no log-prob and are not counted in ``num_tokens``/``mean``.
  """
  per_token = sequence_logprobs(model, input_ids, attention_mask, temperature=temperature)
  span = span_mask.astype(bool) & has_context(attention_mask)
  per_token = jnp.where(span, per_token, 0.0)
  total = jnp.sum(per_token, axis=1)
  count = jnp.sum(span, axis=1)
  # An empty span has mean 0 rather than NaN.
  mean = total / jnp.maximum(count, 1)
  return SpanScore(total=total, mean=mean, per_token=per_token, num_tokens=count)


def concat_completion(context_ids: Array, context_mask: Array, completion_ids: Array,
                      completion_mask: Array) -> tuple[Array, Array, Array]:
  """Joins left-padded contexts [B, Tc] and right-padded completions [B, Tg].

  Returns ``(input_ids, attention_mask, completion_span)`` of shape [B, Tc + Tg]; the span
  marks the completion tokens. Positions come from the mask, so the padding between the two
  parts (only the completion's right padding, at the end) never shifts a position.
  """
  ids = jnp.concatenate([context_ids, completion_ids], axis=1)
  mask = jnp.concatenate([context_mask, completion_mask], axis=1).astype(jnp.int32)
  span = jnp.concatenate([jnp.zeros_like(context_mask), completion_mask], axis=1).astype(jnp.int32)
  return ids, mask, span
