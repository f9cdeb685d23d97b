"""Supervised next-token learning: the loss against float64 NumPy, training, determinism."""

from flax import nnx
import jax
import numpy as np
import pytest

from harnax import models
from harnax import train
from harnax.train import sft

VOCAB = 40
EOS = 2


def _model(seed=0):
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": VOCAB, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 64,
      "tie_word_embeddings": False, "eos_token_id": EOS, "pad_token_id": 0})
  return models.from_config(cfg, seed=seed)


class CharTokenizer:
  """One token per character (`ord(c) - 90`), eos 2, pad 0: enough for encode_examples."""

  eos_token_id = EOS
  pad_token_id = 0

  def encode(self, text, add_special_tokens=False):
    del add_special_tokens
    return [ord(c) - 90 for c in text]


_loss = nnx.jit(train.sft_loss)


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def _reference_loss(logits, ids, attention, loss, prompt_weight=0.0):
  """Weighted mean NLL in float64, token by token: weight 1 on loss-mask tokens, prompt_weight
  on the other real tokens, each only with a real predecessor."""
  logits = np.asarray(logits, np.float64)
  total, count = 0.0, 0.0
  for b in range(ids.shape[0]):
    for t in range(1, ids.shape[1]):
      if attention[b, t] and attention[b, t - 1]:
        w = 1.0 if loss[b, t] else prompt_weight
        row = logits[b, t - 1]
        logz = row.max() + np.log(np.sum(np.exp(row - row.max())))
        total -= w * (row[ids[b, t]] - logz)
        count += w
  return total / count


def test_loss_matches_float64_numpy():
  model = _model()
  rng = np.random.default_rng(0)
  ids = rng.integers(3, VOCAB, (4, 9)).astype(np.int32)
  attention = np.ones((4, 9), bool)
  attention[1, 7:] = False        # right padding
  attention[2, :3] = False        # left padding
  loss = np.zeros((4, 9), bool)
  loss[0, 5:] = True
  loss[1, 4:] = True              # reaches into the padding: those tokens must not count
  loss[2, 2:5] = True             # token 3 is the first real one (no predecessor): not counted
  loss[3, [1, 4, 8]] = True
  logits = models.forward(model, ids, attention)
  expected = _reference_loss(logits, ids, attention, loss)
  got = float(_loss(model, ids, attention, loss))
  np.testing.assert_allclose(got, expected, rtol=2e-6)
  # A mask with nothing to count gives 0, not NaN.
  assert float(_loss(model, ids, attention, np.zeros_like(loss))) == 0.0
  # The prompt tokens count with their weight; padding and first tokens still never count.
  for w in (0.25, 1.0):
    np.testing.assert_allclose(float(_loss(model, ids, attention, loss, w)),
                               _reference_loss(logits, ids, attention, loss, w), rtol=2e-6)


def test_encode_examples_layout():
  tok = CharTokenizer()
  data = train.encode_examples(tok, ["abc", "de"], ["x", "yz"], length=8)
  np.testing.assert_array_equal(data.ids, [[7, 8, 9, 30, EOS, 0, 0, 0],
                                           [10, 11, 31, 32, EOS, 0, 0, 0]])
  np.testing.assert_array_equal(data.attention_mask, [[1, 1, 1, 1, 1, 0, 0, 0],
                                                      [1, 1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(data.loss_mask, [[0, 0, 0, 1, 1, 0, 0, 0],
                                                 [0, 0, 1, 1, 1, 0, 0, 0]])
  with pytest.raises(ValueError, match="length"):
    train.encode_examples(tok, ["abc"], ["x"], length=4)
  with pytest.raises(ValueError, match="outputs"):
    train.encode_examples(tok, ["abc"], ["x", "y"])


def _dataset():
  """Prompts of random letters; the output is the prompt's first letter repeated twice."""
  rng = np.random.default_rng(3)
  letters = "abcdefghij"
  prompts = ["".join(rng.choice(list(letters), 5)) for _ in range(24)]
  outputs = [p[0] * 2 for p in prompts]
  return train.encode_examples(CharTokenizer(), prompts, outputs)


@pytest.fixture(scope="module")
def trained():
  data = _dataset()
  model = _model()
  before = [np.array(p) for p in _params(model)]
  result = train.train_sft(model, data, num_steps=80, batch_size=8, learning_rate=1e-2,
                           warmup_steps=5, seed=1)
  return data, model, before, result


def test_training_lowers_the_loss_and_leaves_the_input_model(trained):
  data, model, before, result = trained
  full = lambda m: float(_loss(m, data.ids, data.attention_mask, data.loss_mask))
  assert result.losses.shape == (80,)
  assert full(result.model) < 0.5 * full(model)
  assert np.mean(result.losses[-10:]) < 0.5 * np.mean(result.losses[:5])
  for p, q in zip(before, _params(model)):
    np.testing.assert_array_equal(p, np.asarray(q))


def test_deterministic_given_the_seed(trained):
  data, model, _, result = trained
  again = train.train_sft(model, data, num_steps=80, batch_size=8, learning_rate=1e-2,
                          warmup_steps=5, seed=1)
  np.testing.assert_array_equal(again.losses, result.losses)
  for p, q in zip(_params(again.model), _params(result.model)):
    np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
  other = train.train_sft(model, data, num_steps=3, batch_size=8, learning_rate=1e-2,
                          warmup_steps=5, seed=2)
  assert not np.array_equal(other.losses, result.losses[:3])


def test_batch_order_is_a_permutation_per_epoch():
  order = sft.batch_order(10, 4, 5, seed=0)                    # 20 draws = 2 epochs
  assert order.shape == (5, 4)
  flat = order.reshape(-1)
  assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
  np.testing.assert_array_equal(order, sft.batch_order(10, 4, 5, seed=0))
  assert not np.array_equal(order, sft.batch_order(10, 4, 5, seed=1))


def test_epochs_and_bad_input():
  data = _dataset()
  model = _model()
  assert train.train_sft(model, data, epochs=0.5, batch_size=8,
                         learning_rate=1e-3).losses.shape == (2,)      # ceil(0.5 * 24 / 8)
  with pytest.raises(ValueError, match="num_steps, epochs"):
    train.train_sft(model, data, batch_size=8, learning_rate=1e-3)
  with pytest.raises(ValueError, match="num_steps, epochs"):
    train.train_sft(model, data, num_steps=2, epochs=1, batch_size=8, learning_rate=1e-3)
  with pytest.raises(ValueError, match="batch_size"):
    train.train_sft(model, data, num_steps=2, batch_size=0, learning_rate=1e-3)
  with pytest.raises(ValueError, match="learning_rate"):
    train.train_sft(model, data, num_steps=2, batch_size=8, learning_rate=0.0)
  with pytest.raises(ValueError, match="examples"):
    train.train_sft(model, (data.ids,), num_steps=2, batch_size=8, learning_rate=1e-3)
  for bad in (-0.5, float("nan"), True, "1"):
    with pytest.raises(ValueError, match="prompt_weight"):
      train.train_sft(model, data, num_steps=2, batch_size=8, learning_rate=1e-3,
                      prompt_weight=bad)


def test_length_buckets_cut_only_padding(trained):
  # Right padding is never attended to by a real token (causal mask) and never counted by the
  # loss, so training on batches cut to a bucket of their longest row gives the same run.
  data, model, _, result = trained
  padded = data._replace(ids=np.pad(data.ids, ((0, 0), (0, 9))),
                         attention_mask=np.pad(data.attention_mask, ((0, 0), (0, 9))),
                         loss_mask=np.pad(data.loss_mask, ((0, 0), (0, 9))))
  cut = train.train_sft(model, padded, num_steps=80, batch_size=8, learning_rate=1e-2,
                        warmup_steps=5, seed=1, length_bucket=4)
  np.testing.assert_allclose(cut.losses, result.losses, rtol=2e-5, atol=2e-6)
  with pytest.raises(ValueError, match="length_bucket"):
    train.train_sft(model, data, num_steps=1, batch_size=8, learning_rate=1e-2, length_bucket=0)
  mask = np.array(data.attention_mask)
  mask[0, 0] = False                                                 # a left-padded row
  left = data._replace(attention_mask=mask)
  with pytest.raises(ValueError, match="right-padded"):
    train.train_sft(model, left, num_steps=1, batch_size=8, learning_rate=1e-2, length_bucket=4)
