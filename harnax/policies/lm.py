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
from harnax.models import model as model_lib

Array = jax.Array

# log of a padded (non-existent) candidate: exp gives exactly 0, no inf - inf in gradients.
ABSENT = -1e30


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

  @property
  def lead_shape(self) -> tuple[int, ...]:
    """The leading dims, `[..., R]`."""
    return self.prompt_ids.shape[:-1]

  def rows(self) -> "CandidateTokens":
    """The same arrays with every leading dim merged into the row dim `R`."""
    return _merge_lead(self, len(self.lead_shape))

  def pad_rows(self, extra: int) -> "CandidateTokens":
    """`extra` more rows (after merging leading dims): a one-token prompt, no candidate."""
    return _pad(self.rows(), extra, fills=dict(output_ids=0, output_mask=False))


def val_host(x) -> np.ndarray | None:
  """`x` as a NumPy array when it is concrete, else None (under a trace)."""
  return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


@pytree.container
class CandidateTree:
  """Prompts and the prefix tree of their candidates, to pack in one sequence per state.

  Candidates share prefixes (`click [1]`, `click [1] [2]`, ...): each distinct prefix is one
  tree node, scored once. The packed row is the prompt followed by the nodes; a node sees
  the prompt and its own ancestors (`node_path`), and sits at position `prompt length +
  depth`, as in the plain sequence `prompt + candidate`. Built by `pack_candidates`.

  Attributes:
    prompt_ids, prompt_mask: `[..., R, Tp]` as in `CandidateTokens`.
    node_ids: int32 `[..., R, N]`, the token of each node.
    node_mask: bool `[..., R, N]`, a real node.
    node_parent: int32 `[..., R, N]`, the parent node, -1 for a child of the prompt.
    node_path: int32 `[..., R, N, D]`, the nodes from the root to the node (inclusive),
      padded with -1; `D` is the longest candidate.
    output_node: int32 `[..., R, O]`, each candidate's last node (its end token), -1 for a
      padding candidate.
  """

  prompt_ids: Array
  prompt_mask: Array
  node_ids: Array
  node_mask: Array
  node_parent: Array
  node_path: Array
  output_node: Array

  def __init__(self, *, prompt_ids, prompt_mask, node_ids, node_mask, node_parent, node_path,
               output_node):
    fields = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, node_ids=node_ids,
                  node_mask=node_mask, node_parent=node_parent, node_path=node_path,
                  output_node=output_node)
    fields = {k: jnp.asarray(v, bool if k.endswith("mask") else jnp.int32)
              for k, v in fields.items()}
    lead = fields["prompt_ids"].shape[:-1]
    n = fields["node_ids"].shape[-1] if fields["node_ids"].ndim else 0
    expected = dict(prompt_mask=fields["prompt_ids"].shape, node_ids=lead + (n,),
                    node_mask=lead + (n,), node_parent=lead + (n,))
    for k, shape in expected.items():
      if fields[k].shape != shape:
        raise ValueError(f"{k}: expected shape {list(shape)}, got {list(fields[k].shape)}")
    if fields["node_path"].shape[:-1] != lead + (n,):
      raise ValueError(f"node_path: expected shape {list(lead + (n,))} + [D], got "
                       f"{list(fields['node_path'].shape)}")
    if fields["output_node"].shape[:-1] != lead:
      raise ValueError(f"output_node: expected shape {list(lead)} + [O], got "
                       f"{list(fields['output_node'].shape)}")
    pytree.set_fields(self, **fields)

  @property
  def num_outputs(self) -> int:
    return self.output_node.shape[-1]

  @property
  def candidate_mask(self) -> Array:
    return self.output_node >= 0

  @property
  def lead_shape(self) -> tuple[int, ...]:
    return self.prompt_ids.shape[:-1]

  def rows(self) -> "CandidateTree":
    return _merge_lead(self, len(self.lead_shape))

  def pad_rows(self, extra: int) -> "CandidateTree":
    return _pad(self.rows(), extra, fills=dict(node_ids=0, node_mask=False, node_parent=-1,
                                               node_path=-1, output_node=-1))


def _merge_lead(tokens, lead_dims: int):
  """Every leading dim merged into one row dim."""
  def merge(x):
    return x.reshape((-1,) + x.shape[lead_dims:])
  return pytree.unvalidated(type(tokens), **{
      f.name: merge(getattr(tokens, f.name)) for f in dataclasses.fields(tokens)})


def _pad(tokens, extra: int, *, fills: dict):
  """`extra` padding rows: a one-token prompt (attention needs a key), `fills` elsewhere."""
  if extra == 0:
    return tokens
  out = {}
  for f in dataclasses.fields(tokens):
    x = getattr(tokens, f.name)
    if f.name == "prompt_mask":
      pad = jnp.zeros((extra,) + x.shape[1:], bool).at[:, -1].set(True)
    else:
      pad = jnp.full((extra,) + x.shape[1:], fills.get(f.name, 0), x.dtype)
    out[f.name] = jnp.concatenate([x, pad])
  return pytree.unvalidated(type(tokens), **out)


def as_tree(tokens) -> "CandidateTree":
  """`tokens` as a `CandidateTree` (packed on the host when given `CandidateTokens`)."""
  return pack_candidates(tokens) if isinstance(tokens, CandidateTokens) else tokens


def pack_candidates(tokens: CandidateTokens, *, num_nodes: int | None = None) -> CandidateTree:
  """The prefix tree of every row's candidates (host-side; concrete `tokens`).

  Args:
    tokens: `CandidateTokens` (any leading dims).
    num_nodes: pad every row to this many nodes (default: the largest tree).
  """
  rows = tokens.rows()
  out_ids, out_mask = np.asarray(rows.output_ids), np.asarray(rows.output_mask)
  r, o, tc = out_ids.shape
  trees = []
  for i in range(r):
    index: dict[tuple[int, ...], int] = {}
    ids, parent, paths, last = [], [], [], np.full(o, -1, np.int32)
    for j in range(o):
      seq = tuple(int(t) for t in out_ids[i, j][out_mask[i, j]])
      if not seq:
        continue
      node, path = -1, []
      for t in range(len(seq)):
        key = seq[:t + 1]
        if key not in index:
          index[key] = len(ids)
          ids.append(seq[t])
          parent.append(node)
          paths.append(path + [len(ids) - 1])
        node = index[key]
        path = paths[node]
      last[j] = node
    trees.append((ids, parent, paths, last))
  n = max(max((len(t[0]) for t in trees), default=0), 1)
  n = _size("num_nodes", num_nodes, n)
  node_ids = np.zeros((r, n), np.int32)
  node_mask = np.zeros((r, n), bool)
  node_parent = np.full((r, n), -1, np.int32)
  node_path = np.full((r, n, tc), -1, np.int32)
  output_node = np.full((r, o), -1, np.int32)
  for i, (ids, parent, paths, last) in enumerate(trees):
    k = len(ids)
    node_ids[i, :k], node_mask[i, :k], node_parent[i, :k] = ids, True, parent
    for m, path in enumerate(paths):
      node_path[i, m, :len(path)] = path
    output_node[i] = last
  lead = tokens.lead_shape
  return CandidateTree(
      prompt_ids=tokens.prompt_ids, prompt_mask=tokens.prompt_mask,
      node_ids=node_ids.reshape(lead + (n,)), node_mask=node_mask.reshape(lead + (n,)),
      node_parent=node_parent.reshape(lead + (n,)),
      node_path=node_path.reshape(lead + (n, tc)), output_node=output_node.reshape(lead + (o,)))


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


def check_prompts_and_outputs(prompts: Sequence[str], outputs: Sequence, *,
                              per_prompt: str) -> None:
  """Clear errors unless there is at least one prompt and one `per_prompt` item for each."""
  if len(prompts) != len(outputs):
    raise ValueError(f"outputs: expected one {per_prompt} per prompt ({len(prompts)}), got "
                     f"{len(outputs)}")
  if not prompts:
    raise ValueError("prompts: expected at least one prompt")


def text_encoder(tokenizer) -> Callable[[str], tuple[int, ...]]:
  """`text -> token ids` without added special tokens (each part of a sequence is encoded on
  its own, then joined), memoized: prompts and candidate sets repeat across states."""
  return functools.lru_cache(maxsize=None)(
      lambda text: tuple(tokenizer.encode(text, add_special_tokens=False)))


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
  check_prompts_and_outputs(prompts, outputs, per_prompt="candidate list")
  eos = end_of_output_id(tokenizer)
  enc = text_encoder(tokenizer)
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


def check_reachable(decode_table, available, *, action_names: Sequence[str] | None = None
                    ) -> None:
  """A clear error when some available action is decoded from no candidate output.

  The model could then never take it: its semantic policy would put probability 0 on an
  action the reference allows, and `KL(Pi || pi_ref)` would hide it. Concrete inputs.

  Args:
    decode_table: int `[..., S, O]`, each candidate's action or `INVALID`.
    available: bool `[..., S, A]`, the actions available in each state (`pi_ref > 0`).
    action_names: optional names of the `A` actions, for the message.
  """
  table, avail = np.asarray(decode_table), np.asarray(available, bool)
  if table.shape[:-1] != avail.shape[:-1]:
    raise ValueError(f"decode_table: expected leading shape {list(avail.shape[:-1])} (the "
                     f"states of `available`), got {list(table.shape)}")
  a = avail.shape[-1]
  reached = np.zeros(avail.shape, bool)
  idx = np.indices(table.shape)
  ok = table >= 0
  reached[tuple(i[ok] for i in idx[:-1]) + (table[ok],)] = True
  missing = avail & ~reached
  if np.any(missing):
    where = tuple(int(i) for i in np.argwhere(missing)[0])
    act = where[-1]
    name = f" ({action_names[act]!r})" if action_names is not None and act < len(
        action_names) else ""
    raise ValueError(f"decode_table: action {act}{name} is available in state {where[:-1]} but "
                     f"no candidate output decodes to it ({int(missing.sum())} such (state, "
                     f"action) pairs of {a} actions); add a candidate for it")


# -- scoring --------------------------------------------------------------------------------


def _expand_cache(cache, copies: int):
  """The cache of `B` prompts repeated `copies` times per row: `B * copies` rows.

  Attention layers' keys and values are repeated in their storage layout; a layer with
  another state (a recurrent layer's batch-leading arrays) is repeated along its leading
  axis; a `None` entry (a KV-shared layer that reads another layer's cache) stays `None`.
  """
  b = cache.valid.shape[0]
  rep2 = lambda x: jnp.repeat(x, copies, axis=0)
  layers = []
  for layer in cache.layers:
    if layer is None:
      layers.append(None)
      continue
    if not isinstance(layer, model_lib.AttentionCache):
      layers.append(jax.tree.map(rep2, layer))
      continue
    k, v = layer.heads(b)                                   # [B, K, L, D]
    kv, length, d = k.shape[1], k.shape[2], k.shape[3]
    shape = type(layer).storage_shape(batch=b * copies, kv_heads=kv, length=length,
                                      head_dim=d)
    rep = lambda x: jnp.broadcast_to(x[:, None], (b, copies) + x.shape[1:]).reshape(shape)
    layers.append(layer.replace(k=rep(k), v=rep(v)))
  return cache.replace(layers=tuple(layers), positions=rep2(cache.positions),
                       valid=rep2(cache.valid), index=cache.index)


def supports_tree(model) -> bool:
  """Whether `model` can run the prefix-tree forward (`CausalLM.tree_hidden_states`).

  A family whose config sets `supports_tree = False` (Qwen3.5: its recurrent layers read
  one sequence in order) is scored per candidate from a prompt cache instead.
  """
  return bool(getattr(model.config, "supports_tree", True))


def tree_candidates(tree: CandidateTree) -> CandidateTokens:
  """The right-padded candidate tokens `[R, O, D]` of a packed tree (traceable).

  Candidate `o` is the node path of its last node; padding candidates have no token.
  """
  path = jnp.take_along_axis(tree.node_path, jnp.maximum(tree.output_node, 0)[..., None],
                             axis=1)                                          # [R, O, D]
  mask = (path >= 0) & tree.candidate_mask[..., None]
  ids = jnp.take_along_axis(tree.node_ids[:, None, :], jnp.maximum(path, 0), axis=-1)
  return pytree.unvalidated(CandidateTokens, prompt_ids=tree.prompt_ids,
                            prompt_mask=tree.prompt_mask, output_ids=jnp.where(mask, ids, 0),
                            output_mask=mask)


def candidate_log_probs(model, tree: CandidateTree, *, temperature: float = 1.0) -> Array:
  """`log p(o | prompt)` of every candidate, `[R, O]` float32, by teacher forcing.

  One packed sequence per state: the prompt, then the prefix tree of its candidates, each
  node seeing the prompt and its ancestors (`CausalLM.tree_hidden_states`: the ancestors are
  gathered, no `[T, T]` mask is built), so a shared prefix is scored once and nothing is
  copied per candidate. Padding candidates get `-1e30`.

  Args:
    model: a `harnax.models.CausalLM`.
    tree: `CandidateTree` with `R` rows (no extra leading dims; see `.rows()`), from
      `pack_candidates`; concrete `CandidateTokens` are packed here.
    temperature: the sampling temperature the probabilities refer to.
  """
  if not supports_tree(model):
    # Exact, without sharing prefixes across candidates: one prefill per prompt, then each
    # candidate continues its own copy of the cache (a recurrent state cannot branch).
    tokens = tree if isinstance(tree, CandidateTokens) else tree_candidates(tree)
    return candidate_log_probs_cached(model, tokens, temperature=temperature)
  if isinstance(tree, CandidateTokens):  # concrete token arrays: pack them here
    tree = pack_candidates(tree)
  hidden = model.tree_hidden_states(tree.prompt_ids, tree.prompt_mask, tree.node_ids,
                                    tree.node_mask, tree.node_path)           # [R, 1 + N, d]
  # A node's token is predicted at its parent's slot (the last prompt slot, 0, for a root).
  slot = jnp.where(tree.node_parent >= 0, 1 + tree.node_parent, 0)
  h = jnp.take_along_axis(hidden, slot[..., None], axis=1)                    # [R, N, d]
  node_lp = logprobs_lib.token_logprobs(model.logits(h), tree.node_ids, temperature=temperature)
  node_lp = jnp.where(tree.node_mask, node_lp, 0.0)
  path = jnp.take_along_axis(tree.node_path, jnp.maximum(tree.output_node, 0)[..., None],
                             axis=1)                                          # [R, O, D]
  lp = jnp.take_along_axis(node_lp[:, None, :], jnp.maximum(path, 0), axis=-1)
  total = jnp.sum(jnp.where(path >= 0, lp, 0.0), axis=-1)
  return jnp.where(tree.candidate_mask, total, ABSENT)


def models_positions(mask: Array) -> Array:
  """Positions of a left-padded prompt batch (`harnax.models.positions_from_mask`)."""
  return model_lib.positions_from_mask(mask)


def candidate_log_probs_cached(model, tokens: CandidateTokens, *,
                               temperature: float = 1.0) -> Array:
  """`candidate_log_probs` from a KV cache: one prefill per prompt, then all `O`
  candidates continue from a copy of its cache (`[R * O]` rows). Same values; more memory
  traffic than the packed tree (the cache is copied per candidate, shared prefixes are
  scored once per candidate). Kept for the benchmark; `candidate_log_probs` falls back to it
  for families without the tree forward (`supports_tree`).
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
  return jnp.where(tokens.candidate_mask, total, ABSENT)


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
  return jnp.where(tokens.candidate_mask, total.reshape(r, o), ABSENT)


SCORERS = {"tree": candidate_log_probs, "cache": candidate_log_probs_cached,
           "unshared": candidate_log_probs_unshared}


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
  method: str = "tree"

  def __call__(self, params, tokens) -> Array:
    model = nnx.merge(self.graphdef, params)
    return SCORERS[self.method](model, tokens, temperature=self.temperature)


def split_model(model, *, temperature: float = 1.0, method: str = "tree"
                ) -> tuple[ScoreFn, Any]:
  """`(score_fn, params)`: the model as a pure scoring function of its state.

  `method`: `"tree"` (packed prefix tree, takes a `CandidateTree`), `"cache"` (KV-cache
  copies) or `"unshared"` (a full forward per candidate); the last two take
  `CandidateTokens`.
  """
  if method not in SCORERS:
    raise ValueError(f"method: expected one of {tuple(SCORERS)}, got {method!r}")
  graphdef, params = nnx.split(model)
  return ScoreFn(graphdef, float(temperature), method), params


# -- micro-batched scoring and the exact gradient ---------------------------------------------


def _chunks(tokens, micro_batch: int):
  """Rows padded to a multiple of `micro_batch` and split: leaves `[C, micro_batch, ...]`."""
  tokens = tokens.rows()
  r = tokens.prompt_ids.shape[0]
  mb = max(1, min(int(micro_batch), r))
  padded = tokens.pad_rows((-r) % mb)
  return jax.tree.map(lambda x: x.reshape((-1, mb) + x.shape[1:]), padded), r


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
  g = jnp.pad(g, ((0, pad), (0, 0))).reshape(chunks.candidate_mask.shape)
  # Padding candidates carry no gradient (their -1e30 is a constant, not a function).
  g = jnp.where(chunks.candidate_mask, g, 0.0)

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


# -- the same, driven from the host: one compilation per micro-batch shape -------------------


@functools.partial(jax.jit, static_argnums=(0,))
def _score_chunk(score_fn, params, chunk):
  return score_fn(params, chunk)


@functools.partial(jax.jit, static_argnums=(0,))
def _pull_chunk(score_fn, params, chunk, cotangent, acc):
  out, vjp = jax.vjp(lambda p: score_fn(p, chunk), params)
  g = jnp.where(chunk.candidate_mask, cotangent, 0.0).astype(out.dtype)
  (grad,) = vjp(g)
  return jax.tree.map(jnp.add, acc, grad)


def _host_chunks(tokens, micro_batch: int):
  tokens = tokens.rows()
  r = tokens.prompt_ids.shape[0]
  mb = max(1, min(int(micro_batch), r))
  padded = tokens.pad_rows((-r) % mb)
  for start in range(0, r, mb):
    yield start, jax.tree.map(lambda x, s=start: x[s:s + mb], padded)


def score_in_chunks(score_fn: Callable, params, tokens, *, micro_batch: int = 64) -> Array:
  """`score_rows` driven from Python: `[R, O]` for `R` rows in any number.

  Each micro-batch is one call of a program compiled once per micro-batch shape, so sets of
  different sizes (every harness of a task family) share one compilation. Not traceable
  (use `score_rows` inside `jit`).
  """
  r = int(np.prod(tokens.lead_shape))
  parts = [_score_chunk(score_fn, params, chunk) for _, chunk in _host_chunks(tokens,
                                                                             micro_batch)]
  return jnp.concatenate(parts)[:r]


def pullback_in_chunks(score_fn: Callable, params, tokens, cotangent: Array, *,
                       micro_batch: int = 64):
  """`pullback` driven from Python (see `score_in_chunks`): `cotangent` `[R, O]`."""
  r = int(np.prod(tokens.lead_shape))
  g = jnp.asarray(cotangent).reshape(r, -1)
  mb = max(1, min(int(micro_batch), r))
  g = jnp.pad(g, ((0, (-r) % mb), (0, 0)))
  acc = jax.tree.map(jnp.zeros_like, params)
  for start, chunk in _host_chunks(tokens, micro_batch):
    acc = _pull_chunk(score_fn, params, chunk, g[start:start + mb], acc)
  return acc


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
  lp = _score_jit(score_fn, params, as_tree(tokens), int(micro_batch))
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
  j, g, _ = _value_and_grad_jit(score_fn, objective, int(micro_batch), params, as_tree(tokens),
                                (mdp, jnp.asarray(decode_table), pi_ref, tau))
  return j, g


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _value_and_grad_jit(score_fn, objective, micro_batch, params, tokens, problem):
  return exact_value_and_grad(score_fn, params, tokens, lambda lp: objective(lp, problem),
                              micro_batch=micro_batch)
