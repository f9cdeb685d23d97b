"""train_tokenizer: byte-level BPE, Qwen chat format; harnax and transformers read it alike."""

import os
import random

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from harnax.envs import miniwob as mw  # noqa: E402
from harnax.models import tokenizer as tokenizer_lib  # noqa: E402
from harnax.policies import lm  # noqa: E402

VOCAB = 400


def _corpus():
  """Observations of a few task instances under H0 and H5 (both field orders) and outputs."""
  texts, obs, outputs = [], [], []
  for family in mw.FAMILIES:
    for seed in range(2):
      task = mw.sample_task(family, seed)
      outputs.append(mw.candidate_outputs(task))
      for h in ("H0", "H5"):
        for reverse in (False, True):
          c = mw.compile_harness(task, h, reverse_fields=reverse)
          obs += [c.observation(s) for s in range(c.done_state + 1)]
  texts = obs + [o for outs in outputs for o in outs]
  return texts, obs, outputs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  texts, obs, outputs = _corpus()
  path = str(tmp_path_factory.mktemp("tok"))
  tok = tokenizer_lib.train_tokenizer(texts, path, vocab_size=VOCAB)
  return path, tok, texts, obs, outputs


def test_special_tokens_and_files(trained):
  path, tok, _, _, _ = trained
  assert sorted(os.listdir(path)) == ["tokenizer.json", "tokenizer_config.json"]
  assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1,
                                                                                          2]
  assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
  assert 259 < tok.vocab_size <= VOCAB
  prompt = lm.render_prompt(tok, "task: go")
  assert prompt == "<|im_start|>user\ntask: go<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.encode(prompt, add_special_tokens=False)
  assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # special tokens stay whole
  assert tok.decode(ids, skip_special_tokens=False) == prompt


def test_harnax_and_transformers_agree(trained):
  path, tok, _, obs, outputs = trained
  ref = transformers.AutoTokenizer.from_pretrained(path)
  assert (ref.eos_token_id, ref.pad_token_id, ref.bos_token_id) == (
      tok.eos_token_id, tok.pad_token_id, tok.bos_token_id)
  assert len(ref) == tok.vocab_size
  texts = obs[::7] + [o for outs in outputs for o in outs] + ["héllo wörld ✓", "  two  spaces\n"]
  for text in texts:
    for special in (False, True):
      assert tok.encode(text, add_special_tokens=special) == ref.encode(
          text, add_special_tokens=special), text
    ids = tok.encode(text)
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True) == text
  conversations = [
      [{"role": "user", "content": obs[3]}],
      [{"role": "system", "content": "You click."}, {"role": "user", "content": obs[5]},
       {"role": "assistant", "content": "click [2]"}],
  ]
  for messages in conversations:
    for gen in (False, True):
      ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
      theirs = ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
      assert ours == theirs
      assert tok.encode(ours, add_special_tokens=False) == ref.encode(ours,
                                                                      add_special_tokens=False)
  assert ours.endswith("<|im_start|>assistant\n") and ours.count("<|im_end|>\n") == 3


def test_outputs_split_the_same_after_the_prompt(trained):
  _, tok, _, obs, outputs = trained
  prompts = [lm.render_prompt(tok, o) for o in obs[::11]]
  all_outputs = sorted({o for outs in outputs for o in outs} | {"click [1] [4]", "wait"})
  for p in prompts:
    p_ids = tok.encode(p, add_special_tokens=False)
    for o in all_outputs:
      assert tok.encode(p + o, add_special_tokens=False) == p_ids + tok.encode(
          o, add_special_tokens=False), (p[-30:], o)
  # The LM policy's own check passes (it raises otherwise).
  tokens = lm.encode_candidates(tok, prompts, [all_outputs] * len(prompts))
  assert tokens.output_ids.shape[:2] == (len(prompts), len(all_outputs))


def test_deterministic(trained, tmp_path):
  path, _, texts, _, _ = trained
  shuffled = list(texts) + texts[:50]
  random.Random(1).shuffle(shuffled)
  tokenizer_lib.train_tokenizer(shuffled, str(tmp_path), vocab_size=VOCAB)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    with open(os.path.join(path, name), "rb") as a, open(tmp_path / name, "rb") as b:
      assert a.read() == b.read(), name


def test_bad_input(tmp_path):
  with pytest.raises(ValueError, match="vocab_size"):
    tokenizer_lib.train_tokenizer(["abc"], str(tmp_path), vocab_size=100)
  with pytest.raises(ValueError, match="texts"):
    tokenizer_lib.train_tokenizer(["", ""], str(tmp_path), vocab_size=300)
  with pytest.raises(ValueError, match="texts"):
    tokenizer_lib.train_tokenizer("abc", str(tmp_path), vocab_size=300)
  with pytest.raises(ValueError, match="min_frequency"):
    tokenizer_lib.train_tokenizer(["abc"], str(tmp_path), vocab_size=300, min_frequency=0)
  with pytest.raises(ValueError, match="pre_tokenize"):
    tokenizer_lib.train_tokenizer(["abc"], str(tmp_path), vocab_size=300, pre_tokenize="bytes")


def test_word_pre_tokenization_names_are_the_same_tokens_everywhere(tmp_path):
  """With ``pre_tokenize="words"`` a name reads as the same tokens in a list, in a command and
  in a sentence (what a small agent copies), and transformers tokenizes it alike."""
  texts = ["not visited: cabinet 1, cabinet 10, drawer 2\n> go to cabinet 10\n",
           "Think: cabinet 10 is closed.\nAction: open cabinet 10"] * 5
  path = str(tmp_path / "tok")
  tok = tokenizer_lib.train_tokenizer(texts, path, vocab_size=300, pre_tokenize="words")
  name = tok.encode(" cabinet 10", add_special_tokens=False)
  assert [tok.decode([i]) for i in name] == [" cabinet", " 10"]
  for text in ("not visited: cabinet 1, cabinet 10", "go to cabinet 10", "Think: cabinet 10 is"):
    ids = tok.encode(text, add_special_tokens=False)
    assert any(ids[i:i + 2] == name for i in range(len(ids) - 1)), text
    assert tok.decode(ids) == text
  ref = transformers.AutoTokenizer.from_pretrained(path)
  for text in texts[:2]:
    assert ref.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_name_pre_tokenization_makes_an_instance_one_token(tmp_path):
  """With ``pre_tokenize="names"`` a frequent "word number" name is one token wherever it
  stands (so copying it is copying one token); a number after punctuation stays apart, and
  transformers tokenizes the texts alike."""
  texts = ["unexplored: cabinet 1, cabinet 10, drawer 2\n> go to cabinet 10\n",
           "Think: location: cabinet 10 (closed). I open cabinet 10.\nAction: open cabinet 10",
           "seen in drawer 2 (turn 3): nothing"] * 5
  path = str(tmp_path / "tok")
  tok = tokenizer_lib.train_tokenizer(texts, path, vocab_size=400, pre_tokenize="names")
  name = tok.encode(" cabinet 10", add_special_tokens=False)
  assert [tok.decode([i]) for i in name] == [" cabinet 10"]
  for text in ("unexplored: cabinet 1, cabinet 10", "go to cabinet 10", "I open cabinet 10."):
    ids = tok.encode(text, add_special_tokens=False)
    assert name[0] in ids, text
    assert tok.decode(ids) == text
  # "cabinet 1" is not the prefix of "cabinet 10": the number is whole.
  assert tok.encode(" cabinet 1", add_special_tokens=False)[0] not in tok.encode(
      " cabinet 10", add_special_tokens=False)
  ref = transformers.AutoTokenizer.from_pretrained(path)
  for text in texts[:3]:
    assert ref.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
