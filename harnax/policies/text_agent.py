"""The text-game agent's prompt and output format: reasoning, then one action.

The agent sees a rendered *context* (the goal, the recent observations and, behind a harness,
the harness's record and feedback) and writes

  Think: <reasoning>
  Action: <one game command>

With a chat model the context is the user turn after a system prompt that fixes this format
(:data:`SYSTEM_PROMPT`), and the assistant turn is the output; Qwen3's thinking mode may put
the reasoning inside ``<think> ... </think>`` instead of after ``Think:``. Without a chat
template the prompt is the system text, a blank line, the context and a newline.

:func:`parse_output` reads an action out of whatever the model wrote and is deliberately
tolerant: an output that names no usable action gives ``ParsedOutput.action = None`` and a
short ``error``, never an exception, so a rollout counts it and goes on.
"""

from __future__ import annotations

import dataclasses
import re

SYSTEM_PROMPT = (
    "You are an agent playing a text game. Each turn you read the task and what happened so "
    "far, then answer in exactly this format:\n"
    "Think: <your reasoning about what to do next>\n"
    "Action: <one game command>")
"""The default system prompt: it states the output format :func:`parse_output` reads."""

PICKS = ("first", "last")
MAX_BARE_WORDS = 12
"""A line without an ``Action:`` label is read as a command only up to this many words (the
longest commands of the two games have about ten); a longer one is prose."""

# The label of an action line: optional markdown (heading, list, quote, bold/italic, code)
# around "action", then a colon (ASCII or full-width). Case-insensitive, at a line start.
_ACTION_LINE = re.compile(
    r"^[ \t]*(?:[#>*_`~-]+[ \t]*)*action[ \t]*[*_`]*[ \t]*[:\uff1a][ \t]*(.*)$",
    re.IGNORECASE | re.MULTILINE)
_THINK_LABEL = re.compile(
    r"^[ \t]*(?:[#>*_`~-]+[ \t]*)*(?:think|thought|thoughts|reasoning)[ \t]*[*_`]*[ \t]*"
    r"[:\uff1a][ \t]*", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
# Characters stripped from both ends of an action: markdown emphasis and code marks, quotes
# (straight and typographic), and whitespace.
_WRAP = " \t*_`'\"\u2018\u2019\u201c\u201d"
_TRAILING = ".!?;,:"
_BRACKETS = (("[", "]"), ("<", ">"), ("(", ")"), ("{", "}"))


@dataclasses.dataclass(frozen=True)
class ParsedOutput:
  """What :func:`parse_output` read from one model output.

  Attributes:
    reasoning: the reasoning text (after ``Think:``, inside ``<think>`` tags, or everything
      before the action line), stripped; "" when there is none.
    action: the game command, normalized (see :func:`normalize_action`), or None.
    error: why no action could be read (None when ``action`` is set).
  """

  reasoning: str
  action: str | None
  error: str | None


def format_prompt(tokenizer, context: str, *, chat: bool | None = None,
                  system: str | None = SYSTEM_PROMPT, enable_thinking: bool | None = None) -> str:
  """The prompt text of one turn.

  Args:
    tokenizer: a :class:`harnax.models.Tokenizer` (or anything with ``chat_template`` and
      ``apply_chat_template``).
    context: the rendered context of the turn (goal, history, harness parts).
    chat: True: the chat template (system prompt + user turn = ``context``, assistant turn
      opened); False: plain text; None: the chat template where the tokenizer has one.
    system: the system prompt (None: no system text).
    enable_thinking: passed to the chat template when not None (Qwen3's templates read it:
      False closes an empty ``<think>`` block so the model answers directly).
  Raises:
    ValueError: ``context`` is not a string, or ``chat=True`` without a chat template.
  """
  if not isinstance(context, str):
    raise ValueError(f"context: expected a string, got {type(context).__name__}")
  has_template = bool(getattr(tokenizer, "chat_template", None))
  if chat is None:
    chat = has_template
  if chat:
    if not has_template:
      raise ValueError("chat: True needs a tokenizer with a chat template; this one has none "
                       "(pass chat=False for a plain prompt)")
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": context}]
    extra = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)
  return (system + "\n\n" if system else "") + context + "\n"


def format_output(reasoning: str, action: str) -> str:
  """The output an agent should write: ``Think: {reasoning}\\nAction: {action}``."""
  if not isinstance(action, str) or not action.strip():
    raise ValueError(f"action: expected a non-empty string, got {action!r}")
  return f"Think: {reasoning.strip()}\nAction: {action.strip()}"


def normalize_action(text: str) -> str:
  """A command as a game reads it: one line, lower case, single spaces, without wrapping
  markdown, quotes or brackets and without trailing punctuation ("**Go to Desk 1.**" ->
  "go to desk 1"). The two games' commands are lower case ("put apple 1 in/on desk 1")."""
  action = " ".join(text.split())
  for _ in range(4):  # nested wrappers: "`'go north'`."
    before = action
    action = action.strip(_WRAP).rstrip(_TRAILING).strip(_WRAP)
    for left, right in _BRACKETS:
      if action.startswith(left) and action.endswith(right):
        action = action[1:-1].strip()
    if action == before:
      break
  return action.lower()


def _split_thinking(text: str) -> tuple[str, str, bool]:
  """(thinking inside <think> tags, the text outside them, an unterminated <think> seen)."""
  thoughts = [m.strip() for m in _THINK_BLOCK.findall(text)]
  rest = _THINK_BLOCK.sub("\n", text)
  # A stray "</think>" (the template opened the block in the prompt): what precedes it is
  # thinking.
  close = _THINK_CLOSE.search(rest)
  if close and not _THINK_OPEN.search(rest[:close.start()]):
    thoughts.insert(0, rest[:close.start()].strip())
    rest = rest[close.end():]
  opened = _THINK_OPEN.search(rest)
  unterminated = False
  if opened:  # cut off while thinking: the rest is thinking too
    thoughts.append(rest[opened.end():].strip())
    rest = rest[:opened.start()]
    unterminated = True
  return "\n".join(t for t in thoughts if t), rest, unterminated


def _strip_think_label(text: str) -> str:
  return _THINK_LABEL.sub("", text.strip(), count=1).strip()


def parse_output(text: str, *, pick: str = "first") -> ParsedOutput:
  """Reads the reasoning and the action of one model output; never raises on bad output.

  Rules, in order:

  1. ``<think> ... </think>`` blocks are reasoning (an unterminated block runs to the end);
     the action is searched outside them.
  2. An action line is ``Action: <command>`` at a line start, any case, with optional
     markdown around the label (``**Action:**``, ``### Action:``, ``- action :``). With several
     action lines ``pick`` chooses: "first" (default; what follows it is usually the model
     imagining the game's answer and its next turn) or "last" (the model revised itself). An
     empty action line takes the next non-empty line.
  3. Without any action line, an output whose only line outside a ``Think:`` line is one
     command (at most :data:`MAX_BARE_WORDS` words) is read as that command ("go to desk 1",
     or "Think: ...\\ngo to desk 1").
  4. The command is normalized (:func:`normalize_action`).

  Args:
    text: the decoded model output (special tokens removed).
    pick: "first" or "last": which of several action lines is the action.
  Returns:
    a :class:`ParsedOutput`; ``action`` is None and ``error`` says why when no action is
    found ("empty output", "no action line", "empty action", "unterminated <think> block").
  Raises:
    ValueError: ``text`` is not a string or ``pick`` is unknown (programming errors, not
      model errors).
  """
  if not isinstance(text, str):
    raise ValueError(f"text: expected a string, got {type(text).__name__}")
  if pick not in PICKS:
    raise ValueError(f"pick: expected one of {PICKS}, got {pick!r}")
  if not text.strip():
    return ParsedOutput("", None, "empty output")
  thinking, rest, unterminated = _split_thinking(text)
  matches = list(_ACTION_LINE.finditer(rest))
  if matches:
    m = matches[0] if pick == "first" else matches[-1]
    before = _strip_think_label(rest[:m.start()])
    reasoning = "\n".join(t for t in (thinking, before) if t)
    raw = m.group(1)
    if not normalize_action(raw):  # "Action:\n go to desk 1"
      following = [line for line in rest[m.end():].splitlines() if line.strip()]
      if following and not _ACTION_LINE.match(following[0]):
        raw = following[0]
    action = normalize_action(raw)
    if not action:
      return ParsedOutput(reasoning, None, "empty action")
    return ParsedOutput(reasoning, action, None)
  lines = [line for line in rest.splitlines() if line.strip()]
  think_lines = [line for line in lines if _THINK_LABEL.match(line)]
  others = [line for line in lines if not _THINK_LABEL.match(line)]
  reasoning = "\n".join(t for t in [thinking] + [_strip_think_label(x) for x in think_lines] if t)
  if len(others) == 1 and len(think_lines) <= 1:
    action = normalize_action(others[0])
    if action and len(action.split()) <= MAX_BARE_WORDS:
      return ParsedOutput(reasoning, action, None)
  if unterminated and not others:
    return ParsedOutput(reasoning, None, "unterminated <think> block")
  return ParsedOutput(reasoning, None, "no action line")
