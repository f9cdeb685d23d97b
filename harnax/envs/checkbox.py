"""A toy harness family: 'check the right boxes', and text features for a log-linear policy.

Task: three checkboxes `alpha, bravo, charlie`; the instruction names the
targets (default `alpha` and `charlie`). States `0..7` are the bitmask of
checked boxes, state 8 is the absorbing end. Semantic actions toggle a box,
`submit` (reward 1 iff exactly the targets are checked, then the end) or
`wait`; discount 0.9, start with nothing checked, uniform `pi_ref`.

Harness variants (the harness-transfer study's H0, a batch-action harness, and a field flip):

* `"base"` (H0): one click per step. Candidate outputs `click X`, `toggle X`
  (both decode to the same action), `submit`, `wait`, and two invalid ones
  (`scroll down`, `click delta`) that execute as `wait` under
  `invalid="noop"`.
* `"batch"` (H1): adds `click X and Y`, executing two toggles at once. This
  changes *execution*: the optimum, and its ceiling, move.
* `"reversed"` (H2): H0 with the observation fields in reverse order. Only the
  *representation* changes: same MDP, same optimum.

`text_features` feeds the log-linear policy (`harnax.policies.log_linear`): for
`click X` it reads the line that mentions X and fires one indicator per (line
position, checkbox glyph, X named in the task line). Weights are therefore tied to
positions: trained on H0 they read the wrong lines under H2, a readout drift with
zero target shift.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from harnax.core import mdp as mdp_lib
from harnax.harness import interface

Array = jax.Array

LABELS = ("alpha", "bravo", "charlie")
VARIANTS = ("base", "batch", "reversed")
NAMES = {"base": "H0", "batch": "H1", "reversed": "H2"}
_PAIRS = ((0, 1), (0, 2), (1, 2))
_GLYPHS = ("[ ]", "[x]", "-")
_NUM_LINES = 1 + len(LABELS)
_DONE = 2 ** len(LABELS)


def _action_names(batch: bool) -> tuple[str, ...]:
  names = [f"click {x}" for x in LABELS] + ["submit", "wait"]
  if batch:
    names += [f"click {LABELS[i]}+{LABELS[j]}" for i, j in _PAIRS]
  return tuple(names)


def _output_names(batch: bool) -> tuple[str, ...]:
  outs = [f"click {x}" for x in LABELS] + [f"toggle {x}" for x in LABELS]
  outs += ["submit", "wait", "scroll down", "click delta"]
  if batch:
    outs += [f"click {LABELS[i]} and {LABELS[j]}" for i, j in _PAIRS]
  return tuple(outs)


def _fields(targets):
  task = "check " + " and ".join(targets)

  def fields(state):
    if state == _DONE:
      return [("task", "done")] + [(x, "-") for x in LABELS]
    return [("task", task)] + [(x, "[x]" if state >> i & 1 else "[ ]")
                               for i, x in enumerate(LABELS)]
  return fields


def _decoder(actions):
  index = {n: i for i, n in enumerate(actions)}

  def decode(state, output: str) -> int:
    del state  # the same parser in every state
    verb, _, rest = output.partition(" ")
    if output in ("submit", "wait"):
      return index[output]
    if verb not in ("click", "toggle") or not rest:
      return interface.INVALID
    items = rest.split(" and ")
    if any(x not in LABELS for x in items) or len(set(items)) != len(items):
      return interface.INVALID
    items = sorted(items, key=LABELS.index)
    return index.get("click " + "+".join(items), interface.INVALID)
  return decode


def _semantic_mdp(actions, target_mask: int, discount: float, dtype) -> mdp_lib.TabularMDP:
  s, a = _DONE + 1, len(actions)
  p = np.zeros((s, a, s))
  r = np.zeros((s, a))
  for st in range(_DONE):
    for k, name in enumerate(actions):
      if name == "submit":
        p[st, k, _DONE] = 1.0
        r[st, k] = float(st == target_mask)
      elif name == "wait":
        p[st, k, st] = 1.0
      else:
        mask = sum(1 << LABELS.index(x) for x in name[len("click "):].split("+"))
        p[st, k, st ^ mask] = 1.0
  p[_DONE, :, _DONE] = 1.0
  mu0 = np.zeros(s)
  mu0[0] = 1.0
  return mdp_lib.TabularMDP(transitions=p.astype(dtype), rewards=r.astype(dtype),
                            discount=np.asarray(discount, dtype), initial=mu0.astype(dtype))


def checkbox_harness(variant: str = "base", *, targets=("alpha", "charlie"),
                     discount: float = 0.9, dtype=None) -> interface.TabularHarness:
  """One harness of the checkbox family.

  Args:
    variant: `"base"` (H0), `"batch"` (H1) or `"reversed"` (H2).
    targets: labels the instruction asks to check.
    discount: gamma.
    dtype: float dtype (default: JAX's default float).

  Returns:
    `TabularHarness` with S = 9 states; A = 5 (8 with batch actions); O = 10
    (13); `noop_action` = `wait`; a `FieldEncoder` with 4 fields.
  """
  if variant not in VARIANTS:
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
  targets = tuple(targets)
  if not targets or any(t not in LABELS for t in targets) or len(set(targets)) != len(targets):
    raise ValueError(f"targets: expected distinct labels from {LABELS}, got {targets}")
  dtype = jax.dtypes.canonicalize_dtype(dtype if dtype is not None else jnp.float64)
  batch = variant == "batch"
  actions, outputs = _action_names(batch), _output_names(batch)
  mask = sum(1 << LABELS.index(t) for t in targets)
  mdp = _semantic_mdp(actions, mask, discount, dtype)
  pi_ref = np.full((mdp.num_states, len(actions)), 1.0 / len(actions), dtype)
  encoder = interface.FieldEncoder(fields=_fields(targets), num_fields=_NUM_LINES)
  if variant == "reversed":
    encoder = encoder.reversed()
  table = interface.decode_table_from(_decoder(actions), mdp.num_states, outputs)
  return interface.TabularHarness(mdp=mdp, pi_ref=pi_ref, decode_table=table,
                                  action_names=actions, output_names=outputs,
                                  noop_action=actions.index("wait"), encoder=encoder,
                                  name=NAMES[variant])


def checkbox_harnesses(**kwargs) -> dict[str, interface.TabularHarness]:
  """`{"H0": base, "H1": batch, "H2": reversed}` with shared keyword options."""
  return {NAMES[v]: checkbox_harness(v, **kwargs) for v in VARIANTS}


# ---------------------------------------------------------------------------
# Text features for the log-linear policy (harnax.policies.log_linear).
# ---------------------------------------------------------------------------

# Feature layout: [position x glyph x named-in-task | click, toggle | batch |
#                  submit x number of wrong boxes | wait | scroll | unknown label]
_POS = _NUM_LINES * len(_GLYPHS) * 2
_VERB, _BATCH, _SUBMIT = _POS, _POS + 2, _POS + 3
_WAIT = _SUBMIT + len(LABELS) + 1
_SCROLL, _UNKNOWN = _WAIT + 1, _WAIT + 2
NUM_FEATURES = _UNKNOWN + 1


def text_features(text: str, output: str) -> np.ndarray:
  """Features `[NUM_FEATURES]` of one candidate output given the context text.

  Reads `name: value` lines; a box's features depend on the *position* of the
  line that shows it.
  """
  lines = [ln.partition(": ") for ln in text.split("\n")]
  names = [ln[0] for ln in lines]
  task = lines[names.index("task")][2].split()
  phi = np.zeros(NUM_FEATURES)
  verb, _, rest = output.partition(" ")
  if output == "submit":
    wrong = sum((lines[k][2] == "[x]") != (lines[k][0] in task)
                for k in range(len(lines)) if lines[k][0] in LABELS and lines[k][2] != "-")
    phi[_SUBMIT + wrong] = 1.0
  elif output == "wait":
    phi[_WAIT] = 1.0
  elif verb in ("click", "toggle") and rest:
    items = rest.split(" and ")
    if any(x not in names or x == "task" for x in items):
      phi[_UNKNOWN] = 1.0
      return phi
    phi[_VERB + (verb == "toggle")] = 1.0
    phi[_BATCH] = float(len(items) > 1)
    for x in items:
      k = names.index(x)
      g = _GLYPHS.index(lines[k][2])
      phi[(k * len(_GLYPHS) + g) * 2 + (x in task)] += 1.0
  else:
    phi[_SCROLL] = 1.0
  return phi


def checkbox_features(harness: interface.TabularHarness) -> np.ndarray:
  """`[S, O, NUM_FEATURES]`: the features of every output in every encoded state."""
  return np.stack([np.stack([text_features(harness.encode(s), o) for o in harness.output_names])
                   for s in range(harness.num_states)])
