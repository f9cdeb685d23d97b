"""Policy families the MiniWoB++ study runs: the log-linear text model and a language model.

A family turns the compiled harnesses of a task family into its own inputs (text features,
or prompt and candidate token ids), reads its parameters through a harness as a semantic
policy `[N, S, A]`, scores candidate outputs (for the top-output flips of the field
reversal), and trains by exact policy gradient. `harnax.studies.miniwob.run_family` runs
the whole protocol with any of them:

* `LogLinearFamily`: one weight vector over text features (`harnax.policies.log_linear`);
  cheap, and its readout drift is built into its line-position features.
* `LMFamily`: a causal LM behind the harness (`harnax.policies.lm`): prompts rendered with
  the tokenizer's chat template, every candidate output scored by teacher forcing with
  the prompt shared, the rest of the model's mass a catch-all that decodes as invalid;
  trained with the exact gradient (tabular cotangent pulled back through the model).

Invalid outputs execute `wait` (`invalid="noop"`) in both, as a MiniWoB++ harness that
ignores an unparseable command wastes a step.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from harnax import train as train_lib
from harnax.core import evaluation
from harnax.core import objectives
from harnax.core import solvers
from harnax.envs.miniwob import features as features_lib
from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob.tasks import SUCCESS_REWARD
from harnax.harness import readout
from harnax.policies import lm
from harnax.policies import log_linear

Array = jax.Array
Log = Callable[[str], None]
WAIT = harnesses_lib.WAIT
HORIZON = 20  # the episode cap of the success rate (the gymnasium environments' truncation)


@functools.partial(jax.jit, static_argnames=("horizon",))
def success_within(policy: Array, mdp, horizon: int = HORIZON) -> Array:
  """Probability of a successful finish (raw reward 1) within `horizon` steps, `[N]`.

  Exact: the state distribution is propagated, nothing sampled. `policy` `[N, S, A]`, `mdp`
  stacked `[N, ...]`.
  """
  def one(m, pol):
    hit = (m.rewards >= SUCCESS_REWARD).astype(pol.dtype)     # [S, A] successful finishes

    def step(dist, _):
      flow = dist[:, None] * pol                               # [S, A]
      return jnp.einsum("sa,sat->t", flow, m.transitions), jnp.sum(flow * hit)

    _, per_step = jax.lax.scan(step, m.initial, None, length=horizon)
    return jnp.sum(per_step)
  return jax.vmap(one)(mdp, policy)


class PolicyFamily(Protocol):
  """What `run_family` needs of a policy family (module doc)."""

  name: str

  def prepare(self, compiled: Sequence[harnesses_lib.CompiledHarness]) -> None:
    """Sees every compiled harness of the run once (fixes padded sizes)."""

  def inputs(self, compiled: Sequence[harnesses_lib.CompiledHarness], shape) -> Any:
    """The family's inputs of `N` instances padded to `shape = (S, A, O)`."""

  def initial_params(self) -> Any:
    """The parameters before any post-training (the base model)."""

  def output_log_probs(self, params, batch) -> Array:
    """`log p(o | s)` of the candidates, `[N, S, O]`."""

  def semantic_policy(self, params, batch) -> Array:
    """`Pi(a | s)`, `[N, S, A]`, read through the batch's harness."""

  def train(self, params, batch, *, tau: float, steps: int, name: str = "",
            log: Log | None = None) -> tuple[Any, np.ndarray]:
    """`(params, J before each step [steps])` after `steps` exact-gradient steps."""


# -- the log-linear text model ----------------------------------------------------------------


@dataclasses.dataclass
class LogLinearFamily:
  """The log-linear model over MiniWoB++ text features, trained by Adam on exact J."""

  learning_rate: float = 0.1
  name: str = "log-linear"

  def prepare(self, compiled) -> None:
    del compiled

  def inputs(self, compiled, shape) -> Array:
    s_max, _, o_max = shape
    feats = []
    for c in compiled:
      h = c.harness
      phi = np.zeros((s_max, o_max, features_lib.NUM_FEATURES))
      phi[:h.num_states, :h.num_outputs] = features_lib.harness_features(c)
      feats.append(phi)
    return jnp.asarray(np.stack(feats))

  def initial_params(self) -> Array:
    return jnp.zeros(features_lib.NUM_FEATURES, jnp.result_type(float))

  def output_log_probs(self, params, batch) -> Array:
    return log_linear.output_log_probs(params, batch.inputs, batch.output_mask)

  def semantic_policy(self, params, batch) -> Array:
    num_actions = batch.pi_ref.shape[-1]

    def one(features, mask, table):
      return log_linear.semantic_policy(params, features.astype(batch.pi_ref.dtype), table,
                                        num_actions=num_actions, invalid="noop",
                                        noop_action=WAIT, output_mask=mask)
    return jax.vmap(one)(batch.inputs, batch.output_mask, batch.decode_table)

  def train(self, params, batch, *, tau, steps, name="", log=None):
    del name, log
    dtype = batch.pi_ref.dtype
    out = train_lib.fit(_log_linear_return, jnp.asarray(params, dtype),
                        (batch, jnp.asarray(tau, dtype)),
                        optimizer=train_lib.adam(float(self.learning_rate)), num_steps=int(steps))
    return out.params, np.asarray(out.values)


def _log_linear_return(theta, data):
  batch, tau = data
  pol = LogLinearFamily().semantic_policy(theta, batch)
  values = jax.vmap(lambda m, p, r: evaluation.evaluate_policy(m, p, r, tau).value)(
      batch.mdp, pol, batch.pi_ref)
  return jnp.mean(values)


# -- a language model -------------------------------------------------------------------------


class LMInputs(NamedTuple):
  """The LM's inputs of a padded batch: only real states are scored.

  Attributes:
    tree: `CandidateTree` with one row per real state of every instance (`R` rows).
    index: int32 `[R]`, each row's flat index `n * S + s` in the `[N, S]` state grid.
  """

  tree: lm.CandidateTree
  index: Array


@dataclasses.dataclass
class LMFamily:
  """A causal LM behind the harness (module doc), post-trained by exact policy gradient.

  Only the real states of the padded batch are scored (padded states decode to `wait`, as
  they must), each micro-batch by one program compiled once per family.

  Attributes:
    model: the base `CausalLM` (its parameters are `initial_params()`; never modified).
    tokenizer: its `harnax.models.Tokenizer` (chat template, eos = end of output).
    learning_rate: Adam step size.
    micro_batch: states per micro-batch of the model passes (bounds memory).
    train_config: fields over `harnax.train.default_config()` for every post-training run
      (optimizer, schedule, clipping, LoRA, bf16, checkpoints); `num_steps` comes from the
      study.
    workdir: each run's metrics (`metrics.jsonl`: J, success, grad norm per step) and
      checkpoints go to `workdir/<run name>` (resumable); None: a temporary directory.
    progress: the loop's progress bar on stderr.
  """

  model: Any
  tokenizer: Any
  learning_rate: float = 3e-3
  micro_batch: int = 32
  train_config: Any = None
  workdir: str | None = None
  progress: bool = False
  name: str = "LM"
  prompt_length: int = 0
  output_length: int = 0
  num_nodes: int = 0

  def __post_init__(self):
    graphdef, self._params = nnx.split(self.model)
    self._score = lm.ScoreFn(graphdef)

  def _encode(self, c: harnesses_lib.CompiledHarness) -> lm.CandidateTokens:
    prompts = [lm.render_prompt(self.tokenizer, c.observation(s))
               for s in range(c.harness.num_states)]
    return lm.encode_candidates(self.tokenizer, prompts, [c.outputs] * len(prompts))

  def prepare(self, compiled) -> None:
    tp = tc = nodes = 0
    for c in compiled:
      t = self._encode(c)
      tp, tc = max(tp, t.prompt_ids.shape[-1]), max(tc, t.output_ids.shape[-1])
      # Every state of an instance has the same candidates: one tree per instance.
      tree = lm.pack_candidates(jax.tree.map(lambda x: x[:1], t))
      nodes = max(nodes, tree.node_ids.shape[-1])
    self.prompt_length, self.output_length, self.num_nodes = tp, tc, nodes

  def inputs(self, compiled, shape) -> LMInputs:
    s_max, _, o_max = shape
    if not self.prompt_length:
      self.prepare(compiled)
    tp, tc = self.prompt_length, self.output_length
    pad = self.tokenizer.pad_token_id or 0
    rows = sum(c.harness.num_states for c in compiled)
    p_ids = np.full((rows, tp), pad, np.int32)
    p_mask = np.zeros((rows, tp), bool)
    o_ids = np.full((rows, o_max, tc), pad, np.int32)
    o_mask = np.zeros((rows, o_max, tc), bool)
    index, r = [], 0
    for n, c in enumerate(compiled):
      h = c.harness
      lm.check_reachable(h.decode_table, np.asarray(h.pi_ref) > 0, action_names=h.action_names)
      t = self._encode(c)
      s, o = t.output_ids.shape[:2]
      w, l = t.prompt_ids.shape[-1], t.output_ids.shape[-1]
      if w > tp or l > tc:
        raise ValueError(f"compiled: {c!r} needs prompts of {w} and outputs of {l} tokens, "
                         f"more than prepare() saw ({tp}, {tc})")
      p_ids[r:r + s, tp - w:], p_mask[r:r + s, tp - w:] = t.prompt_ids, t.prompt_mask
      o_ids[r:r + s, :o, :l], o_mask[r:r + s, :o, :l] = t.output_ids, t.output_mask
      index += [n * s_max + k for k in range(s)]
      r += s
    tokens = lm.CandidateTokens(prompt_ids=p_ids, prompt_mask=p_mask, output_ids=o_ids,
                                output_mask=o_mask)
    return LMInputs(lm.pack_candidates(tokens, num_nodes=self.num_nodes),
                    jnp.asarray(index, jnp.int32))

  def initial_params(self):
    return self._params

  def output_log_probs(self, params, batch) -> Array:
    rows = lm.score_in_chunks(self._score, params, batch.inputs.tree,
                              micro_batch=self.micro_batch)
    return _to_grid(rows, batch.inputs.index, batch.decode_table.shape)

  def semantic_policy(self, params, batch) -> Array:
    lp = self.output_log_probs(params, batch)
    return _semantic(lp, batch.decode_table, batch.pi_ref)

  def value_and_grad(self, params, batch, tau):
    """Exact `(J, grads, metrics)`: mean `J` over the batch's instances, its gradient with
    respect to `params`, and metrics (means over instances): the success within the
    episode cap, the ceiling `C`, the mismatch `M = C - J` and the centred score error
    (`score_error_rms`)."""
    rows = lm.score_in_chunks(self._score, params, batch.inputs.tree,
                              micro_batch=self.micro_batch)
    tau = jnp.asarray(tau, batch.pi_ref.dtype)
    (j, metrics), g_rows = _tabular_value_and_grad(rows, batch.inputs.index, batch.mdp,
                                                   batch.decode_table, batch.pi_ref, tau)
    grads = lm.pullback_in_chunks(self._score, params, batch.inputs.tree, g_rows,
                                  micro_batch=self.micro_batch)
    return j, grads, metrics

  def loop_config(self, steps: int):
    """The `harnax.train` config of one post-training run (`train_config` over Adam)."""
    c = train_lib.default_config()
    c.optimizer, c.learning_rate, c.num_steps = "adam", float(self.learning_rate), int(steps)
    c.checkpoint_every, c.log_every = 0, 0
    if self.train_config is not None:
      c.update(dict(self.train_config))
      c.num_steps = int(steps)
    return c

  def train(self, params, batch, *, tau, steps, name="", log=None):
    del log
    if int(steps) == 0:
      return params, np.zeros(0)
    fn = functools.partial(_bound_value_and_grad, self, float(tau))
    if self.workdir:
      return self._run(fn, params, batch, steps, os.path.join(self.workdir, name or "run"))
    with tempfile.TemporaryDirectory() as workdir:
      return self._run(fn, params, batch, steps, workdir)

  def _run(self, fn, params, batch, steps, workdir):
    out = train_lib.train(self.loop_config(steps), fn, params, batch, workdir=workdir,
                          progress=self.progress, traceable=False)
    return out.params, np.array([r["value"] for r in out.history])


def _bound_value_and_grad(family, tau, params, batch):
  return family.value_and_grad(params, batch, tau)


def _to_grid(rows, index, grid_shape):
  """`[R, O]` row log-probs -> `[N, S, O]` (states without a row: no candidate)."""
  n, s, o = grid_shape
  table = jnp.full((n * s, rows.shape[-1]), lm.ABSENT, rows.dtype).at[index].set(rows)
  return table.reshape(n, s, -1)[..., :o]


@jax.jit
def _semantic(lp, decode_table, pi_ref):
  pol = jnp.exp(lm.semantic_log_policy_from_outputs(
      lp, decode_table, num_actions=pi_ref.shape[-1], invalid="noop", noop_action=WAIT))
  return pol.astype(pi_ref.dtype)


@jax.jit
def _tabular_value_and_grad(rows, index, mdp, decode_table, pi_ref, tau):
  objective = lm.lm_objective(pi_ref.shape[-1], "noop", WAIT)

  def value(x):
    lp = _to_grid(x, index, decode_table.shape)
    success = jnp.mean(success_within(_semantic(lp, decode_table, pi_ref), mdp))
    return objective(lp, (mdp, decode_table, pi_ref, tau)), jax.lax.stop_gradient(success)
  (j, success), g = jax.value_and_grad(value, has_aux=True)(rows)
  log_pol = lm.semantic_log_policy_from_outputs(
      _to_grid(rows, index, decode_table.shape), decode_table, num_actions=pi_ref.shape[-1],
      invalid="noop", noop_action=WAIT).astype(pi_ref.dtype)

  def per_instance(m, lp, r):  # one soft-Bellman solve serves C and pi*
    sol = solvers.solve_soft_bellman(m, r, tau)
    return (objectives.ceiling(m, r, tau, solution=sol),
            score_error_rms(m, lp, r, tau, optimal=sol.policy))
  ceilings, errors = jax.vmap(per_instance)(mdp, log_pol, pi_ref)
  ceiling, err = jnp.mean(ceilings), jnp.mean(errors)
  return (j, {"success": success, "ceiling": ceiling, "mismatch": ceiling - j,
              "score_error": err}), g


def score_error_rms(mdp, log_policy: Array, pi_ref: Array, tau, *,
                    optimal: Array | None = None) -> Array:
  """Root-mean-square centred score error of a policy, `[]`, weighted by its occupancy.

  `eps(s, .) = c(tau log Pi(.|s) - tau log pi*(.|s))` over the available actions
  (`harnax.harness.score_error`; docs/estimation.md §5), averaged over them and over states
  drawn from the policy's normalized discounted occupancy `d_Pi`:
  `sqrt(sum_s d_Pi(s) mean_{A_s} eps(s, a)^2)`. Zero iff `Pi = pi*` wherever it goes.
  `optimal`: pi* when already solved (else solved here).
  """
  star = optimal if optimal is not None else solvers.solve_soft_bellman(mdp, pi_ref, tau).policy
  avail = pi_ref > 0
  f_star = tau * jnp.log(jnp.where(avail, star, 1.0))
  eps = readout.score_error(jnp.where(avail, log_policy, 0.0), f_star, pi_ref, tau)
  per_state = jnp.sum(eps ** 2, -1) / jnp.maximum(jnp.sum(avail, -1), 1)
  d = evaluation.occupancy(mdp, jnp.exp(log_policy))
  return jnp.sqrt(jnp.sum(d * per_state))
