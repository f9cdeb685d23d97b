"""HAD's preference data (harnax.train.had): teacher labels with the validity filter, the
action-only scoring sequences, and the student's margins against independent full forwards."""

from flax import nnx
import jax
import numpy as np
import pytest

from harnax import models
from harnax.envs.text.record import Record
from harnax.models import tokenizer as tokenizer_lib
from harnax.train import distill
from harnax.train import had

pytestmark = pytest.mark.x64

CONTEXTS = ["Your task is to: put a apple in fridge.\n> go to countertop 1\nOn the countertop 1, "
            "you see a bread 1.", "Your task is to: put a cup in shelf.\n> look\nNothing."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  texts = CONTEXTS + ["Think: I go there.\nAction: go to fridge 1", "take apple 1 from fridge 1"]
  tok = tokenizer_lib.train_tokenizer(texts, str(tmp_path_factory.mktemp("tok")), vocab_size=300)
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": tok.vocab_size, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 512,
      "tie_word_embeddings": False, "eos_token_id": tok.eos_token_id,
      "pad_token_id": tok.pad_token_id})
  model = models.from_config(cfg, seed=0, param_dtype=jax.numpy.float64)
  return tok, model


def test_labels_filter_contradictions_and_count_unparsable_outputs():
  rec = Record("alfworld")
  rec.arrive("countertop 1")
  rec.see_contents("countertop 1", ["bread 1"])
  with_h = ["Think: the record.\nAction: go to fridge 1",
            "Action: take apple 1 from countertop 1",     # contradicts: seen without it
            "Action: look",
            ""]                                            # no action
  without = ["Action: go to cabinet 1", "Action: go to fridge 1", "Action: look",
             "Action: look"]
  labels = had.preference_labels(with_h, without, [rec] * 4)
  assert labels.positive[:3] == ("go to fridge 1", "take apple 1 from countertop 1", "look")
  np.testing.assert_array_equal(labels.differ, [True, True, False, False])
  np.testing.assert_array_equal(labels.valid, [True, False, True, True])
  np.testing.assert_array_equal(labels.unparsable, [False, False, False, True])
  assert "without apple 1" in labels.reasons[1]
  with pytest.raises(ValueError, match="one per state"):
    had.preference_labels(with_h, without[:2], [rec] * 4)


def test_names_action_matches_whole_words_in_order():
  assert had.names_action("So I Go To  cabinet 1.", "go to cabinet 1")
  assert not had.names_action("I go to cabinet 10", "go to cabinet 1")
  assert not had.names_action("cabinet 1, go to", "go to cabinet 1")
  assert not had.names_action("anything", "") and not had.names_action(None, "look")


def test_against_reasoning_needs_the_named_action_taken_and_another_positive():
  think = "The apple is not here, so I go to fridge 1."
  assert had.against_reasoning(think, "go to fridge 1", "open cabinet 2")
  assert not had.against_reasoning(think, "go to fridge 1", "go to fridge 1")   # a⁺ taken
  assert not had.against_reasoning(think, "look", "open cabinet 2")     # action not named
  assert not had.against_reasoning("I put it in.", "move apple 1 to fridge 1", "look")
  assert not had.against_reasoning(think, "go to fridge 1", "")         # a⁺ unparsable
  assert not had.against_reasoning(think, None, "look")                 # no student action


def test_action_mask_covers_exactly_the_action_tokens(setup):
  tok, _ = setup
  pairs = had.encode_action_pairs(tok, CONTEXTS, ["I go there.", "Look first."],
                                  ["go to fridge 1", "look"], ["take apple 1 from fridge 1", ""],
                                  chat=False)
  assert pairs.ids.shape[0] == 4
  for row, action in zip(range(4), ["go to fridge 1", "take apple 1 from fridge 1", "look",
                                    "look"]):
    tokens = pairs.ids[row][pairs.action_mask[row]]
    assert tok.decode(list(map(int, tokens))) == action
    before = pairs.ids[row][pairs.attention_mask[row] & ~pairs.action_mask[row]]
    assert tok.decode(list(map(int, before))).endswith("Action: ")
  # The two rows of a state share everything before the action.
  n = int((~pairs.action_mask[0] & pairs.attention_mask[0]).sum())
  np.testing.assert_array_equal(pairs.ids[0, :n], pairs.ids[1, :n])


def test_margins_and_loss_against_separate_forwards(setup):
  tok, model = setup
  pairs = had.encode_action_pairs(tok, CONTEXTS, ["I go there.", "Look first."],
                                  ["go to fridge 1", "look"], ["take apple 1 from fridge 1",
                                                               "go to fridge 1"], chat=False)
  # Under jit: one compile each instead of one per eager op.
  pos, neg = nnx.jit(lambda m: had.action_means(m, pairs))(model)
  means = []
  for row in range(4):
    length = int(pairs.attention_mask[row].sum())
    ids = pairs.ids[row:row + 1, :length]
    logits = np.asarray(models.forward(model, jax.numpy.asarray(ids)), np.float64)[0]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    positions = np.flatnonzero(pairs.action_mask[row, :length])
    means.append(np.mean([logp[t - 1, ids[0, t]] for t in positions]))
  np.testing.assert_allclose(pos, means[0::2], rtol=1e-9)
  np.testing.assert_allclose(neg, means[1::2], rtol=1e-9)
  differ, valid = np.array([True, True]), np.array([True, False])
  loss, active = nnx.jit(lambda m: had.preference_loss(m, pairs, differ, valid, beta=0.5))(model)
  ref, _ = distill.action_preference_loss(np.array(means[0::2]), np.array(means[1::2]), differ,
                                          valid, beta=0.5)
  np.testing.assert_allclose(loss, ref, rtol=1e-9)
  assert int(active) == 1
  zero, _ = had.preference_loss(model, pairs, np.array([False, False]), valid)
  assert float(zero) == 0.0
