"""The validation driver: random and optimal episodes under H0–H5, compared.

`validate` replays, per page seed and harness, a few episodes uniform over the
available actions and one greedy in the soft-optimal policy, and compares each
with its compiled MDP (`compare`). What is compared: docs/browser.md.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.envs.miniwob import tasks as tasks_lib
from harnax.envs.miniwob.browser import disagreements as disagreements_lib
from harnax.envs.miniwob.browser import episodes as episodes_lib
from harnax.envs.miniwob.browser import policies as policies_lib
from harnax.envs.miniwob.browser import session as session_lib


@dataclasses.dataclass(frozen=True)
class Validation:
  """What `validate` replayed and what it found.

  Attributes:
    replays: every replayed episode in order: per seed, per harness, the
      random sequences then the optimal one.
    sequences: the label of each replay (`"random-<k>"` or `"optimal"`).
    disagreements: every `Disagreement` of those replays (empty: the pages
      and the compiled MDPs agree).
  """

  replays: tuple[episodes_lib.Replay, ...]
  sequences: tuple[str, ...]
  disagreements: tuple[disagreements_lib.Disagreement, ...]


def validate(family: str, seeds: Sequence[int], num_random_sequences: int = 2, *,
             harnesses: Sequence[str] = harnesses_lib.HARNESSES, sequence_seed: int = 0,
             max_steps: int = 8, tau: float = 0.05,
             session: session_lib.BrowserSession | None = None) -> Validation:
  """Replays random and optimal action sequences and lists every disagreement.

  For each seed and harness: `num_random_sequences` episodes choosing
  uniformly among the available actions (NumPy generator seeded by
  `[sequence_seed, seed, harness index, k]`) for at most `max_steps` actions,
  and one episode greedy in the soft-optimal policy at temperature `tau`,
  solved once for the episode's compiled harness. Compared per step
  (`compare`): the harness state (page state and verified flag), the raw
  reward, the sign of the env reward, the elements the page shows, and that
  every observed state is reachable in the MDP.

  Args:
    family: one of `tasks.FAMILIES`.
    seeds: page seeds.
    num_random_sequences: random episodes per seed and harness.
    harnesses: harness names.
    sequence_seed: seed of the random sequences.
    max_steps: most actions per episode.
    tau: temperature of the optimal policy.
    session: a `BrowserSession` to reuse (default: one for this call).

  Returns:
    `Validation`: the replays, their labels and the disagreements.
  """
  tasks_lib.task_type(family)
  names = [harnesses_lib.harness_spec(h).name for h in harnesses]
  if not isinstance(num_random_sequences, (int, np.integer)) or num_random_sequences < 0:
    raise ValueError(f"num_random_sequences: expected a non-negative int, got "
                     f"{num_random_sequences!r}")
  if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
    raise ValueError(f"max_steps: expected a positive int, got {max_steps!r}")
  if session is None:
    with session_lib.BrowserSession() as own:
      return validate(family, seeds, num_random_sequences, harnesses=names,
                      sequence_seed=sequence_seed, max_steps=max_steps, tau=tau, session=own)
  replays, sequences, found = [], [], []
  for seed in seeds:
    for h in names:
      for k in range(num_random_sequences + 1):
        start = episodes_lib.start_episode(family, seed, h, session=session)
        if k < num_random_sequences:
          label = f"random-{k}"
          policy = policies_lib.random_policy(np.random.default_rng(
              [sequence_seed, int(seed), harnesses_lib.HARNESSES.index(h), k]))
        else:
          label = "optimal"
          policy = policies_lib.optimal_policy(start.compiled, tau=tau)
        result = episodes_lib.play_episode(start, policy, max_steps=max_steps)
        replays.append(result)
        sequences.append(label)
        found += disagreements_lib.compare(result, sequence=label)
  return Validation(replays=tuple(replays), sequences=tuple(sequences),
                    disagreements=tuple(found))
