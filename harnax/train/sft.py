"""Supervised next-token learning (SFT) of a causal language model on (prompt, output) pairs.

Each example is one sequence `prompt tokens + output tokens + end-of-output token`; the loss
is the mean negative log-likelihood of the output tokens (the end token included) given
everything before them, averaged over all output tokens of a batch (not per sequence):

  L = - sum_{b, t} m[b, t] log p(x[b, t] | x[b, <t]) / sum_{b, t} m[b, t],

with `m` the loss mask (output tokens that have a real predecessor). The prompt is context
only, unless `prompt_weight` w > 0: then the prompt tokens count too, each with weight w,

  L = - sum_{b, t} m_w[b, t] log p(x[b, t] | x[b, <t]) / sum_{b, t} m_w[b, t],
  m_w = m + w * (real prompt tokens with a real predecessor),

which also trains the model to predict its contexts. The tokens are exactly the ones
`harnax.policies.lm.encode_candidates` scores (prompt and output encoded separately), so a
trained model's candidate probabilities are the distribution it was trained to fit.

`train_sft` runs optax (gradient clipping, AdamW) on the model's `nnx.Param` state with one
jitted step per batch; batches are drawn without replacement from seeded permutations of the
examples, one permutation per epoch, so a seed fixes the whole run.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from harnax.models import logprobs as logprobs_lib
from harnax.policies import lm as lm_lib

Array = jax.Array
Log = Callable[[str], None]


class SFTData(NamedTuple):
  """`N` training sequences, right-padded to one length `T`.

  Attributes:
    ids: int32 `[N, T]`, prompt tokens, output tokens, end token, then padding.
    attention_mask: bool `[N, T]`, True on real tokens.
    loss_mask: bool `[N, T]`, True on the tokens the loss counts (output and end token).
  """

  ids: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray

  @property
  def num_examples(self) -> int:
    return int(self.ids.shape[0])


class SFTResult(NamedTuple):
  """The outcome of `train_sft`.

  Attributes:
    model: the trained `CausalLM` (a new object; the input model is unchanged).
    losses: float `[num_steps]`, the batch loss (nats per output token) before each step.
  """

  model: nnx.Module
  losses: np.ndarray


def encode_examples(tokenizer, prompts: Sequence[str], outputs: Sequence[str], *,
                    length: int | None = None, pad_id: int | None = None) -> SFTData:
  """Token arrays of `(prompt, output)` pairs for `train_sft`.

  Each row is `encode(prompt) + encode(output) + [eos]` (each part encoded on its own, without
  added special tokens, as `harnax.policies.lm.encode_candidates` does), right-padded.

  Args:
    tokenizer: a `harnax.models.Tokenizer` (or anything with `encode` and `eos_token_id`).
    prompts: `N` rendered prompts (e.g. `harnax.policies.lm.render_prompt`).
    outputs: `N` output strings (without the end token, which is appended).
    length: pad to this length (default: the longest row); an error if a row is longer.
    pad_id: the padding token (default: the tokenizer's pad token, else 0).

  Returns:
    `SFTData` with `N` rows.
  """
  lm_lib.check_prompts_and_outputs(prompts, outputs, per_prompt="output")
  eos = lm_lib.end_of_output_id(tokenizer)
  enc = lm_lib.text_encoder(tokenizer)
  rows = []
  for i, (p, o) in enumerate(zip(prompts, outputs)):
    p_ids = enc(p)
    if not p_ids:
      raise ValueError(f"prompts[{i}]: the prompt tokenizes to nothing")
    rows.append((p_ids, enc(o) + (eos,)))
  longest = max(len(p) + len(o) for p, o in rows)
  t = longest if length is None else int(length)
  if longest > t:
    raise ValueError(f"length: {t} is too small; the longest example has {longest} tokens")
  pad = pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
  ids = np.full((len(rows), t), pad, np.int32)
  attention = np.zeros((len(rows), t), bool)
  loss = np.zeros((len(rows), t), bool)
  for i, (p, o) in enumerate(rows):
    ids[i, :len(p)], ids[i, len(p):len(p) + len(o)] = p, o
    attention[i, :len(p) + len(o)] = True
    loss[i, len(p):len(p) + len(o)] = True
  return SFTData(ids=ids, attention_mask=attention, loss_mask=loss)


def sft_loss(model, ids: Array, attention_mask: Array, loss_mask: Array,
             prompt_weight: float | Array = 0.0) -> Array:
  """Mean next-token negative log-likelihood over the loss-mask tokens (nats per token).

  Args:
    model: a `CausalLM`.
    ids: int `[B, T]` token ids.
    attention_mask: `[B, T]`, true on real tokens (left or right padding).
    loss_mask: `[B, T]`, true on the tokens whose log-probability counts; a token without a
      real predecessor (the first of a row) or that is padding does not count.
    prompt_weight: the weight w >= 0 of every other real token that has a real predecessor
      (the prompt); 0 (default) leaves the prompt out of the loss.

  Returns:
    Scalar float32 (float64 for a float64 model): `-sum(m_w * log p) / sum(m_w)` with
    `m_w = m + w * prompt` (the module docstring); 0 when nothing counts.
  """
  logits = model(ids, attention_mask=attention_mask)                             # [B, T, V]
  lp = logprobs_lib.token_logprobs(logits[:, :-1], ids[:, 1:])                 # [B, T - 1]
  counted = logprobs_lib.has_context(jnp.asarray(attention_mask))[:, 1:]
  out = jnp.asarray(loss_mask, bool)[:, 1:]
  weight = jnp.where(out, 1.0, jnp.asarray(prompt_weight, lp.dtype)).astype(lp.dtype)
  weight = jnp.where(counted, weight, 0.0)
  total = jnp.sum(jnp.where(weight > 0, weight * lp, 0.0))
  denom = jnp.sum(weight)
  return jnp.where(denom > 0, -total / jnp.where(denom > 0, denom, 1.0), 0.0)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(graphdef, optimizer, params, opt_state, rest, batch, prompt_weight):
  def loss_fn(p):
    return sft_loss(nnx.merge(graphdef, p, rest), *batch, prompt_weight=prompt_weight)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def batch_order(num_examples: int, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
  """int `[num_steps, batch_size]`: the example indices of every step.

  Consecutive seeded permutations of `0..N-1` (one per epoch), cut into batches in order; a
  batch may straddle two epochs, so every batch is full and every example is seen once per
  epoch.
  """
  rng = np.random.default_rng(seed)
  need = num_steps * batch_size
  epochs = -(-need // num_examples) if need else 0
  stream = (np.concatenate([rng.permutation(num_examples) for _ in range(epochs)])
            if epochs else np.zeros(0, np.int64))
  return stream[:need].reshape(num_steps, batch_size)


def train_sft(model, examples: SFTData, *, batch_size: int, learning_rate: float,
              num_steps: int | None = None, epochs: float | None = None, seed: int = 0,
              weight_decay: float = 0.0, warmup_steps: int = 0, decay: bool = True,
              clip_norm: float | None = 1.0, log: Log | None = None,
              log_every: int = 50, length_bucket: int | None = None,
              prompt_weight: float = 0.0) -> SFTResult:
  """Trains `model` by supervised next-token learning on `examples` (AdamW).

  Args:
    model: a `CausalLM` (left unchanged; the trained one is returned).
    examples: `SFTData` (`encode_examples`).
    batch_size: sequences per step.
    learning_rate: peak AdamW step size.
    num_steps: optimizer steps; or give `epochs` instead (steps = ceil(epochs * N / B)).
    epochs: passes over the data (may be fractional).
    seed: fixes the batch order.
    weight_decay: AdamW's decoupled weight decay.
    warmup_steps: linear warm-up from 0 to `learning_rate`.
    decay: cosine decay of the step size to 0 over the remaining steps (else constant).
    clip_norm: clip the gradient to this global norm first (None: no clipping).
    log: receives a progress line every `log_every` steps and at the end.
    log_every: steps between progress lines.
    length_bucket: cut each batch to the smallest multiple of this many tokens that holds its
      longest row (the rows are right-padded, so only padding is cut and the loss is
      unchanged); None trains every batch at the full length. Short batches then cost less,
      for one compilation per length used.
    prompt_weight: the loss weight of each prompt token relative to an output token (`sft_loss`;
      0: outputs only). The reported losses are then the weighted mean.

  Returns:
    `SFTResult(model, losses [num_steps])`.
  """
  if not isinstance(examples, SFTData):
    raise ValueError(f"examples: expected SFTData (encode_examples), got "
                     f"{type(examples).__name__}")
  n = examples.num_examples
  if n < 1:
    raise ValueError("examples: expected at least one example")
  for field, value in (("batch_size", batch_size), ("log_every", log_every)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{field}: expected a positive int, got {value!r}")
  if (num_steps is None) == (epochs is None):
    raise ValueError(f"num_steps, epochs: expected exactly one of them, got num_steps="
                     f"{num_steps!r}, epochs={epochs!r}")
  if epochs is not None:
    if not float(epochs) > 0:
      raise ValueError(f"epochs: expected > 0, got {epochs!r}")
    num_steps = math.ceil(float(epochs) * n / batch_size)
  if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
    raise ValueError(f"num_steps: expected a non-negative int, got {num_steps!r}")
  if not float(learning_rate) > 0:
    raise ValueError(f"learning_rate: expected > 0, got {learning_rate!r}")
  if not float(weight_decay) >= 0:
    raise ValueError(f"weight_decay: expected >= 0, got {weight_decay!r}")
  if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, (int, np.integer)) or (
      warmup_steps < 0):
    raise ValueError(f"warmup_steps: expected a non-negative int, got {warmup_steps!r}")
  if clip_norm is not None and not float(clip_norm) > 0:
    raise ValueError(f"clip_norm: expected > 0 or None, got {clip_norm!r}")
  if isinstance(prompt_weight, bool) or not isinstance(prompt_weight, (int, float)) or not (
      math.isfinite(prompt_weight) and prompt_weight >= 0):
    raise ValueError(f"prompt_weight: expected a finite number >= 0, got {prompt_weight!r}")
  num_steps, warmup_steps = int(num_steps), int(warmup_steps)
  if length_bucket is not None and (isinstance(length_bucket, bool) or not isinstance(
      length_bucket, (int, np.integer)) or length_bucket < 1):
    raise ValueError(f"length_bucket: expected None or a positive int, got {length_bucket!r}")
  row_lengths = np.asarray(examples.attention_mask, bool).sum(axis=1)
  if length_bucket is not None:
    full = np.arange(examples.ids.shape[1])[None, :] < row_lengths[:, None]
    if not np.array_equal(full, np.asarray(examples.attention_mask, bool)):
      raise ValueError("length_bucket: needs right-padded examples (encode_examples pads on "
                       "the right)")

  optimizer = _optimizer(float(learning_rate), num_steps, warmup_steps, bool(decay),
                         float(weight_decay), None if clip_norm is None else float(clip_norm))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = optimizer.init(params)
  data = tuple(jnp.asarray(x) for x in examples)
  order = batch_order(n, int(batch_size), num_steps, int(seed))
  losses = []
  for i in range(num_steps):
    idx = jnp.asarray(order[i])
    batch = tuple(x[idx] for x in data)
    if length_bucket is not None:
      t = -(-int(row_lengths[order[i]].max()) // int(length_bucket)) * int(length_bucket)
      batch = tuple(x[:, :min(t, x.shape[1])] for x in batch)
    params, opt_state, loss = _step(graphdef, optimizer, params, opt_state, rest, batch,
                                    jnp.float32(prompt_weight))
    losses.append(loss)
    if log is not None and ((i + 1) % log_every == 0 or i + 1 == num_steps):
      log(f"sft step {i + 1}/{num_steps}: loss {float(loss):.4f}")
  losses = np.asarray(jax.device_get(losses), np.float64).reshape(num_steps)
  return SFTResult(model=nnx.merge(graphdef, params, rest), losses=losses)


@functools.lru_cache(maxsize=None)
def _optimizer(peak: float, num_steps: int, warmup: int, decay: bool, weight_decay: float,
               clip_norm: float | None) -> optax.GradientTransformation:
  """AdamW with its schedule (after optional clipping); one object per setting, so equal runs
  share one compilation."""
  if not decay:
    schedule = optax.linear_schedule(0.0, peak, warmup) if warmup else peak
  else:
    warmup = min(warmup, num_steps)
    schedule = optax.warmup_cosine_decay_schedule(0.0 if warmup else peak, peak, warmup,
                                                  max(num_steps, warmup + 1), end_value=0.0)
  adamw = optax.adamw(schedule, weight_decay=weight_decay)
  return adamw if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adamw)
