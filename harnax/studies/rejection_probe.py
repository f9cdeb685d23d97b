"""What models answer at the states right after the monitor rejected an action (docs/had.md,
"Where the distilled students lose").

An evaluation log (`had_study.evaluations`) keeps every turn's full context, so the states one
model reached can be shown to other models: `after_rejection(records)` picks, in each episode,
the first turn whose action the harness's monitor rejected and returns the context of the turn
after it; `repeats(generate, states)` counts the answers there that repeat the rejected action,
and `output_logprobs` scores an answer under any model (how likely the teacher found the
answer a distilled student gives).
Asked on the same states, a distilled student, the student before distillation and the teacher
differ only in their weights, so a difference in how often they repeat is learned, not a
difference in the states they happened to reach.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from harnax.models import logprobs
from harnax.policies import text_agent
from harnax.studies import text_metrics
from harnax.train import rollouts
from harnax.train import sft


@dataclasses.dataclass(frozen=True)
class ProbeState:
  """The turn after a rejected action.

  Attributes:
    episode: the episode's id in its log.
    turn: the index of the turn whose context this is (the rejected one is `turn - 1`).
    context: that turn's context, as the model was shown it.
    rejected: the rejected action (normalized, as logged).
    output: what the evaluated model wrote there (from the log).
  """

  episode: int
  turn: int
  context: str
  rejected: str
  output: str


def after_rejection(records: Sequence[dict], *, verb: str | None = None) -> list[ProbeState]:
  """Per episode of a rollout log, the turn after its first rejected action (whose first word
  is `verb`, when given); episodes without one, or ending on it, give none."""
  out = []
  for episode, recs in sorted(rollouts.episodes(records).items()):
    turns = [r for r in recs if r.get("kind") == "turn"]
    for i, r in enumerate(turns[:-1]):
      action = r.get("action") or ""
      if verb is not None and action.split(" ", 1)[0] != verb:
        continue
      if action and not (r.get("harness") or {}).get("accepted", True):
        nxt = turns[i + 1]
        out.append(ProbeState(episode=int(episode), turn=i + 1, context=nxt["context"],
                              rejected=action, output=nxt.get("output", "")))
        break
  return out


def logged_repeats(records: Sequence[dict]) -> text_metrics.Rate:
  """Of every turn that follows a rejected action in a rollout log (not only the first per
  episode), the share whose action is that rejected action: how often the logged model
  repeated (a training rollout's sampled turns as well as a greedy evaluation's)."""
  after = same = 0
  for _, recs in sorted(rollouts.episodes(records).items()):
    turns = [r for r in recs if r.get("kind") == "turn"]
    for r, nxt in zip(turns, turns[1:]):
      if r.get("action") and not (r.get("harness") or {}).get("accepted", True):
        after += 1
        same += nxt.get("action") == r.get("action")
  return text_metrics.Rate(successes=same, trials=after)


def training_repeats(workdir: str) -> text_metrics.Rate:
  """`logged_repeats` over every update's rollout log of a distillation run
  (`<workdir>/rollouts/step_*.jsonl`; the `pairs_step_*.jsonl` files beside them are not
  rollout logs and are not read)."""
  paths = sorted(glob.glob(os.path.join(workdir, "rollouts", "step_*.jsonl")))
  if not paths:
    raise ValueError(f"workdir: {workdir!r} kept no rollout logs (rollouts/step_*.jsonl)")
  per_update = [logged_repeats(rollouts.read_log(path)) for path in paths]
  return text_metrics.Rate(successes=sum(r.successes for r in per_update),
                           trials=sum(r.trials for r in per_update))


def repeats(generate: Callable[[list[str]], list[str]], states: Sequence[ProbeState], *,
            batch_size: int = 8) -> tuple[text_metrics.Rate, list[str]]:
  """`(Rate of answers whose action is the rejected one, the answers)`.

  Args:
    generate: contexts -> output texts (e.g. a greedy `rollouts.LMGenerator`'s texts).
    states: from `after_rejection`.
    batch_size: contexts per call of `generate`.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
  outputs: list[str] = []
  for i in range(0, len(states), batch_size):
    chunk = [s.context for s in states[i:i + batch_size]]
    got = list(generate(chunk))
    if len(got) != len(chunk):
      raise ValueError(f"generate: expected {len(chunk)} outputs for {len(chunk)} contexts, "
                       f"got {len(got)}")
    outputs += got
  same = sum(text_agent.parse_output(o).action == s.rejected for o, s in zip(outputs, states))
  return text_metrics.Rate(successes=int(same), trials=len(states)), outputs


def greedy(model, tokenizer, *, max_new_tokens: int) -> Callable[[list[str]], list[str]]:
  """A `generate` for `repeats`: greedy decoding as the evaluations decode."""
  generator = rollouts.LMGenerator(model, tokenizer, max_new_tokens=max_new_tokens)
  return lambda contexts: [g.text for g in generator(contexts)]


def output_logprobs(model, tokenizer, contexts: Sequence[str], outputs: Sequence[str], *,
                    batch_size: int = 8) -> np.ndarray:
  """`[N]` total log-probability (nats) of each output, its end token included, after its
  context's prompt (`text_agent.format_prompt` with its defaults, as `rollouts.LMGenerator`
  renders it), teacher-forced under `model`."""
  if len(outputs) != len(contexts):
    raise ValueError(f"outputs: expected {len(contexts)} (one per context), got {len(outputs)}")
  if batch_size < 1:
    raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
  out = []
  for i in range(0, len(contexts), batch_size):
    prompts = [text_agent.format_prompt(tokenizer, c) for c in contexts[i:i + batch_size]]
    data = sft.encode_examples(tokenizer, prompts, list(outputs[i:i + batch_size]))
    lp = logprobs.sequence_logprobs(model, jnp.asarray(data.ids),
                                    jnp.asarray(data.attention_mask))
    out.append(np.sum(np.where(data.loss_mask, np.asarray(lp), 0.0), axis=1))
  return np.concatenate(out) if out else np.zeros(0)
