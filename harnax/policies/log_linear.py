"""A log-linear text policy: one weight vector that reads any harness's observation text.

The model scores each candidate output `o` of a state from features of the harness's
*encoded observation text* and of `o` alone,

  log p(o | s) = log_softmax_o( phi(text_H(s), o) . theta ),

so the same `theta` can be deployed on every harness that renders the same task, and
its semantic policy through harness H is the aggregation of `p(o | s)` by H's decoder
(`harnax.harness.aggregate_log_probs`). What the features make of the text is the
task family's business (`harnax.envs.checkbox.text_features`,
`harnax.envs.miniwob.features.text_features`); when a family ties features to line
*positions*, weights trained on one field order read the wrong lines under another:
a readout drift with the optimum unchanged (docs/harness.md).

Everything here is a pure function of arrays, so a batch of instances padded to one
shape is a `jax.vmap` away, and the exact policy gradient is `jax.grad` through
`harnax.core` evaluation (`harnax.train.fit`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from harnax.harness import aggregation
from harnax.harness import interface

Array = jax.Array

# Logit of a padded (non-existent) output: a large finite negative rather than -inf, so
# exp underflows to exactly 0 and no inf - inf reaches the gradient.
_PADDED_LOGIT = -1e9


def output_log_probs(theta: Array, features: Array, output_mask: Array | None = None) -> Array:
  """`log p(o | s)`, `[..., S, O]`; masked (padding) outputs get probability exactly 0.

  Args:
    theta: `[D]` weights.
    features: `[..., S, O, D]`.
    output_mask: bool `[..., O]` (True = a real output), or None when nothing is padded.
  """
  if jnp.ndim(features) < 3 or jnp.shape(features)[-1] != jnp.shape(theta)[-1]:
    raise ValueError(f"features: expected shape [..., S, O, D] with D = {jnp.shape(theta)[-1]} "
                     f"(theta's length), got {list(jnp.shape(features))}")
  logits = jnp.einsum("...sod,d->...so", features, theta)
  if output_mask is not None:
    logits = jnp.where(output_mask[..., None, :], logits, _PADDED_LOGIT)
  return jax.nn.log_softmax(logits, axis=-1)


def semantic_log_policy(theta: Array, features: Array, decode_table: Array, *,
                        num_actions: int, invalid: str = "noop", noop_action: int | None = None,
                        output_mask: Array | None = None) -> Array:
  """`log Pi_H(a | s)` of the model with weights `theta` read through a decoder, `[S, A]`.

  Args:
    theta: `[D]`.
    features: `[S, O, D]` of the harness's text (`feature_table`).
    decode_table: int `[S, O]`, the harness's decoder (`TabularHarness.decode_table`).
    num_actions: A.
    invalid: `"noop"` or `"renormalize"` (`harnax.harness.aggregate_log_probs`).
    noop_action: the action receiving invalid outputs under `"noop"`.
    output_mask: bool `[O]` for padded outputs, or None.
  """
  return aggregation.aggregate_log_probs(
      output_log_probs(theta, features, output_mask), decode_table, num_actions=num_actions,
      invalid=invalid, noop_action=noop_action)


def semantic_policy(theta: Array, features: Array, decode_table: Array, *, num_actions: int,
                    invalid: str = "noop", noop_action: int | None = None,
                    output_mask: Array | None = None) -> Array:
  """`Pi_H(a | s)`, `[S, A]` probabilities; see `semantic_log_policy`."""
  return jnp.exp(semantic_log_policy(theta, features, decode_table, num_actions=num_actions,
                                     invalid=invalid, noop_action=noop_action,
                                     output_mask=output_mask))


def harness_semantic_policy(theta: Array, features: Array, harness: interface.TabularHarness,
                            *, invalid: str = "noop") -> Array:
  """`Pi_H`, `[S, A]`, of the model read through a `TabularHarness` (its decoder and no-op).

  The result puts mass only on actions `harness.pi_ref` allows, so it goes straight into
  `hx.evaluate_policy`, `hx.mismatch`, ... on `harness.mdp`.
  """
  return semantic_policy(theta, features, harness.decode_table, num_actions=harness.num_actions,
                         invalid=invalid,
                         noop_action=harness.noop_action if invalid == "noop" else None)
