"""Tokenizer wrapper over the ``tokenizers`` library for local HF model directories.

Loads ``tokenizer.json`` and, where present, special tokens and the chat template from
``tokenizer_config.json`` (or ``chat_template.jinja``). Batches come out left-padded, ready for
:func:`harnax.models.generate`.
"""

from __future__ import annotations

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
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
      raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(self.chat_template)
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                           **extra)
