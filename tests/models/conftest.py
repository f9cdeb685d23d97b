"""Tiny random Hugging Face checkpoints, built locally with transformers (never downloaded).

Every reference value in tests/models comes from these transformers models, never from harnax.
Fixtures are session-scoped: each pytest-xdist worker builds and loads each model once.
"""

import dataclasses
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 96


@dataclasses.dataclass
class Pair:
  """A transformers model, its saved directory and the harnax model loaded from it."""

  name: str
  path: str
  hf: object
  model: object


def hf_config(name: str):
  """Tiny configs exercising every feature: GQA, q/k-norm, scaled RoPE, MoE, sliding window."""
  common = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)
  if name == "qwen3":
    return transformers.Qwen3Config(
        **common, intermediate_size=48, num_hidden_layers=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
                         "original_max_position_embeddings": 16}, eos_token_id=5, pad_token_id=0)
  if name == "qwen3_tied":
    return transformers.Qwen3Config(
        **common, intermediate_size=48, num_hidden_layers=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, eos_token_id=5)
  if name == "qwen3_swa":  # Qwen's own sliding window: layers >= max_window_layers
    return transformers.Qwen3Config(
        **common, intermediate_size=48, num_hidden_layers=2, use_sliding_window=True,
        sliding_window=4, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0})
  if name == "qwen3_moe":
    return transformers.Qwen3MoeConfig(
        **common, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=3,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, eos_token_id=5)
  if name == "qwen3_moe_norm":
    return transformers.Qwen3MoeConfig(
        **common, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=2,
        num_experts=5, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, eos_token_id=5)
  if name == "gemma3":
    return transformers.Gemma3TextConfig(
        **common, intermediate_size=48, num_hidden_layers=4, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000.0}},
        query_pre_attn_scalar=24, final_logit_softcapping=3.0, eos_token_id=1, pad_token_id=0,
        bos_token_id=2)
  raise KeyError(name)


def build_hf(name: str, path: str):
  torch.manual_seed(zlib.crc32(name.encode()))
  model = transformers.AutoModelForCausalLM.from_config(hf_config(name)).eval()
  with torch.no_grad():
    for pname, p in model.named_parameters():
      # Perturb everything so that identity-initialised norms (ones / zeros) cannot hide a
      # convention bug, and logits are far from uniform.
      p.add_((0.3 if "norm" in pname else 0.05) * torch.randn_like(p))
  model.save_pretrained(path)
  return model


_CACHE = {}


def get_pair(name: str, tmp_path_factory) -> Pair:
  if name not in _CACHE:
    from harnax import models
    path = str(tmp_path_factory.mktemp(name))
    hf = build_hf(name, path)
    _CACHE[name] = Pair(name, path, hf, models.load_pretrained(path))
  return _CACHE[name]


@pytest.fixture(scope="session")
def pair_factory(tmp_path_factory):
  return lambda name: get_pair(name, tmp_path_factory)


def padded_batch(seed: int = 0, batch: int = 3, length: int = 11, pads=(0, 3, 6)):
  """Left-padded ids/mask (numpy int64); rows are longer than the tiny sliding window."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(6, VOCAB, (batch, length))
  mask = np.ones((batch, length), np.int64)
  for row, pad in enumerate(pads[:batch]):
    mask[row, :pad] = 0
  return ids * mask, mask


def hf_logits(hf, ids, mask):
  """transformers logits with the mask-derived positions harnax uses for left padding."""
  pos = np.clip(mask.cumsum(-1) - 1, 0, None)
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
             position_ids=torch.tensor(pos))
  return out.logits.float().numpy()
