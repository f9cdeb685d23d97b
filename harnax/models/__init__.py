"""Flax NNX ports of Qwen3, Qwen3-MoE and Gemma 3 (text) with Hugging Face checkpoint I/O.

```python
from harnax import models
model = models.load_pretrained(path)           # HF directory -> CausalLM
logits = model(input_ids, attention_mask=mask) # [B, T, V] float32, left padding allowed
cache = model.init_cache(batch_size, max_length)
logits, cache = model.prefill(input_ids, mask, cache=cache)  # [B, V]; then model.decode_step
models.save_pretrained(model, path)            # back to the HF format
```
"""

from harnax.models.checkpoint import restore_state, save_state
from harnax.models.config import DecoderConfig, RopeConfig
from harnax.models.decoding import Generation, decode, generate, prefill, sample_token
from harnax.models.gemma3 import Gemma3Config
from harnax.models.hf import (
    CheckpointError,
    abstract_model,
    config_from_hf_dict,
    from_config,
    load_pretrained,
    save_pretrained,
)
from harnax.models.logprobs import (SpanScore, concat_completion, score_spans, sequence_logprobs,
                                    token_logprobs)
from harnax.models.model import (AttentionCache, Cache, CausalLM, forward, param_count,
                                 positions_from_mask)
from harnax.models.qwen3 import Qwen3Config
from harnax.models.qwen3_moe import Qwen3MoeConfig
from harnax.models.tokenizer import Tokenizer

__all__ = [
    "AttentionCache",
    "Cache",
    "CausalLM",
    "CheckpointError",
    "DecoderConfig",
    "Gemma3Config",
    "Generation",
    "Qwen3Config",
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
