"""Tokenizer wrapper over the ``tokenizers`` library for local HF model directories.

Loads ``tokenizer.json`` and, where present, special tokens and the chat template from
``tokenizer_config.json`` (or ``chat_template.jinja``). Batches come out left-padded, ready for
:func:`harnax.models.generate`.

:func:`train_tokenizer` trains a small byte-level BPE tokenizer with Qwen's special tokens and
chat format on local texts and saves it as a Hugging Face directory (no download).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Sequence

import numpy as np


def _token_str(value) -> str | None:
  if isinstance(value, dict):  # {"content": "<eos>", ...} in older configs
    return value.get("content")
  return value


class Tokenizer:
  """Text <-> token ids for one model directory.

  Attributes:
    bos_token, eos_token, pad_token: special token strings (or None); ``*_id`` their ids.
    chat_template: Jinja source of the chat template, or None.
  """

  def __init__(self, tokenizer, *, config: dict[str, Any] | None = None,
               chat_template: str | None = None):
    self._tok = tokenizer
    config = config or {}
    self.bos_token = _token_str(config.get("bos_token"))
    self.eos_token = _token_str(config.get("eos_token"))
    self.pad_token = _token_str(config.get("pad_token"))
    self.chat_template = chat_template or config.get("chat_template")
    if isinstance(self.chat_template, list):  # named templates: use "default"
      named = {t["name"]: t["template"] for t in self.chat_template}
      self.chat_template = named.get("default", next(iter(named.values())))

  @classmethod
  def from_dir(cls, path: str) -> "Tokenizer":
    """Loads ``path/tokenizer.json`` (+ ``tokenizer_config.json``, ``chat_template.jinja``)."""
    from tokenizers import Tokenizer as _HFTokenizer  # optional dependency

    file = os.path.join(path, "tokenizer.json")
    if not os.path.exists(file):
      raise FileNotFoundError(f"{path}: tokenizer.json not found")
    config = {}
    if os.path.exists(os.path.join(path, "tokenizer_config.json")):
      with open(os.path.join(path, "tokenizer_config.json")) as f:
        config = json.load(f)
    template = None
    if os.path.exists(os.path.join(path, "chat_template.jinja")):
      with open(os.path.join(path, "chat_template.jinja")) as f:
        template = f.read()
    return cls(_HFTokenizer.from_file(file), config=config, chat_template=template)

  def token_to_id(self, token: str | None) -> int | None:
    return None if token is None else self._tok.token_to_id(token)

  @property
  def bos_token_id(self) -> int | None:
    return self.token_to_id(self.bos_token)

  @property
  def eos_token_id(self) -> int | None:
    return self.token_to_id(self.eos_token)

  @property
  def pad_token_id(self) -> int | None:
    return self.token_to_id(self.pad_token)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def batch_encode(self, texts: Sequence[str], *, add_special_tokens: bool = True,
                   pad_id: int | None = None, length: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ``(input_ids, attention_mask)``, both [B, T] int32.

    ``T`` is the longest text, or ``length`` (an error if a text is longer: never truncated).
    """
    rows = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
    longest = max((len(r) for r in rows), default=0)
    t = longest if length is None else length
    if longest > t:
      raise ValueError(f"length: a text has {longest} tokens, more than length={t}")
    pad = pad_id if pad_id is not None else (self.pad_token_id or 0)
    ids = np.full((len(rows), t), pad, np.int32)
    mask = np.zeros((len(rows), t), np.int32)
    for i, r in enumerate(rows):
      if r:
        ids[i, t - len(r):] = r
        mask[i, t - len(r):] = 1
    return ids, mask

  def apply_chat_template(self, messages: list[dict[str, Any]], *,
                          add_generation_prompt: bool = False, **extra) -> str:
    """Renders ``messages`` with the model's chat template (HF Jinja conventions)."""
    if not self.chat_template:
      raise ValueError("chat_template: this tokenizer has no chat template")
    template = _compiled_template(self.chat_template)
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                           **extra)


@functools.lru_cache(maxsize=16)
def _compiled_template(source: str):
  """The Jinja template of a chat template's source, compiled once (compiling costs ~ms)."""
  import jinja2
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
      x, indent=indent, ensure_ascii=ensure_ascii)
  env.globals["raise_exception"] = raise_exception
  return env.from_string(source)


# -- training a tokenizer ------------------------------------------------------------------

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
"""The special tokens of a trained tokenizer, ids 0, 1, 2: padding, turn start, turn end (the
end-of-output token, ``eos_token``), as in Qwen."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""Qwen's chat format: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message; the
generation prompt ``<|im_start|>assistant\\n`` opens the assistant turn."""

# Pre-tokenization (before the byte-level mapping; BPE never merges across these pieces): every
# digit alone, every run of newlines, and every run of other characters between them. Inside a
# run BPE merges freely, so frequent fragments of a text format (']: checkbox "', '" (checked)')
# become single tokens and prompts stay short; a number reads digit by digit. A newline is
# never joined to what follows it, so an output tokenizes the same after a prompt that ends
# with a newline (the chat generation prompt) as on its own.
SPLIT_PATTERN = r"\p{N}|[\r\n]+|[^\r\n\p{N}]+"
# Word pre-tokenization, for texts whose names must be copied exactly (text-game agents): a word
# or a whole number with its leading space, a run of punctuation, a run of newlines or other
# space. "go to cabinet 10" and "not visited: cabinet 10, ..." then hold the same two tokens
# " cabinet", " 10", so copying a name is copying tokens.
WORD_PATTERN = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|[\r\n]+|[^\S\r\n]+"
# Name pre-tokenization: as words, but a word followed by a space and a whole number is one
# piece (" cabinet 10"), so an instance name the texts use often becomes one token, and copying
# a name from the context is copying one token.
NAME_PATTERN = r" ?\p{L}+ \p{N}+(?!\p{N})| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|[\r\n]+|[^\S\r\n]+"
PATTERNS = {"runs": SPLIT_PATTERN, "words": WORD_PATTERN, "names": NAME_PATTERN}


def train_tokenizer(texts: Sequence[str], path: str, *, vocab_size: int,
                    min_frequency: int = 2, max_token_length: int | None = 24,
                    model_max_length: int = 4096, pre_tokenize: str = "runs") -> Tokenizer:
  """Trains a byte-level BPE tokenizer on ``texts`` and saves it as a HF directory.

  The tokenizer has the special tokens ``SPECIAL_TOKENS`` (ids 0, 1, 2), pad token
  ``<|endoftext|>``, eos token ``<|im_end|>`` (the end of an output), no bos token, and the
  Qwen-style ``CHAT_TEMPLATE``. Every byte is in the vocabulary, so any text encodes. Training
  is deterministic: the texts are deduplicated and sorted first, so the same set of texts gives
  the same ``tokenizer.json`` in any order and in any process.

  ``path`` receives ``tokenizer.json`` and ``tokenizer_config.json``, which both
  :meth:`Tokenizer.from_dir` and ``transformers.AutoTokenizer.from_pretrained`` read (same
  ids, same rendered chat prompts).

  Args:
    texts: the training texts (at least one non-empty).
    path: the output directory (created if missing; existing tokenizer files are replaced).
    vocab_size: the largest vocabulary, special tokens and the 256 bytes included (at least
      259); smaller when the texts run out of pairs to merge.
    min_frequency: a pair is merged only if it occurs at least this often.
    max_token_length: the longest token in characters (None: no limit).
    model_max_length: recorded in ``tokenizer_config.json`` (transformers' length limit).
    pre_tokenize: ``"runs"`` (:data:`SPLIT_PATTERN`: digits alone, merges inside runs),
      ``"words"`` (:data:`WORD_PATTERN`: words and whole numbers with their leading space) or
      ``"names"`` (:data:`NAME_PATTERN`: as words, "word number" one piece).

  Returns:
    The saved tokenizer, loaded back with :meth:`Tokenizer.from_dir`.
  """
  from tokenizers import Regex  # optional dependency
  from tokenizers import Tokenizer as _HFTokenizer
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import normalizers
  from tokenizers import pre_tokenizers
  from tokenizers import processors
  from tokenizers import trainers

  if isinstance(texts, str):
    raise ValueError("texts: expected a sequence of strings, got one string")
  corpus = sorted({str(t) for t in texts if t})
  if not corpus:
    raise ValueError("texts: expected at least one non-empty text")
  if pre_tokenize not in PATTERNS:
    raise ValueError(f"pre_tokenize: expected one of {sorted(PATTERNS)}, got {pre_tokenize!r}")
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  smallest = len(alphabet) + len(SPECIAL_TOKENS)
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < smallest:
    raise ValueError(f"vocab_size: expected an int >= {smallest} (the 256 bytes and "
                     f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size!r}")
  if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
    raise ValueError(f"min_frequency: expected a positive int, got {min_frequency!r}")
  if max_token_length is not None and (not isinstance(max_token_length, int)
                                       or max_token_length < 1):
    raise ValueError(f"max_token_length: expected a positive int or None, got "
                     f"{max_token_length!r}")

  tok = _HFTokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(PATTERNS[pre_tokenize]), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
      special_tokens=list(SPECIAL_TOKENS), initial_alphabet=sorted(alphabet),
      max_token_length=max_token_length)
  tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
  for i, token in enumerate(SPECIAL_TOKENS):
    if tok.token_to_id(token) != i:
      raise RuntimeError(f"special token {token}: expected id {i}, got {tok.token_to_id(token)}")

  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                    "single_word": False, "special": True}
           for i, t in enumerate(SPECIAL_TOKENS)}
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "added_tokens_decoder": added,
      "bos_token": None,
      "eos_token": IM_END,
      "pad_token": PAD_TOKEN,
      "unk_token": None,
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "split_special_tokens": False,
      "model_max_length": int(model_max_length),
      "chat_template": CHAT_TEMPLATE,
  }
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  stale = os.path.join(path, "chat_template.jinja")  # would take precedence over the config
  if os.path.exists(stale):
    os.remove(stale)
  return Tokenizer.from_dir(path)
