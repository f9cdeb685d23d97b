"""Tokenizer wrapper on a tiny tokenizer trained here, checked against transformers."""

import json

import numpy as np
import pytest
import transformers

tokenizers = pytest.importorskip("tokenizers")

from harnax.models.tokenizer import Tokenizer  # noqa: E402

TEMPLATE = ("{% for m in messages %}<start> {{ m['role'] }} {{ m['content'] }} <end> "
            "{% endfor %}{% if add_generation_prompt %}<start> assistant {% endif %}")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  from tokenizers import Tokenizer as T
  from tokenizers import models
  from tokenizers import pre_tokenizers
  from tokenizers import processors
  from tokenizers import trainers
  corpus = ["open the door", "take the key", "go north", "look at the red key", "unlock door"]
  tok = T(models.WordLevel(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  specials = ["<pad>", "<unk>", "<bos>", "<eos>", "<start>", "<end>"]
  tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
  tok.post_processor = processors.TemplateProcessing(
      single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
  path = tmp_path_factory.mktemp("tok")
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
      "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": TEMPLATE}))
  return str(path)


def test_encode_decode_match_transformers(tok_dir):
  ours = Tokenizer.from_dir(tok_dir)
  ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
  for text in ["open the red door", "take key north", "fly away"]:
    assert ours.encode(text) == ref(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)[
        "input_ids"]
    ids = ours.encode(text)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
  assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
      ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)


def test_batch_encode_left_pads(tok_dir):
  ours = Tokenizer.from_dir(tok_dir)
  ref = transformers.AutoTokenizer.from_pretrained(tok_dir, padding_side="left")
  texts = ["go north", "look at the red key"]
  ids, mask = ours.batch_encode(texts)
  expected = ref(texts, padding=True, return_tensors="np")
  np.testing.assert_array_equal(ids, expected["input_ids"])
  np.testing.assert_array_equal(mask, expected["attention_mask"])
  with pytest.raises(ValueError, match="length"):
    ours.batch_encode(texts, length=3)


def test_chat_template_matches_transformers(tok_dir):
  ours = Tokenizer.from_dir(tok_dir)
  ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
  messages = [{"role": "user", "content": "open the door"},
              {"role": "assistant", "content": "take the key"}]
  for gen_prompt in (False, True):
    assert ours.apply_chat_template(messages, add_generation_prompt=gen_prompt) == \
        ref.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=False)


def test_chat_template_file_and_missing_template(tok_dir, tmp_path):
  import shutil
  d = tmp_path / "tok2"
  shutil.copytree(tok_dir, d)
  config = json.loads((d / "tokenizer_config.json").read_text())
  del config["chat_template"]
  (d / "tokenizer_config.json").write_text(json.dumps(config))
  assert Tokenizer.from_dir(str(d)).chat_template is None
  with pytest.raises(ValueError, match="chat_template"):
    Tokenizer.from_dir(str(d)).apply_chat_template([{"role": "user", "content": "go"}])
  (d / "chat_template.jinja").write_text(TEMPLATE)  # the transformers 5 layout
  msgs = [{"role": "user", "content": "go north"}]
  assert Tokenizer.from_dir(str(d)).apply_chat_template(msgs) == \
      transformers.AutoTokenizer.from_pretrained(str(d)).apply_chat_template(msgs, tokenize=False)
