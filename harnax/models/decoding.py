"""Jit-compiled generation with a preallocated KV cache.

``prefill`` runs the (left-padded) prompts through the model once, filling the cache;
``decode`` samples up to ``max_new_tokens`` tokens in a ``lax.while_loop`` with static shapes,
stopping early once every sequence has emitted a stop token. Sampling is greedy
(``temperature=0``) or temperature / top-k / top-p with an explicit PRNG key. The reported
log-probs come from :func:`harnax.models.logprobs.token_logprobs`, the same function the
scorer uses.
"""

from __future__ import annotations

import functools
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp

from harnax import pytree
from harnax.models.logprobs import token_logprobs
from harnax.models.model import Cache
from harnax.models.model import CausalLM

Array = jax.Array


@pytree.container
class Generation:
  """Output of :func:`generate`.

  Attributes:
    tokens: [B, N] generated ids; ``pad_token_id`` after a sequence stopped.
    logprobs: [B, N] float32 log-prob of each generated token under the model at the sampling
      temperature (1 for greedy), before top-k/top-p truncation; 0 after the stop.
    mask: [B, N] 1 on generated tokens (the stop token included).
    lengths: [B] number of generated tokens.
  """

  tokens: Array
  logprobs: Array
  mask: Array
  lengths: Array


def sample_token(key: Array | None, logits: Array, *, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None) -> Array:
  """Next tokens [B] from logits [B, V].

  ``temperature == 0`` is greedy (argmax; ``key`` unused). Otherwise logits are divided by the
  temperature, restricted to the ``top_k`` largest and to the smallest set whose probability
  reaches ``top_p`` (the most likely token always survives), then sampled with ``key``.
  """
  logits = logits.astype(jnp.float32)
  if temperature == 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if key is None:
    raise ValueError("key: a PRNG key is required when temperature > 0")
  logits = logits / temperature
  neg = jnp.finfo(jnp.float32).min
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, neg, logits)
  if top_p is not None:
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < top_p  # first token always kept (mass_before = 0)
    rows = jnp.arange(logits.shape[0])[:, None]
    keep = jnp.zeros_like(keep_sorted).at[rows, order].set(keep_sorted)
    logits = jnp.where(keep, logits, neg)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def prefill(graphdef, state, input_ids: Array, attention_mask: Array,
            cache: Cache) -> tuple[Array, Cache]:
  """Jit-compiled :meth:`CausalLM.prefill`: writes the prompts into ``cache`` (donated);
  returns last-position logits [B, V] float32 and the new cache."""
  return nnx.merge(graphdef, state).prefill(input_ids, attention_mask, cache=cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "top_k",
                                             "top_p", "stop_tokens", "pad_token_id"),
                   donate_argnames=("cache",))
def decode(key: Array, graphdef, state, cache: Cache, logits: Array, *, max_new_tokens: int,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           stop_tokens: tuple[int, ...] = (), pad_token_id: int = 0) -> tuple[Generation, Cache]:
  """Samples up to ``max_new_tokens`` tokens per sequence, starting from ``logits`` [B, V]
  (those :func:`prefill` returns) and the ``cache`` (donated) they came with.

  Returns:
    the :class:`Generation` and the cache after the last decode step.
  """
  model = nnx.merge(graphdef, state)
  b = logits.shape[0]
  stops = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
  lp_temperature = temperature if temperature > 0 else 1.0

  def cond(carry):
    i, _, _, _, done, _ = carry
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    i, cache, logits, key, done, out = carry
    key, sub = jax.random.split(key)
    tok = sample_token(sub, logits, temperature=temperature, top_k=top_k, top_p=top_p)
    lp = token_logprobs(logits, tok, temperature=lp_temperature)
    tok = jnp.where(done, pad_token_id, tok)
    out = Generation(tokens=out.tokens.at[:, i].set(tok),
                     logprobs=out.logprobs.at[:, i].set(jnp.where(done, 0.0, lp)),
                     mask=out.mask.at[:, i].set(~done),
                     lengths=out.lengths + (~done).astype(jnp.int32))
    done = done | jnp.isin(tok, stops)
    next_logits, cache = model.decode_step(tok, cache=cache)
    return i + 1, cache, next_logits, key, done, out

  out = Generation(tokens=jnp.full((b, max_new_tokens), pad_token_id, jnp.int32),
                   logprobs=jnp.zeros((b, max_new_tokens), jnp.float32),
                   mask=jnp.zeros((b, max_new_tokens), bool),
                   lengths=jnp.zeros((b,), jnp.int32))
  carry = (jnp.zeros((), jnp.int32), cache, logits, key, jnp.zeros((b,), bool), out)
  _, cache, _, _, _, out = jax.lax.while_loop(cond, body, carry)
  return out, cache


def generate(model: CausalLM, input_ids: Array, attention_mask: Array | None = None, *,
             max_new_tokens: int, key: Array | None = None, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             stop_tokens: Sequence[int] | None = None, pad_token_id: int | None = None,
             max_length: int | None = None) -> Generation:
  """Generates continuations of left-padded prompts.

  Args:
    model: the language model.
    input_ids: [B, T] prompts, left-padded; attention_mask: [B, T] (default all ones).
    max_new_tokens: number of decoding steps (static).
    key: PRNG key, required when ``temperature > 0``.
    temperature, top_k, top_p: sampling settings (``temperature=0`` is greedy).
    stop_tokens: ids that end a sequence (default: the config's ``eos_token_id``).
    pad_token_id: filler after a stop (default: the config's pad id, else 0).
    max_length: cache size (default ``T + max_new_tokens``).
  Raises:
    ValueError: prompt plus new tokens longer than ``max_length``, or bad sampling settings.
  """
  cfg = model.config
  b, t = input_ids.shape
  if attention_mask is None:
    attention_mask = jnp.ones((b, t), jnp.int32)
  max_length = t + max_new_tokens if max_length is None else max_length
  if t + max_new_tokens > max_length:
    raise ValueError(f"input_ids: prompt length {t} + max_new_tokens {max_new_tokens} exceeds "
                     f"the cache max_length {max_length}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
  if temperature < 0:
    raise ValueError(f"temperature: expected >= 0, got {temperature}")
  if top_k is not None and not 0 < top_k <= cfg.vocab_size:
    raise ValueError(f"top_k: expected in [1, {cfg.vocab_size}], got {top_k}")
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"top_p: expected in (0, 1], got {top_p}")
  if temperature > 0 and key is None:
    raise ValueError("key: a PRNG key is required when temperature > 0")
  stop = tuple(cfg.eos_token_id if stop_tokens is None else stop_tokens)
  pad = pad_token_id if pad_token_id is not None else (cfg.pad_token_id or 0)
  graphdef, state = nnx.split(model)
  cache = model.init_cache(b, max_length)
  logits, cache = prefill(graphdef, state, jnp.asarray(input_ids), jnp.asarray(attention_mask),
                          cache)
  key = jax.random.key(0) if key is None else key
  out, _ = decode(key, graphdef, state, cache, logits, max_new_tokens=max_new_tokens,
                  temperature=float(temperature), top_k=top_k, top_p=top_p, stop_tokens=stop,
                  pad_token_id=int(pad))
  return out
