"""HAD's preference data: teacher queries with and without the harness, the validity filter,
and the student's action scores after its own reasoning (docs/distillation.md).

At a state the student visited, the student wrote `Think: <reasoning>` and an action. The same
teacher is asked twice: with the harnessed context (its action is `a⁺`) and with the harness
parts deleted (`a⁻`). :func:`preference_labels` turns the two teacher outputs into
`(a⁺, a⁻, differ, valid)`:

* `differ` is false where either output has no parsable action (counted, never an error) or
  the two actions are the same after normalization;
* `valid` is false where `a⁺` contradicts the harness record (`Record.contradiction`).

:func:`against_reasoning` tells the pairs whose `a⁺` is another action than the one the
student's reasoning named and the student took (a study's option leaves them out; docs/had.md).

:func:`encode_action_pairs` builds, per state, the two sequences
`prompt(context) + "Think: " + reasoning + "\\nAction: " + a±` and marks the action's tokens
only; :func:`preference_loss` scores both with the student (`score_spans`: mean log-prob of the
action tokens) and applies :func:`harnax.train.distill.action_preference_loss`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from harnax.models import logprobs as logprobs_lib
from harnax.policies import lm as lm_lib
from harnax.policies import text_agent
from harnax.train import distill


@dataclasses.dataclass(frozen=True)
class PreferenceLabels:
  """The teacher's two actions at `N` states.

  Attributes:
    positive, negative: `a⁺` (with the harness) and `a⁻` (without), "" where unparsable.
    differ: [N] bool, both parsed and different (the term is active only there).
    valid: [N] bool, `a⁺` does not contradict the harness record.
    unparsable: [N] bool, a teacher output had no action (counted, the pair is inactive).
    reasons: why `a⁺` was found invalid, per state (None when valid).
  """

  positive: tuple[str, ...]
  negative: tuple[str, ...]
  differ: np.ndarray
  valid: np.ndarray
  unparsable: np.ndarray
  reasons: tuple[str | None, ...]


def preference_labels(with_harness: Sequence[str], without_harness: Sequence[str],
                      records: Sequence) -> PreferenceLabels:
  """`(a⁺, a⁻, differ, valid)` from the teacher's outputs and the harness records.

  Args:
    with_harness: [N] the teacher's outputs given the harnessed contexts.
    without_harness: [N] its outputs given the same contexts without the harness parts.
    records: [N] the harness record at each state (anything with `contradiction(action)`).
  """
  if not len(with_harness) == len(without_harness) == len(records):
    raise ValueError(f"with_harness, without_harness, records: expected one per state, got "
                     f"{len(with_harness)}, {len(without_harness)}, {len(records)}")
  pos, neg, differ, valid, bad, reasons = [], [], [], [], [], []
  for out_p, out_n, record in zip(with_harness, without_harness, records):
    a_p = text_agent.parse_output(out_p).action
    a_n = text_agent.parse_output(out_n).action
    unparsable = a_p is None or a_n is None
    reason = record.contradiction(a_p) if a_p is not None else None
    pos.append(a_p or "")
    neg.append(a_n or "")
    bad.append(unparsable)
    differ.append(not unparsable and a_p != a_n)
    valid.append(reason is None)
    reasons.append(reason)
  return PreferenceLabels(tuple(pos), tuple(neg), np.array(differ, bool), np.array(valid, bool),
                          np.array(bad, bool), tuple(reasons))


def names_action(reasoning: str, action: str) -> bool:
  """Whether `reasoning` names `action`: the action's words, in order, as whole words, case
  and spacing ignored ("go to cabinet 1" is not named by "go to cabinet 10"). A paraphrase
  ("put the apple in" for "move apple 1 to") names nothing."""
  if not action or not action.strip():
    return False
  pattern = r"\b" + r"\s+".join(re.escape(w) for w in action.lower().split()) + r"\b"
  return re.search(pattern, (reasoning or "").lower()) is not None


def against_reasoning(reasoning: str, action: str | None, positive: str) -> bool:
  """Whether a pair's `a⁺` goes against the student's reasoning: the reasoning names the
  action the student took, and `a⁺` is another (parsed) action. The term then favours, after
  that same reasoning, an action it did not lead to."""
  return bool(positive) and positive != action and names_action(reasoning, action or "")


@dataclasses.dataclass(frozen=True)
class ActionPairs:
  """`2N` right-padded sequences: rows `2i` (with `a⁺`) and `2i + 1` (with `a⁻`).

  Attributes:
    ids: int32 [2N, T]; attention_mask: bool [2N, T]; action_mask: bool [2N, T], true on the
      action's tokens only (not the prompt, not the reasoning, not the end token).
  """

  ids: np.ndarray
  attention_mask: np.ndarray
  action_mask: np.ndarray


def encode_action_pairs(tokenizer, contexts: Sequence[str], reasonings: Sequence[str],
                        positives: Sequence[str], negatives: Sequence[str], *,
                        chat: bool | None = None, pad_id: int | None = None) -> ActionPairs:
  """The student's two scoring sequences per state (see the module docstring).

  Each part (prompt, reasoning prefix, action) is encoded on its own and joined, so the action
  tokens are exactly the tokens of the action text. An empty action (an unparsable teacher
  output) is encoded as one "look" so shapes stay static; its pair must be inactive.
  """
  n = len(contexts)
  if not n or not len(reasonings) == len(positives) == len(negatives) == n:
    raise ValueError("contexts, reasonings, positives, negatives: expected one each per state "
                     f"(at least one), got {len(contexts)}, {len(reasonings)}, {len(positives)},"
                     f" {len(negatives)}")
  enc = lm_lib.text_encoder(tokenizer)
  rows = []
  for context, reasoning, a_p, a_n in zip(contexts, reasonings, positives, negatives):
    prompt = enc(text_agent.format_prompt(tokenizer, context, chat=chat))
    prefix = enc(f"Think: {reasoning.strip()}\nAction: ")
    for action in (a_p, a_n):
      rows.append((prompt + prefix, enc(action.strip() or "look")))
  t = max(len(p) + len(a) for p, a in rows)
  pad = pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
  ids = np.full((2 * n, t), pad, np.int32)
  attention = np.zeros((2 * n, t), bool)
  action = np.zeros((2 * n, t), bool)
  for i, (p, a) in enumerate(rows):
    ids[i, :len(p)], ids[i, len(p):len(p) + len(a)] = p, a
    attention[i, :len(p) + len(a)] = True
    action[i, len(p):len(p) + len(a)] = True
  return ActionPairs(ids, attention, action)


def action_means(model, pairs: ActionPairs):
  """(ℓ̄(a⁺) [N], ℓ̄(a⁻) [N]): the student's mean action-token log-probs of each pair."""
  score = logprobs_lib.score_spans(model, jnp.asarray(pairs.ids),
                                   jnp.asarray(pairs.attention_mask),
                                   jnp.asarray(pairs.action_mask))
  return score.mean[0::2], score.mean[1::2]


def preference_loss(model, pairs: ActionPairs, differ, valid, *, beta: float = 1.0):
  """HAD's preference term for a batch of states; returns (loss, number of active pairs)."""
  positive, negative = action_means(model, pairs)
  return distill.action_preference_loss(positive, negative, jnp.asarray(differ),
                                        jnp.asarray(valid), beta=beta)
