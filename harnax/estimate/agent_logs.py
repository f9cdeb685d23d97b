"""Chat-format agent transcripts as proxy-estimate episodes (`harnax.estimate.proxy`).

Real agent logs are chat transcripts: each model call is an assistant message,
its actions are tool calls with JSON arguments, and tool results come back as
messages. This module reads them (OpenAI-style messages, JSON Lines), makes
each assistant message one decision, and maps it to a common action category
by a user-supplied **category table**, so that `proxy_estimates` can compute
`C~`, `M~` per harness. Format and table are documented in
docs/estimation.md §7.1.

Lines (JSON Lines; the two layouts may be mixed in one file):

  one episode per line:
    {"episode_id": "e1", "harness": "deepagents", "actor": "policy",
     "outcome": 1.0, "messages": [message, ...]}
  one message per line: a header line per episode (the same fields, no
  "messages" and no "role"), and message lines carrying "episode_id":
    {"episode_id": "e1", "harness": "deepagents", "outcome": 1.0}
    {"episode_id": "e1", "role": "assistant", "content": null, "tool_calls": [...]}

Messages:
  {"role": "system" | "developer" | "user", "content": ...}      context (skipped)
  {"role": "assistant", "content": "text" | [{"type": "text", "text": ...}] | null,
   "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "edit_file", "arguments": "{\"path\": \"a.py\"}"}}],
   "policy_samples": [message, ...], "proxy_samples": [message, ...]}   one decision
  {"role": "tool", "tool_call_id": "c1", "content": ...}          a result

An assistant message is one sample of the deployed policy at that decision;
`policy_samples` adds more samples at the same context and `proxy_samples`
holds the proxy's (each an assistant-message-shaped object: content and/or
tool_calls). Its category is that of its first tool call, or of its text
(`text_categorizer`, by default `coding_agent_category`) when it calls no tool.

Category table: `{tool name: rule}`, a rule being a category name, or
`{"arg": name, "prefix": {command prefix: category}, "default": category}`
(the argument's leading whitespace-separated words are matched against each
prefix's words; the longest matching prefix wins; no match, a missing or
non-string argument: `default`). The key `"*"` gives the category of tools
the table does not name (default "other").

Errors: a malformed line or message (bad JSON, bad `arguments` JSON, missing
or ill-typed fields, a tool result answering no earlier call) makes its
episode unusable; it is reported as a `LogError` with the line number and
where in the line, and every other episode is read. `strict=True` raises one
ValueError listing all of them after reading the whole source.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Mapping, Sequence

from harnax.estimate import proxy

ROLES = ("system", "developer", "user", "assistant", "tool")
_RULE_KEYS = ("arg", "prefix", "default")
FALLBACK = "*"


class _TableError(ValueError):
  """A fault of the table or categorizer, not of the log: raised, never reported per line."""


def _category_name(x, where):
  if not isinstance(x, str) or not x.strip():
    raise ValueError(f"{where}: expected a non-empty category name, got {x!r}")
  return x


@dataclasses.dataclass(frozen=True)
class ArgumentRule:
  """Categorizes a tool call by one string argument's leading words.

  Attributes:
    arg: the argument's name (e.g. "command").
    prefixes: `((words, category), ...)`, longest prefix first.
    default: the category when no prefix matches or the argument is missing.
  """

  arg: str
  prefixes: tuple
  default: str

  def category(self, arguments: Mapping) -> str:
    value = arguments.get(self.arg)
    if not isinstance(value, str):
      return self.default
    words = tuple(value.split())
    for prefix, cat in self.prefixes:
      if words[:len(prefix)] == prefix:
        return cat
    return self.default


@dataclasses.dataclass(frozen=True)
class CategoryTable:
  """A validated category table (build it with `category_table`).

  Attributes:
    rules: `{tool name: category or ArgumentRule}`.
    fallback: the category of a tool the table does not name.
    text_categorizer: message text -> category, for decisions without tool calls.
    text_categories: every name `text_categorizer` may return.
  """

  rules: Mapping
  fallback: str
  text_categorizer: Callable[[str], str]
  text_categories: tuple

  @property
  def categories(self) -> tuple:
    """Every category the table can produce, sorted (pass to `proxy_estimates`)."""
    names = {self.fallback, *self.text_categories}
    for rule in self.rules.values():
      if isinstance(rule, ArgumentRule):
        names.update([rule.default, *(c for _, c in rule.prefixes)])
      else:
        names.add(rule)
    return tuple(sorted(names))

  def call_category(self, name: str, arguments: Mapping) -> str:
    """The category of one tool call (its name and decoded arguments)."""
    rule = self.rules.get(name, self.fallback)
    return rule.category(arguments) if isinstance(rule, ArgumentRule) else rule

  def text_category(self, text: str) -> str:
    c = self.text_categorizer(text)
    if c not in self.text_categories:
      raise _TableError(f"text_categorizer: returned {c!r} for {text[:80]!r}; expected one of "
                       f"text_categories {self.text_categories}")
    return c


def category_table(spec: Mapping, *,
                   text_categorizer: Callable[[str], str] = proxy.coding_agent_category,
                   text_categories: Sequence[str] = proxy.CODING_AGENT_CATEGORIES
                   ) -> CategoryTable:
  """Validates a category table (module docstring) and compiles it.

  Args:
    spec: `{tool name: category | {"arg": ..., "prefix": {...}, "default": ...}}`,
      optionally with `"*"` (the category of unnamed tools, default "other").
    text_categorizer: text -> category for assistant messages without tool calls.
    text_categories: the names `text_categorizer` returns.

  Raises:
    ValueError: naming the entry (e.g. `table['bash'].prefix`) and what was expected.
  """
  if not isinstance(spec, Mapping):
    raise ValueError(f"table: expected a mapping of tool name -> rule, got "
                     f"{type(spec).__name__}")
  text_categories = tuple(text_categories)
  if not text_categories or not all(isinstance(c, str) and c for c in text_categories):
    raise ValueError(f"text_categories: expected non-empty category names, got "
                     f"{text_categories}")
  rules, fallback = {}, "other"
  for name, rule in spec.items():
    where = f"table[{name!r}]"
    if not isinstance(name, str) or not name:
      raise ValueError(f"table: expected non-empty tool names as keys, got {name!r}")
    if name == FALLBACK:
      fallback = _category_name(rule, where)
      continue
    if isinstance(rule, str):
      rules[name] = _category_name(rule, where)
      continue
    if not isinstance(rule, Mapping):
      raise ValueError(f"{where}: expected a category name or an object with keys "
                       f"{_RULE_KEYS}, got {type(rule).__name__}")
    unknown = sorted(set(rule) - set(_RULE_KEYS))
    if unknown:
      raise ValueError(f"{where}: unknown keys {unknown}; expected some of {_RULE_KEYS}")
    arg = rule.get("arg")
    if not isinstance(arg, str) or not arg:
      raise ValueError(f"{where}.arg: expected the name of a string argument, got {arg!r}")
    prefix = rule.get("prefix", {})
    if not isinstance(prefix, Mapping):
      raise ValueError(f"{where}.prefix: expected an object of command prefix -> category, "
                       f"got {type(prefix).__name__}")
    prefixes = []
    for p, c in prefix.items():
      if not isinstance(p, str) or not p.split():
        raise ValueError(f"{where}.prefix: expected non-blank prefixes, got {p!r}")
      prefixes.append((tuple(p.split()), _category_name(c, f"{where}.prefix[{p!r}]")))
    seen = [p for p, _ in prefixes]
    if len(set(seen)) != len(seen):
      raise ValueError(f"{where}.prefix: two prefixes have the same words")
    prefixes.sort(key=lambda pc: -len(pc[0]))  # the longest match wins
    default = _category_name(rule.get("default", fallback), f"{where}.default")
    rules[name] = ArgumentRule(arg=arg, prefixes=tuple(prefixes), default=default)
  # A rule without its own default falls back to "*", wherever "*" appears in the table.
  if FALLBACK in spec:
    for name, rule in rules.items():
      if isinstance(rule, ArgumentRule) and "default" not in spec[name]:
        rules[name] = dataclasses.replace(rule, default=fallback)
  return CategoryTable(rules=rules, fallback=fallback, text_categorizer=text_categorizer,
                       text_categories=text_categories)


# -- reading ------------------------------------------------------------------------------


def _text(content, where) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    parts = []
    for i, part in enumerate(content):
      if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
        raise ValueError(f"{where}.content[{i}]: expected a part {{\"type\": \"text\", "
                         "\"text\": ...}")
      parts.append(part.get("text", ""))
    return "\n".join(parts)
  raise ValueError(f"{where}.content: expected a string, a list of parts or null, got "
                   f"{type(content).__name__}")


def _calls(msg, where) -> list:
  """`[(id, name, arguments dict)]` of an assistant message's tool calls."""
  calls = msg.get("tool_calls") or []
  if not isinstance(calls, list):
    raise ValueError(f"{where}.tool_calls: expected a list")
  out = []
  for i, call in enumerate(calls):
    w = f"{where}.tool_calls[{i}]"
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
      raise ValueError(f"{w}: expected an object with a 'function' object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
      raise ValueError(f"{w}.function.name: expected the tool's name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
      try:
        args = json.loads(args) if args.strip() else {}
      except json.JSONDecodeError as e:
        raise ValueError(f"{w}.function.arguments: invalid JSON ({e.msg} at char {e.pos})")
    if not isinstance(args, dict):
      raise ValueError(f"{w}.function.arguments: expected a JSON object, got "
                       f"{type(args).__name__}")
    cid = call.get("id")
    if cid is not None and not isinstance(cid, str):
      raise ValueError(f"{w}.id: expected a string")
    out.append((cid, name, args))
  return out


def _sample_category(msg, table, where) -> str:
  if not isinstance(msg, dict):
    raise ValueError(f"{where}: expected a message object")
  if "content" not in msg and "tool_calls" not in msg:
    raise ValueError(f"{where}: missing field 'content' or 'tool_calls'")
  calls = _calls(msg, where)
  text = _text(msg.get("content"), where)
  if calls:
    _, name, args = calls[0]
    return table.call_category(name, args)
  return table.text_category(text)


class _Episode:
  """Accumulates one episode's decisions while reading."""

  def __init__(self, episode_id):
    self.episode_id = episode_id
    self.header = None          # (harness, actor, outcome, line)
    self.steps = []
    self.call_ids = set()
    self.error = None           # the first LogError that made it unusable
    self.layout = None          # "episode" (one line) or "messages" (a line each)

  def add(self, msg, table, line, index):
    where = f"messages[{index}]"
    if not isinstance(msg, dict):
      raise ValueError(f"{where}: expected a message object")
    role = msg.get("role")
    if role not in ROLES:
      raise ValueError(f"{where}.role: expected one of {ROLES}, got {role!r}")
    if role == "tool":
      cid = msg.get("tool_call_id")
      if not isinstance(cid, str):
        raise ValueError(f"{where}.tool_call_id: missing (a tool result names its call)")
      if cid not in self.call_ids:
        raise ValueError(f"{where}.tool_call_id: {cid!r} answers no earlier tool call")
      return
    if role != "assistant":
      return
    cat = _sample_category(msg, table, where)
    self.call_ids.update(cid for cid, _, _ in _calls(msg, where) if cid is not None)
    extra = {}
    for key in ("policy_samples", "proxy_samples"):
      v = msg.get(key, [])
      if not isinstance(v, list):
        raise ValueError(f"{where}.{key}: expected a list of assistant messages")
      extra[key] = tuple(_sample_category(m, table, f"{where}.{key}[{i}]")
                         for i, m in enumerate(v))
    self.steps.append(proxy.Step(state=(line, index),
                                 policy_samples=(cat,) + extra["policy_samples"],
                                 proxy_samples=extra["proxy_samples"]))


def _header(obj):
  for field in ("harness", "outcome"):
    if field not in obj:
      raise ValueError(f"missing field '{field}'")
  actor, outcome = proxy.actor_and_outcome(obj)
  if not isinstance(obj["harness"], str):
    raise ValueError("harness: expected a string")
  return obj["harness"], actor, outcome


def read_transcripts(source, table: CategoryTable | Mapping, *, strict: bool = False
                     ) -> proxy.ParsedLogs:
  """Reads chat transcripts into `proxy.Episode`s whose samples are category names.

  Args:
    source: a path, an open text file, a string with newlines, or an iterable of lines.
    table: a `CategoryTable`, or a table spec (validated by `category_table`).
    strict: raise one ValueError listing every bad line after reading them all.

  Returns:
    `ParsedLogs(episodes, errors)`: usable episodes in order of first appearance (each
    step one assistant message, `state = (line, message index)`); one `LogError` per bad
    line, naming the field, plus one per episode left without a header.
    Estimate with `estimate_transcripts(episodes, table)`.
  """
  if not isinstance(table, CategoryTable):
    table = category_table(table)
  episodes: dict = {}
  counts: dict = {}
  errors = []

  def fail(ep, line, message):
    err = proxy.LogError(line, message if ep is None else
                         f"{message} (episode {ep.episode_id!r} is not used)")
    errors.append(err)
    if ep is not None and ep.error is None:
      ep.error = err

  for n, raw in enumerate(proxy.source_lines(source), start=1):
    if not raw.strip():
      continue
    try:
      obj = json.loads(raw)
    except json.JSONDecodeError as e:
      fail(None, n, f"invalid JSON ({e.msg} at char {e.pos})")
      continue
    if not isinstance(obj, dict):
      fail(None, n, f"expected a JSON object, got {type(obj).__name__}")
      continue
    eid = obj.get("episode_id")
    if not isinstance(eid, (str, int)) or isinstance(eid, bool):
      fail(None, n, "episode_id: missing (expected a string or integer)")
      continue
    eid = str(eid)
    ep = episodes.setdefault(eid, _Episode(eid))
    if ep.error is not None:
      continue  # already unusable: its first error was reported
    try:
      if "role" in obj:                               # one message per line
        if ep.layout == "episode":
          raise ValueError(f"episode_id: {eid!r} mixes an episode line with message lines")
        ep.layout = "messages"
        counts[eid] = counts.get(eid, -1) + 1
        ep.add(obj, table, n, counts[eid])
        continue
      if ep.header is not None:
        raise ValueError(f"episode_id: {eid!r} already has a header on line {ep.header[3]}")
      ep.header = _header(obj) + (n,)
      if "messages" in obj:                           # one episode per line
        if not isinstance(obj["messages"], list):
          raise ValueError("messages: expected a list of messages")
        if ep.layout == "messages":
          raise ValueError(f"episode_id: {eid!r} mixes an episode line with message lines")
        ep.layout = "episode"
        for i, msg in enumerate(obj["messages"]):
          ep.add(msg, table, n, i)
    except _TableError:
      raise
    except ValueError as e:
      fail(ep, n, str(e))

  out = []
  for ep in episodes.values():
    if ep.error is not None:
      continue
    if ep.header is None:
      errors.append(proxy.LogError(ep.steps[0].state[0] if ep.steps else 0,
                                   f"episode_id: {ep.episode_id!r} has messages but no header "
                                   "line (harness, outcome)"))
      continue
    harness, actor, outcome, line = ep.header
    out.append(proxy.Episode(episode_id=ep.episode_id, harness=harness, actor=actor,
                             outcome=outcome, steps=tuple(ep.steps), line=line))
  errors.sort(key=lambda e: e.line)
  if strict and errors:
    detail = "; ".join(f"line {e.line}: {e.message}" for e in errors)
    raise ValueError(f"source: {len(errors)} malformed line(s): {detail}")
  return proxy.ParsedLogs(out, errors)


def estimate_transcripts(episodes, table: CategoryTable | Mapping, **options) -> dict:
  """`proxy.proxy_estimates` over episodes from `read_transcripts` (samples are categories).

  `options` are `proxy_estimates`' (`tau`, `discount`, `smoothing`, `miller_madow`).
  """
  if not isinstance(table, CategoryTable):
    table = category_table(table)
  for bad in ("categorizer", "categories"):
    if bad in options:
      raise ValueError(f"{bad}: set by the table; pass it to proxy_estimates directly instead")
  return proxy.proxy_estimates(episodes, categorizer=_same, categories=table.categories,
                               **options)


def _same(category: str) -> str:
  return category
