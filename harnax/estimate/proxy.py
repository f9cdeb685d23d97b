"""Proxy-optimum estimates from deployment logs (the harness-transfer study).

Where no optimum can be solved for (coding agents), a stronger model stands in
for `pi*`. At each decision of the deployed policy's own episodes, both models'
sampled outputs are mapped to common action categories; the per-decision KL of
the two category distributions is accumulated along the episode, so the
mismatch grows with the number of decisions:

  M~ = tau * mean_episodes sum_t gamma^t KL(p_hat_t || q~_t)
  C~ = mean outcome of the proxy's own episodes
  score = C~ - M~                      (ranks harnesses)

`p_hat_t` is the policy's empirical category distribution (plug-in, with the
Miller–Madow correction by default, clipped at 0); `q~_t` is the proxy's,
smoothed additively, `q~ = (n + alpha) / (N + alpha K)` over the K categories,
so categories the proxy never produced keep a finite log. The default
alpha = 1/4 trades two biases (docs/estimation.md §7): a larger alpha caps a
decision's log-ratio near `log((N + alpha K) / alpha)` and so underestimates
large KLs; a smaller one leaves more of the upward bias from the noise of the
proxy's frequencies.

Log format: JSON Lines, one episode per line,

  {"episode_id": "e1", "harness": "h", "actor": "policy" | "proxy",
   "outcome": 1.0,
   "steps": [{"state": 3, "policy_samples": ["cat a.py", ...],
              "proxy_samples": ["pytest", ...]}, ...]}

`actor` (default "policy") says who acted: C~ uses the proxy's episodes, M~
the policy's (whose steps need each side's samples non-empty, or its
distribution). A step may give a side's distribution over outputs instead of
(or besides) samples, `"policy_probs": {"cat a.py": 0.7, "pytest": 0.3}` and
likewise `"proxy_probs"`: where the deployment exposes probabilities (a
tabular model, an LM scoring a fixed set of outputs), the decision's KL then
uses them exactly (no smoothing, no Miller–Madow on that side). Bad lines do not
stop reading: `read_episodes` returns every parsed episode plus a `LogError`
(line number, message) for every line it could not use; nothing is dropped
silently (only whitespace-only lines are skipped). Pass `strict=True` to raise
one ValueError listing all bad lines after the whole file is read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

CODING_AGENT_CATEGORIES = ("inspect_file", "edit", "run_command", "plan", "other")

# Order matters: an edit written with shell tools (`sed -i`, `cat > f`) is an
# edit, not an inspection or a command; a plan is recognised by its lead word.
_RULES = (
    ("plan", re.compile(r"^\s*(plan|thought|thinking|next steps?|step \d|i will|i'll|let me think)"
                        r"\b", re.I)),
    ("edit", re.compile(r"(apply_patch|str_replace|write_file|create_file|\bsed\s+-i\b|"
                        r"\bcat\s*>|>>?\s*\S+\.\w+\s*$|\bpatch\b|\bedit\b|\binsert\b)", re.I)),
    ("inspect_file", re.compile(r"^\s*(cat|less|more|head|tail|grep|rg|ls|find|view|open|"
                                r"read_file|nl|wc)\b", re.I)),
    ("run_command", re.compile(r"^\s*(\$\s*)?(pytest|python3?|make|npm|pip|bash|sh|go|cargo|"
                               r"node|gcc|git|cd|echo|curl|run)\b", re.I)),
)


def coding_agent_category(text: str) -> str:
  """Default rule-based categorizer for coding-agent outputs.

  Returns one of `CODING_AGENT_CATEGORIES`: plan (leads with "Plan:", "I will",
  ...), edit (patches, `sed -i`, redirects into a file), inspect_file (`cat`,
  `grep`, `ls`, ...), run_command (`pytest`, `python`, `make`, ...), else
  other.
  """
  if not isinstance(text, str):
    raise ValueError(f"text: expected a string output, got {type(text).__name__}")
  for name, rule in _RULES:
    if rule.search(text):
      return name
  return "other"


@dataclasses.dataclass(frozen=True)
class Step:
  """One decision of a logged episode.

  Attributes:
    state: any identifier of the state (not used by the estimates).
    policy_samples, proxy_samples: outputs sampled from each model at this
      state (texts, mapped to categories by the categorizer).
    policy_probs, proxy_probs: optional exact distributions over outputs, as
      `((output, probability), ...)`; where given they replace that side's
      samples in the decision's KL.
  """

  state: object
  policy_samples: tuple
  proxy_samples: tuple
  policy_probs: tuple | None = None
  proxy_probs: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Episode:
  """One logged episode (see the module docstring for the JSON form)."""

  episode_id: str
  harness: str
  actor: str
  outcome: float
  steps: tuple
  line: int = 0


class LogError(NamedTuple):
  """A line that could not be used: 1-based line number and why."""

  line: int
  message: str


class ParsedLogs(NamedTuple):
  episodes: list
  errors: list


def source_lines(source) -> Iterable[str]:
  """The lines of `source`: a path, an open text file, a string with newlines, or an
  iterable of lines."""
  if isinstance(source, (str, os.PathLike)) and not (isinstance(source, str) and "\n" in source):
    with open(source, encoding="utf-8") as f:
      yield from f
  elif isinstance(source, io.IOBase):
    yield from source
  else:
    yield from (source.splitlines() if isinstance(source, str) else source)


def _samples(step, key, i):
  v = step.get(key, [])
  if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
    raise ValueError(f"steps[{i}].{key}: expected a list of strings")
  return tuple(v)


def _probs(step, key, i):
  v = step.get(key)
  if v is None:
    return None
  if (not isinstance(v, dict) or not v or not all(isinstance(k, str) for k in v)
      or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                 and x >= 0 for x in v.values())):
    raise ValueError(f"steps[{i}].{key}: expected a non-empty object of output -> probability "
                     ">= 0")
  if abs(sum(v.values()) - 1.0) > 1e-6:
    raise ValueError(f"steps[{i}].{key}: expected probabilities summing to 1, got "
                     f"{sum(v.values())!r}")
  return tuple((k, float(x)) for k, x in v.items())


def actor_and_outcome(obj: dict) -> tuple[str, float]:
  """An episode record's `actor` ("policy" by default, or "proxy") and its finite `outcome`
  (a success flag or a return), validated; the record must have an "outcome"."""
  actor = obj.get("actor", "policy")
  if actor not in ("policy", "proxy"):
    raise ValueError(f"actor: expected 'policy' or 'proxy', got {actor!r}")
  outcome = obj["outcome"]
  if isinstance(outcome, bool):
    outcome = float(outcome)
  if not isinstance(outcome, (int, float)) or not math.isfinite(outcome):
    raise ValueError(f"outcome: expected a finite number (success or return), got {outcome!r}")
  return actor, float(outcome)


def _parse_episode(obj, line) -> Episode:
  if not isinstance(obj, dict):
    raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
  for field in ("episode_id", "harness", "outcome", "steps"):
    if field not in obj:
      raise ValueError(f"missing field '{field}'")
  actor, outcome = actor_and_outcome(obj)
  if not isinstance(obj["steps"], list):
    raise ValueError("steps: expected a list of decisions")
  steps = []
  for i, st in enumerate(obj["steps"]):
    if not isinstance(st, dict):
      raise ValueError(f"steps[{i}]: expected an object")
    pol, prox = _samples(st, "policy_samples", i), _samples(st, "proxy_samples", i)
    pol_p, prox_p = _probs(st, "policy_probs", i), _probs(st, "proxy_probs", i)
    if actor == "policy" and ((not pol and pol_p is None) or (not prox and prox_p is None)):
      raise ValueError(f"steps[{i}]: a policy episode needs non-empty policy_samples (or "
                       "policy_probs) and proxy_samples (or proxy_probs) at every decision")
    steps.append(Step(state=st.get("state"), policy_samples=pol, proxy_samples=prox,
                      policy_probs=pol_p, proxy_probs=prox_p))
  return Episode(episode_id=str(obj["episode_id"]), harness=str(obj["harness"]), actor=actor,
                 outcome=float(outcome), steps=tuple(steps), line=line)


def read_episodes(source, *, strict: bool = False) -> ParsedLogs:
  """Reads JSONL episodes; collects every bad line instead of stopping.

  Args:
    source: a path, an open text file, a string with newlines, or an iterable
      of lines.
    strict: raise a ValueError listing all bad lines (after reading them all)
      instead of returning them.

  Returns:
    `ParsedLogs(episodes, errors)`: episodes in file order; one `LogError` per
    unusable non-blank line (malformed JSON, missing or ill-typed fields).
  """
  episodes, errors = [], []
  for n, raw in enumerate(source_lines(source), start=1):
    if not raw.strip():
      continue
    try:
      episodes.append(_parse_episode(json.loads(raw), n))
    except (json.JSONDecodeError, ValueError) as e:
      errors.append(LogError(n, str(e)))
  if strict and errors:
    detail = "; ".join(f"line {e.line}: {e.message}" for e in errors)
    raise ValueError(f"source: {len(errors)} malformed line(s): {detail}")
  return ParsedLogs(episodes, errors)


class HarnessEstimate(NamedTuple):
  """Proxy estimates for one harness.

  Attributes:
    harness: its name.
    ceiling: `C~`, mean outcome of the proxy's episodes (NaN if none).
    mismatch: `M~ = tau * mean_episodes sum_t gamma^t KL_t`.
    score: `C~ - M~`.
    ceiling_stderr, mismatch_stderr: standard errors over episodes.
    mismatch_per_decision: mean per-decision KL (unscaled).
    decisions_per_episode: mean number of logged decisions of the policy.
    realized: mean outcome of the policy's own episodes (NaN if none).
    num_policy_episodes, num_proxy_episodes: counts.
  """

  harness: str
  ceiling: float
  mismatch: float
  score: float
  ceiling_stderr: float
  mismatch_stderr: float
  mismatch_per_decision: float
  decisions_per_episode: float
  realized: float
  num_policy_episodes: int
  num_proxy_episodes: int


def _categorize(text, categorizer, index, where):
  c = categorizer(text)
  if c not in index:
    raise ValueError(f"categorizer: returned unknown category {c!r} for output {text!r} at "
                     f"{where}; expected one of {tuple(index)}")
  return c


def _category_counts(samples, categorizer, index, where):
  counts = np.zeros(len(index))
  for text in samples:
    counts[index[_categorize(text, categorizer, index, where)]] += 1
  return counts


def _category_probs(probs, categorizer, index, where):
  out = np.zeros(len(index))
  for text, pr in probs:
    out[index[_categorize(text, categorizer, index, where)]] += pr
  return out


def decision_kl(policy_counts, proxy_counts, *, smoothing: float = 0.25,
                miller_madow: bool = True, policy_exact: bool = False,
                proxy_exact: bool = False) -> float:
  """`KL(p_hat || q~)` for one decision from category counts `[K]` each.

  `p_hat = policy_counts / N`; `q~ = (proxy_counts + alpha) / (N' + alpha K)`;
  with `miller_madow`, subtract `(k - 1)/(2N)` (k categories the policy used)
  and clip at 0.

  With `policy_exact` (`proxy_exact`) that side's argument is a category
  distribution `[K]` (summing to 1), used as it is: no Miller–Madow (no
  smoothing) on that side. An exact proxy that gives probability 0 to a
  category the policy uses makes the KL `inf`.
  """
  p = np.asarray(policy_counts, float)
  q = np.asarray(proxy_counts, float)
  if p.shape != q.shape or p.ndim != 1:
    raise ValueError(f"proxy_counts: expected shape {list(p.shape)} like policy_counts")
  if p.sum() <= 0:
    raise ValueError("policy_counts: expected N >= 1 policy samples at a decision")
  for name, x, exact in (("policy_counts", p, policy_exact), ("proxy_counts", q, proxy_exact)):
    if np.any(x < 0) or (exact and abs(x.sum() - 1.0) > 1e-6):
      raise ValueError(f"{name}: expected non-negative "
                       f"{'probabilities summing to 1' if exact else 'counts'}")
  if not proxy_exact and (smoothing < 0 or (smoothing == 0 and np.any((q == 0) & (p > 0)))):
    raise ValueError("smoothing: expected alpha > 0 (or alpha = 0 with every policy category "
                     "also produced by the proxy)")
  ph = p / p.sum()
  qt = q if proxy_exact else (q + smoothing) / (q.sum() + smoothing * q.size)
  pos = ph > 0
  if np.any(qt[pos] == 0):
    return float("inf")
  kl = float(np.sum(ph[pos] * np.log(ph[pos] / qt[pos])))
  if miller_madow and not policy_exact:
    kl = max(kl - (np.count_nonzero(pos) - 1) / (2.0 * p.sum()), 0.0)
  return kl


def _mean_se(x):
  x = np.asarray(x, float)
  if x.size == 0:
    return float("nan"), float("nan")
  se = float(np.std(x, ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("inf")
  return float(np.mean(x)), se


def proxy_estimates(episodes: Sequence[Episode], *,
                    categorizer: Callable[[str], str] = coding_agent_category,
                    categories: Sequence[str] = CODING_AGENT_CATEGORIES, tau: float = 1.0,
                    discount: float = 1.0, smoothing: float = 0.25,
                    miller_madow: bool = True) -> dict:
  """`C~`, `M~` and `C~ - M~` per harness.

  Args:
    episodes: parsed episodes (`read_episodes(...).episodes`).
    categorizer: output text -> category name; an unknown name raises.
    categories: the common action categories.
    tau: converts accumulated KL (nats) into outcome units (> 0).
    discount: weight `gamma^t` of decision t (1: undiscounted, as for
      success-rate outcomes; must lie in (0, 1]).
    smoothing: additive smoothing alpha of the proxy's distribution.
    miller_madow: bias-correct the policy's plug-in distribution.

  Returns:
    `{harness: HarnessEstimate}`.

  A step's `policy_probs` / `proxy_probs`, where given, replace that side's
  samples (`decision_kl` with `policy_exact` / `proxy_exact`).

  Raises:
    ValueError: no episodes, bad options, an unknown category, or a policy
      decision without samples or probabilities on either side (naming the
      episode, its line and the decision).
  """
  episodes = list(episodes)
  if not episodes:
    raise ValueError("episodes: expected at least one episode, got none")
  if not (tau > 0 and math.isfinite(tau)):
    raise ValueError(f"tau: expected a finite temperature > 0, got {tau}")
  if not 0 < discount <= 1:
    raise ValueError(f"discount: expected 0 < gamma <= 1, got {discount}")
  categories = tuple(categories)
  if len(set(categories)) != len(categories) or not categories:
    raise ValueError(f"categories: expected distinct category names, got {categories}")
  index = {c: i for i, c in enumerate(categories)}
  by_harness: dict = {}
  for ep in episodes:
    rec = by_harness.setdefault(ep.harness, {"m": [], "kl": [], "n": [], "c": [], "j": []})
    if ep.actor == "proxy":
      rec["c"].append(ep.outcome)
      continue
    rec["j"].append(ep.outcome)
    total = 0.0
    for t, st in enumerate(ep.steps):
      where = f"episode {ep.episode_id!r} (line {ep.line}), decision {t}"
      pol_exact, prox_exact = st.policy_probs is not None, st.proxy_probs is not None
      if (not st.policy_samples and not pol_exact) or (not st.proxy_samples and not prox_exact):
        raise ValueError(f"episodes: {where} has no policy samples (or probabilities) or no "
                         "proxy samples (or probabilities); a policy decision needs both")
      p = (_category_probs(st.policy_probs, categorizer, index, where) if pol_exact
           else _category_counts(st.policy_samples, categorizer, index, where))
      q = (_category_probs(st.proxy_probs, categorizer, index, where) if prox_exact
           else _category_counts(st.proxy_samples, categorizer, index, where))
      kl = decision_kl(p, q, smoothing=smoothing, miller_madow=miller_madow,
                       policy_exact=pol_exact, proxy_exact=prox_exact)
      rec["kl"].append(kl)
      total += discount ** t * kl
    rec["m"].append(tau * total)
    rec["n"].append(len(ep.steps))
  out = {}
  for h, rec in by_harness.items():
    c, c_se = _mean_se(rec["c"])
    m, m_se = _mean_se(rec["m"])
    out[h] = HarnessEstimate(
        harness=h, ceiling=c, mismatch=m, score=c - m, ceiling_stderr=c_se, mismatch_stderr=m_se,
        mismatch_per_decision=_mean_se(rec["kl"])[0], decisions_per_episode=_mean_se(rec["n"])[0],
        realized=_mean_se(rec["j"])[0], num_policy_episodes=len(rec["m"]),
        num_proxy_episodes=len(rec["c"]))
  return out


def rank_harnesses(estimates: dict, *, key: str = "score") -> list:
  """Harness names, best first, by `key` (`"score"` = C~ - M~, `"ceiling"`,
  `"mismatch"` ranks smallest first)."""
  if key not in ("score", "ceiling", "mismatch"):
    raise ValueError(f"key: expected 'score', 'ceiling' or 'mismatch', got {key!r}")
  sign = 1.0 if key == "mismatch" else -1.0
  return sorted(estimates, key=lambda h: sign * getattr(estimates[h], key))
