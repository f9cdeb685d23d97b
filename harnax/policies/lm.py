"""A language model as a policy behind a harness: every candidate output scored exactly.

For each state `s` the harness renders a prompt; the model gives `log p_theta(o | prompt_s)`
for every candidate output `o` of that state by teacher forcing, the end-of-output token
included. The candidates do not cover the model's whole output space, so the mass outside
them is an explicit **catch-all** output,

  p(other | s) = 1 - sum_o p_theta(o | s),

which decodes as invalid. Together they are a true distribution over `O + 1` outputs, and
`harnax.harness.aggregate_log_probs` turns it into the semantic policy `Pi_theta(a | s)`
(`invalid="noop"`: invalid mass executes the harness's no-op; `"renormalize"`: the harness
re-asks until an output parses).

Scoring shares the prompt: one prefill of each prompt into a KV cache, then all `O`
candidates of that state as one batch of continuations of the cache
(`CausalLM.forward_with_cache`), never a full forward per (prompt, candidate).

The exact policy gradient (docs/lm_policy.md) splits at the output table. With
`L = log p_theta(o | s)` of shape `[R, O]` (rows = states, possibly of several instances),

  grad_theta J = sum_{r, o} G[r, o] * grad_theta L[r, o],   G = dJ/dL,

where `J(L)` is exact tabular evaluation (no sampling) and `G` its gradient on the tabular
side. The pullback is the gradient of the scalar `sum G * L_theta`, taken over row
micro-batches with accumulation, so memory is bounded by one micro-batch.

Everything takes plain inputs (token ids, decode tables, an MDP), so it serves any task,
not only the MiniWoB++ study; `encode_candidates` builds the token arrays from strings.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax import pytree
from harnax.core import evaluation
from harnax.harness import aggregation
from harnax.harness import interface
from harnax.models import logprobs as logprobs_lib

Array = jax.Array

# log of a padded (non-existent) candidate: exp gives exactly 0, no inf - inf in gradients.
_ABSENT = -1e30


# -- token arrays -------------------------------------------------------------------------


@pytree.container
class CandidateTokens:
  """Prompts and candidate outputs of `R` states as token arrays (leading dims allowed).

  Attributes:
    prompt_ids: int32 `[..., R, Tp]`, left-padded prompts (one per state).
    prompt_mask: bool `[..., R, Tp]`, True on real prompt tokens (at least one per row).
    output_ids: int32 `[..., R, O, Tc]`, right-padded candidates, each ending with the
      end-of-output token.
    output_mask: bool `[..., R, O, Tc]`, True on real tokens; a candidate with no real
      token is padding (probability exactly 0).
  """

  prompt_ids: Array
  prompt_mask: Array
  output_ids: Array
  output_mask: Array

  def __init__(self, *, prompt_ids, prompt_mask, output_ids, output_mask):
    prompt_ids, output_ids = jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(output_ids,
                                                                             jnp.int32)
    prompt_mask, output_mask = jnp.asarray(prompt_mask, bool), jnp.asarray(output_mask, bool)
    if prompt_ids.ndim < 2 or prompt_mask.shape != prompt_ids.shape:
      raise ValueError(f"prompt_ids, prompt_mask: expected equal shapes [..., R, Tp], got "
                       f"{list(prompt_ids.shape)} and {list(prompt_mask.shape)}")
    lead = prompt_ids.shape[:-1]
    if (output_ids.ndim != prompt_ids.ndim + 1 or output_ids.shape[:-2] != lead
        or output_mask.shape != output_ids.shape):
      raise ValueError(f"output_ids, output_mask: expected equal shapes {list(lead)} + [O, Tc] "
                       f"(the prompts' leading dims), got {list(output_ids.shape)} and "
                       f"{list(output_mask.shape)}")
    pm = val_host(prompt_mask)
    if pm is not None and not np.all(pm.any(-1)):
      row = np.argwhere(~pm.any(-1))[0]
      raise ValueError(f"prompt_mask: every prompt needs at least one real token; row "
                       f"{tuple(int(i) for i in row)} has none")
    pytree.set_fields(self, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                      output_ids=output_ids, output_mask=output_mask)

  @property
  def num_outputs(self) -> int:
    return self.output_ids.shape[-2]

  @property
  def candidate_mask(self) -> Array:
    """bool `[..., R, O]`: the candidate exists (has at least one token)."""
    return jnp.any(self.output_mask, axis=-1)

  def rows(self) -> "CandidateTokens":
    """The same arrays with every leading dim merged into the row dim `R`."""
    tp, (o, tc) = self.prompt_ids.shape[-1], self.output_ids.shape[-2:]
    return pytree.unvalidated(
        CandidateTokens, prompt_ids=self.prompt_ids.reshape(-1, tp),
        prompt_mask=self.prompt_mask.reshape(-1, tp),
        output_ids=self.output_ids.reshape(-1, o, tc),
        output_mask=self.output_mask.reshape(-1, o, tc))


def val_host(x) -> np.ndarray | None:
  """`x` as a NumPy array when it is concrete, else None (under a trace)."""
  return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def render_prompt(tokenizer, observation: str, *, system: str | None = None) -> str:
  """The prompt text of one state: the chat template where the tokenizer has one.

  With a template: `[system?, user: observation]` rendered with the generation prompt
  (the assistant turn opened); without one: the observation and a newline.
  """
  if getattr(tokenizer, "chat_template", None):
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": observation}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
  return (system + "\n" if system else "") + observation + "\n"


def end_of_output_id(tokenizer) -> int:
  """The token that ends an output (the tokenizer's eos); an error if it has none."""
  eos = tokenizer.eos_token_id
  if eos is None:
    raise ValueError("tokenizer: no eos_token; an LM policy needs an end-of-output token to "
                     "score complete outputs")
  return int(eos)


def encode_candidates(tokenizer, prompts: Sequence[str], outputs: Sequence[Sequence[str]], *,
                      prompt_length: int | None = None, output_length: int | None = None,
                      num_outputs: int | None = None, pad_id: int | None = None,
                      check_split: bool = True) -> CandidateTokens:
  """Token arrays of `R` prompts and their candidate outputs.

  Args:
    tokenizer: a `harnax.models.Tokenizer` (or anything with `encode`, `eos_token_id`).
    prompts: `R` prompt texts (already rendered, e.g. by `render_prompt`).
    outputs: per prompt, its candidate output strings (without the end token, which is
      appended). Rows may have different counts; missing ones are padding.
    prompt_length, output_length, num_outputs: pad to these sizes (default: the largest);
      an error if something is longer, never truncated.
    pad_id: the padding token (default: the tokenizer's pad token, else 0).
    check_split: check that every `prompt + output + end` tokenizes as the prompt's tokens
      followed by the output's, so that the scored tokens are the ones the model would emit
      after this prompt (a merge across the boundary would score another string).

  Returns:
    `CandidateTokens` with `R` rows.
  """
  if len(prompts) != len(outputs):
    raise ValueError(f"outputs: expected one candidate list per prompt ({len(prompts)}), got "
                     f"{len(outputs)}")
  if not prompts:
    raise ValueError("prompts: expected at least one prompt")
  eos = end_of_output_id(tokenizer)
  enc = functools.lru_cache(maxsize=None)(
      lambda text: tuple(tokenizer.encode(text, add_special_tokens=False)))
  p_rows = [enc(p) for p in prompts]
  o_rows = [[enc(o) + (eos,) for o in outs] for outs in outputs]
  for r, (p, outs) in enumerate(zip(prompts, outputs)):
    if not p_rows[r]:
      raise ValueError(f"prompts[{r}]: the prompt tokenizes to nothing")
    if len(set(outs)) != len(outs):
      raise ValueError(f"outputs[{r}]: duplicate candidate outputs {sorted(outs)}")
    if check_split:
      for o, ids in zip(outs, o_rows[r]):
        joint = tuple(tokenizer.encode(p + o, add_special_tokens=False)) + (eos,)
        if joint != p_rows[r] + ids:
          raise ValueError(
              f"tokenizer: output {o!r} splits differently after the prompt than alone "
              f"(prompt {r}: {list(joint[len(p_rows[r]) - 2:])} vs ... "
              f"{list(p_rows[r][-2:]) + list(ids)}); scored tokens would not be the emitted "
              "ones. End prompts at a token boundary (e.g. a newline) or change the tokenizer")
  tp = _size("prompt_length", prompt_length, max(len(p) for p in p_rows))
  tc = _size("output_length", output_length, max((len(i) for o in o_rows for i in o),
                                                  default=1))
  no = _size("num_outputs", num_outputs, max(len(o) for o in o_rows))
  pad = pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
  r = len(prompts)
  p_ids = np.full((r, tp), pad, np.int32)
  p_mask = np.zeros((r, tp), bool)
  o_ids = np.full((r, no, tc), pad, np.int32)
  o_mask = np.zeros((r, no, tc), bool)
  for i, (p, outs) in enumerate(zip(p_rows, o_rows)):
    p_ids[i, tp - len(p):], p_mask[i, tp - len(p):] = p, True
    for j, ids in enumerate(outs):
      o_ids[i, j, :len(ids)], o_mask[i, j, :len(ids)] = ids, True
  return CandidateTokens(prompt_ids=p_ids, prompt_mask=p_mask, output_ids=o_ids,
                         output_mask=o_mask)


def _size(name, given, needed):
  if given is None:
    return needed
  if given < needed:
    raise ValueError(f"{name}: {given} is too small; the longest needs {needed}")
  return int(given)


# -- scoring --------------------------------------------------------------------------------


def _expand_cache(cache, copies: int):
  """The cache of `B` prompts repeated `copies` times per row: `B * copies` rows."""
  b = cache.valid.shape[0]
  layers = []
  for layer in cache.layers:
    k, v = layer.heads(b)                                   # [B, K, L, D]
    kv, length, d = k.shape[1], k.shape[2], k.shape[3]
    shape = type(layer).storage_shape(batch=b * copies, kv_heads=kv, length=length,
                                      head_dim=d)
    rep = lambda x: jnp.broadcast_to(x[:, None], (b, copies) + x.shape[1:]).reshape(shape)
    layers.append(layer.replace(k=rep(k), v=rep(v)))
  rep2 = lambda x: jnp.repeat(x, copies, axis=0)
  return cache.replace(layers=tuple(layers), positions=rep2(cache.positions),
                       valid=rep2(cache.valid), index=cache.index)


def candidate_log_probs(model, tokens: CandidateTokens, *, temperature: float = 1.0) -> Array:
  """`log p(o | prompt)` of every candidate, `[R, O]` float32, by teacher forcing.

  One prefill per prompt, then all `O` candidates of the row continue from its KV cache.
  Padding candidates get `-1e30` (probability exactly 0).

  Args:
    model: a `harnax.models.CausalLM`.
    tokens: `CandidateTokens` with `R` rows (no extra leading dims; see `.rows()`).
    temperature: the sampling temperature the probabilities refer to.
  """
  r, tp = tokens.prompt_ids.shape
  o, tc = tokens.output_ids.shape[-2:]
  cache = model.init_cache(r, tp + tc)
  first, cache = model.prefill(tokens.prompt_ids, tokens.prompt_mask, cache=cache)   # [R, V]
  cache = _expand_cache(cache, o)
  ids = tokens.output_ids.reshape(r * o, tc)
  mask = tokens.output_mask.reshape(r * o, tc)
  logits, _ = model.forward_with_cache(ids, mask, cache=cache)                      # [RO, Tc, V]
  lp_first = logprobs_lib.token_logprobs(first[:, None, :], tokens.output_ids[:, :, 0],
                                         temperature=temperature)                   # [R, O]
  lp_rest = logprobs_lib.token_logprobs(logits[:, :-1], ids[:, 1:], temperature=temperature)
  lp_rest = jnp.sum(jnp.where(mask[:, 1:], lp_rest, 0.0), axis=-1).reshape(r, o)
  total = jnp.where(tokens.output_mask[:, :, 0], lp_first, 0.0) + lp_rest
  return jnp.where(tokens.candidate_mask, total, _ABSENT)


def candidate_log_probs_unshared(model, tokens: CandidateTokens, *,
                                 temperature: float = 1.0) -> Array:
  """`candidate_log_probs` by one full forward per (prompt, candidate): the reference.

  `R * O` sequences of `Tp + Tc` tokens; for tests and the benchmark's baseline.
  """
  r, tp = tokens.prompt_ids.shape
  o, tc = tokens.output_ids.shape[-2:]
  p_ids = jnp.broadcast_to(tokens.prompt_ids[:, None], (r, o, tp)).reshape(r * o, tp)
  p_mask = jnp.broadcast_to(tokens.prompt_mask[:, None], (r, o, tp)).reshape(r * o, tp)
  ids, mask, span = logprobs_lib.concat_completion(
      p_ids, p_mask, tokens.output_ids.reshape(r * o, tc), tokens.output_mask.reshape(r * o, tc))
  total = logprobs_lib.score_spans(model, ids, mask, span, temperature=temperature).total
  return jnp.where(tokens.candidate_mask, total.reshape(r, o), _ABSENT)


def with_catch_all(log_probs: Array) -> Array:
  """`[..., O + 1]`: the candidates' log-probs and last the catch-all `log(1 - sum p)`.

  The catch-all is `-inf` (with zero gradient) where the candidates hold all the mass in
  floating point; candidates' totals above 1 by rounding are treated the same way.
  """
  total = jax.nn.logsumexp(log_probs, axis=-1)
  tiny = jnp.finfo(log_probs.dtype).tiny
  rest = -jnp.expm1(jnp.minimum(total, 0.0))
  other = jnp.where(rest > tiny, jnp.log(jnp.where(rest > tiny, rest, 1.0)), -jnp.inf)
  return jnp.concatenate([log_probs, other[..., None]], axis=-1)


def semantic_log_policy_from_outputs(log_probs: Array, decode_table: Array, *, num_actions: int,
                                     invalid: str = "noop",
                                     noop_action: int | None = None) -> Array:
  """`log Pi(a | s)`, `[..., S, A]`, from candidate log-probs `[..., S, O]` (catch-all added).

  Args:
    log_probs: `[..., S, O]`, `log p(o | s)` of the candidates (not normalized over them).
    decode_table: int `[..., S, O]`, each candidate's action or `INVALID`.
    num_actions: A.
    invalid: `"noop"` or `"renormalize"` (`harnax.harness.aggregate_log_probs`).
    noop_action: the action that receives the invalid and catch-all mass under `"noop"`.
  """
  aggregation._check_mode(invalid, noop_action, num_actions)
  full = with_catch_all(log_probs)
  table = jnp.concatenate([jnp.asarray(decode_table, jnp.int32),
                           jnp.full(decode_table.shape[:-1] + (1,), interface.INVALID,
                                    jnp.int32)], axis=-1)
  noop = None if invalid != "noop" else int(noop_action)
  agg = lambda lp, tb: aggregation._aggregate(lp, tb, num_actions=num_actions, invalid=invalid,
                                              noop_action=noop)
  for _ in range(full.ndim - 2):
    agg = jax.vmap(agg)
  return agg(full, table)


# -- the model as a pure function of its parameters ------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScoreFn:
  """`params, CandidateTokens (R rows) -> [R, O]` log-probs: a model as a pure function.

  `graphdef` is the static structure of an NNX model (`nnx.split`), `params` its state.
  Hashable by value, so equal models share one compilation.
  """

  graphdef: Any
  temperature: float = 1.0
  shared: bool = True

  def __call__(self, params, tokens: CandidateTokens) -> Array:
    model = nnx.merge(self.graphdef, params)
    score = candidate_log_probs if self.shared else candidate_log_probs_unshared
    return score(model, tokens, temperature=self.temperature)


def split_model(model, *, temperature: float = 1.0, shared: bool = True) -> tuple[ScoreFn, Any]:
  """`(score_fn, params)`: the model as a pure scoring function of its state."""
  graphdef, params = nnx.split(model)
  return ScoreFn(graphdef, float(temperature), bool(shared)), params


# -- micro-batched scoring and the exact gradient ---------------------------------------------


def _chunks(tokens: CandidateTokens, micro_batch: int) -> tuple[CandidateTokens, int]:
  """Rows padded to a multiple of `micro_batch` and split: `[C, micro_batch, ...]`."""
  tokens = tokens.rows()
  r = tokens.prompt_ids.shape[0]
  mb = max(1, min(int(micro_batch), r))
  pad = (-r) % mb

  def split(x, fill):
    if pad:
      widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
      x = jnp.pad(x, widths, constant_values=fill)
    return x.reshape((-1, mb) + x.shape[1:])

  # Padded rows get a one-token prompt (attention needs a key) and no candidate.
  pm = tokens.prompt_mask
  if pad:
    pm = jnp.concatenate([pm, jnp.zeros((pad,) + pm.shape[1:], bool).at[:, -1].set(True)])
  out = pytree.unvalidated(
      CandidateTokens, prompt_ids=split(tokens.prompt_ids, 0),
      prompt_mask=pm.reshape((-1, mb) + pm.shape[1:]),
      output_ids=split(tokens.output_ids, 0), output_mask=split(tokens.output_mask, False))
  return out, r


def score_rows(score_fn: Callable, params, tokens: CandidateTokens, *,
               micro_batch: int = 64) -> Array:
  """`score_fn(params, rows)` over all rows of `tokens` in micro-batches: `[..., R, O]`."""
  lead = tokens.prompt_ids.shape[:-1]
  chunks, r = _chunks(tokens, micro_batch)
  out = jax.lax.map(lambda c: score_fn(params, c), chunks)
  return out.reshape((-1,) + out.shape[2:])[:r].reshape(lead + out.shape[-1:])


def pullback(score_fn: Callable, params, tokens: CandidateTokens, cotangent: Array, *,
             micro_batch: int = 64):
  """`grad_params sum(cotangent * score_fn(params, tokens))`, one micro-batch at a time.

  Each micro-batch's forward and backward run inside one step of a `lax.scan` whose carry
  is the gradient sum, so activations of one micro-batch at a time are alive.
  """
  chunks, r = _chunks(tokens, micro_batch)
  g = cotangent.reshape((-1,) + cotangent.shape[-1:])
  pad = chunks.prompt_ids.shape[0] * chunks.prompt_ids.shape[1] - r
  g = jnp.pad(g, ((0, pad), (0, 0))).reshape(chunks.output_ids.shape[:3])
  # Padding candidates carry no gradient (their -1e30 is a constant, not a function).
  g = jnp.where(jnp.any(chunks.output_mask, -1), g, 0.0)

  def body(acc, xs):
    chunk, gc = xs
    out, vjp = jax.vjp(lambda p: score_fn(p, chunk), params)
    (grad,) = vjp(gc.astype(out.dtype))
    return jax.tree.map(jnp.add, acc, grad), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  total, _ = jax.lax.scan(body, zeros, (chunks, g))
  return total


def exact_value_and_grad(score_fn: Callable, params, tokens: CandidateTokens,
                         objective: Callable[[Array], Array], *, micro_batch: int = 64):
  """`(J, grad_params J, log_probs)` for `J = objective(score_fn(params, tokens))`, exactly.

  1. scores every candidate (`score_rows`, no gradient kept);
  2. `J` and `G = dJ/dL` on the tabular side (`objective` is exact evaluation);
  3. the pullback `grad_params sum(G * L)` in micro-batches (`pullback`).

  Args:
    score_fn: `(params, CandidateTokens with R rows) -> [R, O]` log-probs, e.g. from
      `split_model`; any differentiable scorer works (a tabular softmax in the tests).
    params: the trainable pytree.
    tokens: `CandidateTokens` with leading dims `[..., S]` (e.g. `[N, S]` instances).
    objective: `log_probs [..., S, O] -> scalar J` (e.g. `lm_objective`).
    micro_batch: rows per micro-batch of the model passes.
  """
  log_probs = jax.lax.stop_gradient(score_rows(score_fn, params, tokens,
                                               micro_batch=micro_batch))
  value, g = jax.value_and_grad(objective)(log_probs)
  grads = pullback(score_fn, params, tokens, g, micro_batch=micro_batch)
  return value, grads, log_probs


@functools.lru_cache(maxsize=None)
def lm_objective(num_actions: int, invalid: str = "noop", noop_action: int | None = None):
  """`objective(log_probs, (mdp, decode_table, pi_ref, tau)) -> mean J` over instances.

  `log_probs` `[N, S, O]`, `mdp` stacked `[N, ...]`, `decode_table` `[N, S, O]`,
  `pi_ref` `[N, S, A]`: the mean over the `N` instances of the exact regularized return of
  the semantic policy. One object per static configuration (one compilation).
  """
  def objective(log_probs, problem):
    mdp, decode_table, pi_ref, tau = problem
    pol = jnp.exp(semantic_log_policy_from_outputs(
        log_probs, decode_table, num_actions=num_actions, invalid=invalid,
        noop_action=noop_action))
    values = jax.vmap(lambda m, p, r: evaluation.evaluate_policy(m, p, r, tau).value)(
        mdp, pol.astype(pi_ref.dtype), pi_ref)
    return jnp.mean(values)
  return objective


def semantic_policy(model, tokens: CandidateTokens, decode_table: Array, *, num_actions: int,
                    invalid: str = "noop", noop_action: int | None = None,
                    micro_batch: int = 64) -> Array:
  """`Pi_theta(a | s)`, `[..., S, A]`, of a model behind a harness (rows sum to one).

  Args:
    model: a `CausalLM`.
    tokens: `CandidateTokens` `[..., S]` (prompts and candidates of every state).
    decode_table: int `[..., S, O]`, the action each candidate decodes to, or `INVALID`.
    num_actions, invalid, noop_action: see `semantic_log_policy_from_outputs`.
  """
  score_fn, params = split_model(model)
  lp = _score_jit(score_fn, params, tokens, int(micro_batch))
  return jnp.exp(semantic_log_policy_from_outputs(lp, jnp.asarray(decode_table),
                                                  num_actions=num_actions, invalid=invalid,
                                                  noop_action=noop_action))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _score_jit(score_fn, params, tokens, micro_batch):
  return score_rows(score_fn, params, tokens, micro_batch=micro_batch)


def value_and_grad(model, tokens: CandidateTokens, mdp, decode_table: Array, pi_ref: Array,
                   tau, *, num_actions: int, invalid: str = "noop",
                   noop_action: int | None = None, micro_batch: int = 64):
  """Exact `(J, grad J)` of a model behind a harness on `N` task instances.

  `J` is the mean over instances of the exact regularized return `J(Pi_theta)`
  (`harnax.evaluate_policy` on each `mdp` with its `pi_ref` and `tau`); the gradient is
  with respect to the model's `nnx.Param` state, exact (no sampling).

  Args:
    model: a `CausalLM`.
    tokens: `CandidateTokens` `[N, S]`.
    mdp: a `TabularMDP` with leading dim `N` (`harnax.core.mdp.stack`).
    decode_table: int `[N, S, O]`; pi_ref: `[N, S, A]`; tau: temperature > 0.
    num_actions, invalid, noop_action: see `semantic_log_policy_from_outputs`.
    micro_batch: states per model micro-batch.

  Returns:
    `(J scalar, grads nnx.State)`.
  """
  score_fn, params = split_model(model)
  objective = lm_objective(int(num_actions), invalid,
                           None if noop_action is None else int(noop_action))
  j, g, _ = _value_and_grad_jit(score_fn, objective, int(micro_batch), params, tokens,
                                (mdp, jnp.asarray(decode_table), pi_ref, tau))
  return j, g


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _value_and_grad_jit(score_fn, objective, micro_batch, params, tokens, problem):
  return exact_value_and_grad(score_fn, params, tokens, lambda lp: objective(lp, problem),
                              micro_batch=micro_batch)
