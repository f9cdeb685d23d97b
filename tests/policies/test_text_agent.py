"""The text agent's output parser on well-formed and malformed outputs; prompt formatting."""

import pytest

from harnax.models import tokenizer as tokenizer_lib
from harnax.policies import text_agent as ta

# (output, expected action, expected reasoning or None to skip the check)
GOOD = [
    ("Think: the apple may be in the fridge.\nAction: go to fridge 1", "go to fridge 1",
     "the apple may be in the fridge."),
    ("think: x\naction: open fridge 1", "open fridge 1", "x"),
    ("THINK: x\nACTION:   take apple 1 from fridge 1  ", "take apple 1 from fridge 1", "x"),
    ("Think: x\n**Action:** go to desk 1", "go to desk 1", "x"),
    ("Think: x\n**Action**: go to desk 1", "go to desk 1", "x"),
    ("### Action: look", "look", ""),
    ("- Action : inventory", "inventory", ""),
    ("Think: x\nAction: `go to desk 1`", "go to desk 1", "x"),
    ("Think: x\nAction: \"go to desk 1\".", "go to desk 1", "x"),
    ("Think: x\nAction: 'Go To Desk 1!'", "go to desk 1", "x"),
    ("Think: x\nAction: [go to desk 1]", "go to desk 1", "x"),
    ("Think: x\nAction: \u201cgo to desk 1\u201d", "go to desk 1", "x"),
    ("Think: x\nAction: put apple 1 in/on countertop 1.", "put apple 1 in/on countertop 1",
     "x"),
    ("Think: x\nAction\uff1a go to desk 1", "go to desk 1", "x"),
    # An empty action line takes the next line.
    ("Think: x\nAction:\n  go to desk 1\n", "go to desk 1", "x"),
    # Several action lines: the first (the default pick).
    ("Think: x\nAction: go to desk 1\nObservation: You arrive.\nAction: take pen 1",
     "go to desk 1", "x"),
    # No label: a single command line, alone or after a Think line.
    ("go to desk 1", "go to desk 1", ""),
    ("Think: I should look at the desk.\ngo to desk 1", "go to desk 1",
     "I should look at the desk."),
    # Qwen3 thinking: the reasoning inside <think> tags.
    ("<think>\nThe apple is likely in the fridge.\n</think>\n\nAction: go to fridge 1",
     "go to fridge 1", "The apple is likely in the fridge."),
    ("<think>\n\n</think>\n\nThink: x\nAction: go to fridge 1", "go to fridge 1", "x"),
    # The chat template opened the block in the prompt: only "</think>" is generated.
    ("fridge first\n</think>\nAction: go to fridge 1", "go to fridge 1", "fridge first"),
    # An "Action:" inside the thinking does not count; the one after it does.
    ("<think>maybe Action: look</think>\nAction: go to desk 1", "go to desk 1", None),
    ("Reasoning: x\nAction: look", "look", "x"),
    ("Think: multi\nline reasoning\nAction: look", "look", "multi\nline reasoning"),
]

BAD = [
    ("", "empty output"),
    ("   \n\t ", "empty output"),
    ("Think: I do not know what to do.", "no action line"),
    ("Think: x\nAction:", "empty action"),
    ("Think: x\nAction: \"\" .", "empty action"),
    ("first line\nsecond line", "no action line"),
    ("Think: a\nb\ngo to desk 1", "no action line"),
    ("<think>I am still thinking about Action: go to desk 1", "unterminated <think> block"),
    ("Well, I believe the best thing to do right now would be to walk over to the desk and "
     "look at everything on it carefully", "no action line"),
    ("\u00e9\u00e8\x00garbage\ufffd tokens\n\n,,,\n", "no action line"),
]


@pytest.mark.parametrize("text,action,reasoning", GOOD)
def test_parses_tolerantly(text, action, reasoning):
  out = ta.parse_output(text)
  assert out.error is None, out
  assert out.action == action
  if reasoning is not None:
    assert out.reasoning == reasoning


@pytest.mark.parametrize("text,error", BAD)
def test_unparsable_outputs_give_an_error_not_an_exception(text, error):
  out = ta.parse_output(text)
  assert out.action is None
  assert out.error == error


def test_pick_last_takes_the_last_action_line():
  text = "Think: x\nAction: go to desk 1\nAction: go to desk 2"
  assert ta.parse_output(text, pick="last").action == "go to desk 2"
  assert ta.parse_output(text, pick="first").action == "go to desk 1"


def test_round_trip_of_the_canonical_format():
  for reasoning, action in [("r", "go to desk 1"), ("two\nlines", "open drawer 3")]:
    out = ta.parse_output(ta.format_output(reasoning, action))
    assert (out.reasoning, out.action, out.error) == (reasoning, action, None)


def test_normalize_action():
  assert ta.normalize_action("  **Go   to\tDesk 1.**  ") == "go to desk 1"
  assert ta.normalize_action("`'look'`.") == "look"
  assert ta.normalize_action("<open drawer 2>") == "open drawer 2"
  assert ta.normalize_action("...") == ""


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="text"):
    ta.parse_output(None)
  with pytest.raises(ValueError, match="pick"):
    ta.parse_output("Action: look", pick="middle")
  with pytest.raises(ValueError, match="action"):
    ta.format_output("r", "  ")


class _Plain:
  chat_template = None


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  return tokenizer_lib.train_tokenizer(["Think: go\nAction: go to desk 1", "You are in a room."],
                                       str(path), vocab_size=300)


def test_chat_prompt_is_the_qwen_template(chat_tokenizer):
  prompt = ta.format_prompt(chat_tokenizer, "You are in a room.\nYour task is to: x")
  # Written out from Qwen's chat format, not from the template code.
  expected = ("<|im_start|>system\n" + ta.SYSTEM_PROMPT + "<|im_end|>\n"
              "<|im_start|>user\nYou are in a room.\nYour task is to: x<|im_end|>\n"
              "<|im_start|>assistant\n")
  assert prompt == expected
  no_system = ta.format_prompt(chat_tokenizer, "ctx", system=None)
  assert no_system == "<|im_start|>user\nctx<|im_end|>\n<|im_start|>assistant\n"
  # The template's end of turn is the tokenizer's eos: generation stops there.
  assert chat_tokenizer.eos_token == "<|im_end|>"


def test_enable_thinking_reaches_the_template(chat_tokenizer):
  class Recorder:
    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, **extra):
      self.seen = (messages, add_generation_prompt, extra)
      return "p"

  tok = Recorder()
  ta.format_prompt(tok, "ctx", enable_thinking=False)
  assert tok.seen[1] is True and tok.seen[2] == {"enable_thinking": False}
  ta.format_prompt(tok, "ctx")
  assert tok.seen[2] == {}


def test_plain_prompt(chat_tokenizer):
  assert ta.format_prompt(_Plain(), "ctx") == ta.SYSTEM_PROMPT + "\n\nctx\n"
  assert ta.format_prompt(_Plain(), "ctx", system=None) == "ctx\n"
  # chat=False on a chat tokenizer gives the plain prompt too.
  assert ta.format_prompt(chat_tokenizer, "ctx", chat=False, system="S") == "S\n\nctx\n"


def test_prompt_bad_inputs(chat_tokenizer):
  with pytest.raises(ValueError, match="chat"):
    ta.format_prompt(_Plain(), "ctx", chat=True)
  with pytest.raises(ValueError, match="context"):
    ta.format_prompt(chat_tokenizer, ["ctx"])
