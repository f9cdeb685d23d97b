"""Flax NNX ports of Qwen3, Qwen3-MoE, Qwen3.5 (dense, MoE), Gemma 3 and Gemma 4 (text) with
Hugging Face checkpoint I/O.

```python
from harnax import models
model = models.load_pretrained(path)           # HF directory -> CausalLM
logits = model(input_ids, attention_mask=mask) # [B, T, V] float32, left padding allowed
cache = model.init_cache(batch_size, max_length)
logits, cache = model.prefill(input_ids, mask, cache=cache)  # [B, V]; then model.decode_step
models.save_pretrained(model, path)            # back to the HF format
```
"""

from harnax.models.checkpoint import restore_state
from harnax.models.checkpoint import save_state
from harnax.models.config import DecoderConfig
from harnax.models.config import RopeConfig
from harnax.models.decoding import Generation
from harnax.models.decoding import decode
from harnax.models.decoding import generate
from harnax.models.decoding import prefill
from harnax.models.decoding import sample_token
from harnax.models.gemma3 import Gemma3Config
from harnax.models.gemma4 import Gemma4Config
from harnax.models.gemma4_layers import Gemma4CausalLM
from harnax.models.hf import CheckpointError
from harnax.models.hf import abstract_model
from harnax.models.hf import config_from_hf_dict
from harnax.models.hf import from_config
from harnax.models.hf import load_pretrained
from harnax.models.hf import save_pretrained
from harnax.models.logprobs import SpanScore
from harnax.models.logprobs import concat_completion
from harnax.models.logprobs import score_spans
from harnax.models.logprobs import sequence_logprobs
from harnax.models.logprobs import token_logprobs
from harnax.models.model import AttentionCache
from harnax.models.model import Cache
from harnax.models.model import CausalLM
from harnax.models.model import forward
from harnax.models.model import param_count
from harnax.models.model import positions_from_mask
from harnax.models.qwen3 import Qwen3Config
from harnax.models.qwen3_5 import Qwen35Config
from harnax.models.qwen3_5 import Qwen35MoeConfig
from harnax.models.qwen3_moe import Qwen3MoeConfig
from harnax.models.tokenizer import Tokenizer

__all__ = [
    "AttentionCache",
    "Cache",
    "CausalLM",
    "CheckpointError",
    "DecoderConfig",
    "Gemma3Config",
    "Gemma4CausalLM",
    "Gemma4Config",
    "Generation",
    "Qwen3Config",
    "Qwen35Config",
    "Qwen35MoeConfig",
    "Qwen3MoeConfig",
    "RopeConfig",
    "SpanScore",
    "Tokenizer",
    "abstract_model",
    "concat_completion",
    "config_from_hf_dict",
    "decode",
    "forward",
    "from_config",
    "generate",
    "load_pretrained",
    "param_count",
    "positions_from_mask",
    "prefill",
    "restore_state",
    "sample_token",
    "save_pretrained",
    "save_state",
    "score_spans",
    "sequence_logprobs",
    "token_logprobs",
]
