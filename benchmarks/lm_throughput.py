"""Prefill / decode throughput of harnax (jit) vs transformers (torch CPU), ~100M-param models.

For each family (Qwen3, Qwen3-MoE, Gemma 3) a ~100M-parameter random model is built with
transformers and saved; each (framework, family) measurement then runs in its own subprocess
so that its peak memory (``ru_maxrss``) is its own. Both frameworks use float32 and the same
weights. Prefill is the prompt pass of generation in both frameworks: the KV cache is filled
and only the last position is projected onto the vocabulary (``CausalLM.prefill``;
``logits_to_keep=1`` in transformers). Batch-1 decode is also compared with the
memory-bandwidth bound ``bandwidth / parameter bytes`` (every decoded token reads every weight
once), with the bandwidth measured by a numpy copy.

``--preset 0.6b-2b`` runs published shapes instead (Qwen3 0.6B and 1.7B, Gemma 3 1B) with
random weights; with a CUDA build of jax and of torch it runs both frameworks on the GPU
(``--torch-device``, ``--dtype bfloat16``), reports device peak memory instead of RSS and
measures the bandwidth bound on the device. ``--checkpoint-dtype bfloat16`` stores the random
checkpoint in bfloat16 (both frameworks load the same rounded weights in ``--dtype``), so a
model whose float32 weights fit memory once but not twice, Gemma-4-E2B on a 23 GB machine, can
be built and measured.

Usage::

  python benchmarks/lm_throughput.py [--out benchmarks/results/lm_throughput.md] [--quick]
  python benchmarks/lm_throughput.py --preset 0.6b-2b --dtype bfloat16   # on a GPU machine
  python benchmarks/lm_throughput.py --preset 0.6b-2b --families gemma4-e2b \
      --checkpoint-dtype bfloat16 --out benchmarks/results/lm_throughput_0.6b-2b_gemma4.md

``--quick`` (a smoke run) keeps each family's layers and layout with tiny widths
(``QUICK_WIDTHS``: a few million parameters) and a 16-token prompt, 2 new tokens, one repeat.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import memory  # benchmarks/memory.py (this folder is on sys.path when run as a script)
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VOCAB = 32768
CONFIGS = {
    "qwen3": ("Qwen3Config", dict(
        vocab_size=VOCAB, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, moe_intermediate_size=512,
        num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gemma3": ("Gemma3TextConfig", dict(
        vocab_size=VOCAB, hidden_size=640, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
        query_pre_attn_scalar=256)),
}
# Qwen3.5: Gated DeltaNet layers, every 4th layer gated full attention (partial RoPE).
_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10], "mrope_interleaved": True}
CONFIGS["qwen3_5"] = ("Qwen3_5TextConfig", dict(
    vocab_size=VOCAB, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128, linear_num_key_heads=8,
    linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64,
    tie_word_embeddings=True,
    rope_parameters=dict(_QWEN35_ROPE, mrope_section=[4, 6, 6])))
CONFIGS["qwen3_5_moe"] = ("Qwen3_5MoeTextConfig", dict(
    vocab_size=VOCAB, hidden_size=512, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=2, head_dim=128, num_experts=16, num_experts_per_tok=4,
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
    linear_value_head_dim=64, tie_word_embeddings=True,
    rope_parameters=dict(_QWEN35_ROPE, mrope_section=[4, 6, 6])))


_QWEN3_FULL = dict(head_dim=128, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                  vocab_size=151936, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, tie_word_embeddings=True)
# Published shapes (the config.json of each released model), random weights.
LARGE = {
    "qwen3-0.6b": ("Qwen3Config", dict(_QWEN3_FULL, hidden_size=1024, intermediate_size=3072)),
    "qwen3-1.7b": ("Qwen3Config", dict(_QWEN3_FULL, hidden_size=2048, intermediate_size=6144)),
    "gemma3-1b": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
        query_pre_attn_scalar=256)),
}
_QWEN35_FULL = dict(vocab_size=248320, head_dim=256, linear_key_head_dim=128,
                    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
                    num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=24,
                    tie_word_embeddings=True, rope_parameters=_QWEN35_ROPE)
LARGE["qwen3.5-0.8b"] = ("Qwen3_5TextConfig", dict(_QWEN35_FULL, hidden_size=1024,
                                                   intermediate_size=3584))
LARGE["qwen3.5-2b"] = ("Qwen3_5TextConfig", dict(_QWEN35_FULL, hidden_size=2048,
                                                 intermediate_size=6144))
# Gemma 4: sliding / full layers with their own head dims, proportional RoPE on the full ones,
# per-layer inputs, KV sharing over the last layers (double-wide MLP there), as the E models.
_GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}
_GEMMA4_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 7
CONFIGS["gemma4"] = ("Gemma4TextConfig", dict(
    vocab_size=VOCAB, hidden_size=512, intermediate_size=2048, num_hidden_layers=10,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, global_head_dim=512,
    sliding_window=512, layer_types=_GEMMA4_TYPES[:10], num_kv_shared_layers=4,
    use_double_wide_mlp=True, hidden_size_per_layer_input=64, vocab_size_per_layer_input=VOCAB,
    final_logit_softcapping=30.0, rope_parameters=_GEMMA4_ROPE))
# Gemma 4 E2B's published text config (the language model of google/gemma-4-E2B).
LARGE["gemma4-e2b"] = ("Gemma4TextConfig", dict(
    vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35,
    num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
    sliding_window=512, layer_types=_GEMMA4_TYPES, num_kv_shared_layers=20,
    use_double_wide_mlp=True, hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144,
    final_logit_softcapping=30.0, rope_parameters=_GEMMA4_ROPE))
PRESETS = {"100m": CONFIGS, "0.6b-2b": LARGE}
# --quick: every family keeps its preset's layers, heads and layout, with these widths (the
# keys its config has), so a smoke run builds, saves and loads a model of a few million
# parameters (Qwen3-MoE: about 4M instead of 97M).
QUICK_WIDTHS = dict(vocab_size=2048, vocab_size_per_layer_input=2048, hidden_size=128,
                    intermediate_size=256, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64, hidden_size_per_layer_input=16)


def model_config(family: str, preset: str = "100m", quick: bool = False) -> tuple[str, dict]:
  """``(config class name, kwargs)`` of ``family`` in ``preset``; with ``quick`` its widths
  replaced by ``QUICK_WIDTHS``."""
  cls_name, kwargs = PRESETS[preset][family]
  if quick:
    kwargs = {k: QUICK_WIDTHS.get(k, v) for k, v in kwargs.items()}
  return cls_name, kwargs


def _timeit(fn, repeats: int, sync=lambda: None) -> float:
  """Best-of-``repeats`` wall time of ``fn(); sync()`` (seconds)."""
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    sync()
    best = min(best, time.perf_counter() - t0)
  return best


def build_checkpoint(family: str, path: str, preset: str = "100m", dtype: str = "float32",
                     quick: bool = False) -> int:
  """Writes a random-weight checkpoint of ``family``'s config in ``preset`` (``quick``: its
  ``QUICK_WIDTHS`` version), its tensors stored in ``dtype`` (bfloat16 halves the memory the
  build needs; both frameworks then load the same rounded weights in their own dtype).
  Returns the parameter count."""
  import torch
  import transformers
  cls_name, kwargs = model_config(family, preset, quick)
  config = getattr(transformers, cls_name)(**kwargs)
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
  model.save_pretrained(path)
  return sum(p.numel() for p in model.parameters())


def _device_bandwidth_gbs(nbytes: int = 1024**3, repeats: int = 5) -> float:
  """Read + write bandwidth of an elementwise pass over a large array on jax's default device."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones(nbytes // 4, jnp.float32)
  step = jax.jit(lambda x: x + 1.0)
  step(x).block_until_ready()
  return 2 * nbytes / _timeit(lambda: step(x).block_until_ready(), repeats) / 1e9


def measure_harnax(path: str, batch: int, prompt: int, new: int, decode_batches, repeats,
                   dtype: str = "float32", torch_device: str = "cpu"):
  del torch_device
  from flax import nnx
  import jax
  import jax.numpy as jnp

  from harnax import models
  from harnax.models import decoding as gen

  jnp.zeros(1).block_until_ready()  # start the runtime
  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  out = {"device": f"jax {device.platform} ({device.device_kind})",
         "runtime_rss_mb": memory.rss_mb()}
  model = models.load_pretrained(path, dtype=jnp.dtype(dtype))
  out["loaded_rss_mb"] = memory.rss_mb()
  graphdef, state = nnx.split(model)
  rng = np.random.RandomState(0)
  vocab = model.config.vocab_size
  ids = jnp.asarray(rng.randint(0, vocab, (batch, prompt)), jnp.int32)
  mask = jnp.ones_like(ids)

  def run_prefill():
    logits, _ = gen.prefill(graphdef, state, ids, mask, model.init_cache(batch, prompt + 1))
    logits.block_until_ready()

  run_prefill()  # compile
  out["prefill_tok_s"] = batch * prompt / _timeit(run_prefill, repeats)
  for b in decode_batches:
    dids = jnp.asarray(rng.randint(0, vocab, (b, prompt)), jnp.int32)
    dmask = jnp.ones_like(dids)

    def run_decode():
      logits, cache = gen.prefill(graphdef, state, dids, dmask, model.init_cache(b, prompt + new))
      # Dispatch is asynchronous: without this wait the decode timer would also run the
      # rest of the prefill.
      jax.block_until_ready((logits, cache))
      t0 = time.perf_counter()
      res, _ = gen.decode(jax.random.key(0), graphdef, state, cache, logits, max_new_tokens=new)
      res.tokens.block_until_ready()
      return time.perf_counter() - t0

    run_decode()  # compile
    seconds = min(run_decode() for _ in range(repeats))
    out[f"decode_b{b}_tok_s"] = b * new / seconds
  if on_cpu:
    out["peak_mb"] = memory.peak_rss_mb()
  else:
    out["peak_mb"] = device.memory_stats()["peak_bytes_in_use"] / 1024**2
    out["bandwidth_gbs"] = _device_bandwidth_gbs()
  out["param_bytes"] = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  cfg = model.config
  # Batch-1 decode of an MoE reads only the k routed experts per layer.
  inactive = (cfg.mlp_kinds.count("moe") * (cfg.num_experts - cfg.num_experts_per_tok) * 3 *
              cfg.hidden_size * cfg.moe_intermediate_size * jnp.dtype(dtype).itemsize)
  # Gemma 4: its MoE block sits beside a dense MLP in every layer, and a token looks up one
  # row of the per-layer input table.
  if getattr(cfg, "enable_moe_block", False):
    inactive += (cfg.num_layers * (cfg.num_experts - cfg.num_experts_per_tok) * 3 *
                 cfg.hidden_size * cfg.moe_intermediate_size * jnp.dtype(dtype).itemsize)
  if getattr(cfg, "hidden_size_per_layer_input", 0):
    inactive += ((cfg.vocab_size_per_layer_input - 1) * cfg.num_layers *
                 cfg.hidden_size_per_layer_input * jnp.dtype(dtype).itemsize)
  out["active_param_bytes"] = out["param_bytes"] - inactive
  return out


def measure_torch(path: str, batch: int, prompt: int, new: int, decode_batches, repeats,
                  dtype: str = "float32", torch_device: str = "cpu"):
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count())
  device = torch.device(torch_device)
  on_cpu = device.type == "cpu"
  sync = (lambda: None) if on_cpu else (lambda: torch.cuda.synchronize(device))
  out = {"device": f"torch {device.type}"
                   + ("" if on_cpu else f" ({torch.cuda.get_device_name(device)})"),
         "runtime_rss_mb": memory.rss_mb()}
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=getattr(torch, dtype)).to(device).eval()
  out["loaded_rss_mb"] = memory.rss_mb()
  rng = np.random.RandomState(0)
  vocab = model.config.vocab_size
  ids = torch.tensor(rng.randint(0, vocab, (batch, prompt)), device=device)
  with torch.no_grad():
    # The same work as harnax's prefill: fill the KV cache, project only the last position.
    run_prefill = lambda: model(ids, use_cache=True, logits_to_keep=1)
    run_prefill()
    sync()
    out["prefill_tok_s"] = batch * prompt / _timeit(run_prefill, repeats, sync)
    class StepClock(transformers.StoppingCriteria):
      """Called once per generated token: the times between the first and the last call
      span exactly the decode steps, without the prompt pass."""

      def __init__(self):
        self.times = []

      def __call__(self, input_ids, scores, **kwargs):
        sync()
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    for b in decode_batches:
      dids = torch.tensor(rng.randint(0, vocab, (b, prompt)), device=device)
      kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

      def run_decode():
        clock = StepClock()
        model.generate(dids, max_new_tokens=new + 1, min_new_tokens=new + 1,
                       stopping_criteria=transformers.StoppingCriteriaList([clock]), **kw)
        return clock.times[-1] - clock.times[0]  # `new` decode steps

      run_decode()  # warm-up
      seconds = min(run_decode() for _ in range(repeats))
      out[f"decode_b{b}_tok_s"] = b * new / seconds
  out["peak_mb"] = (memory.peak_rss_mb() if on_cpu
                    else torch.cuda.max_memory_allocated(device) / 1024**2)
  return out


def measure_scaling(path: str, lengths, new: int, repeats: int) -> dict:
  """harnax prefill time (batch 1) and decode time per token against the context length, for
  the checkpoint's own layer types and for the same weights with every layer linear (Gated
  DeltaNet): the linear layers' decode state has a fixed size, so only attention layers make
  decode slower as the context grows.

  A decode step of the 100M model takes about 20 ms and varies by a few ms from run to run, as
  much as the effect looked for; so the decode times come from ``max(repeats, 5)`` rounds that
  each time every length once (interleaved, so a slow stretch of the machine hits all lengths
  alike), and the report gives their median and range."""
  from flax import nnx
  import jax
  import jax.numpy as jnp

  from harnax import models
  from harnax.models import decoding as gen

  model = models.load_pretrained(path)
  cfg = model.config
  linear = models.CausalLM(cfg.replace(layer_types=("linear_attention",) * cfg.num_layers))
  rng = np.random.RandomState(0)
  out = {}
  for name, m in (("hybrid", model), ("linear", linear)):
    graphdef, state = nnx.split(m)
    runs = {}
    for length in lengths:
      ids = jnp.asarray(rng.randint(0, cfg.vocab_size, (1, length)), jnp.int32)

      def run_prefill(ids=ids, length=length):
        logits, cache = gen.prefill(graphdef, state, ids, jnp.ones_like(ids),
                                    m.init_cache(1, length + new))
        jax.block_until_ready((logits, cache))
        return logits, cache

      def run_decode(run_prefill=run_prefill):
        logits, cache = run_prefill()
        t0 = time.perf_counter()
        res, _ = gen.decode(jax.random.key(0), graphdef, state, cache, logits,
                            max_new_tokens=new)
        res.tokens.block_until_ready()
        return (time.perf_counter() - t0) / new

      run_prefill()  # compile
      if name == "hybrid":
        out[f"prefill_s_{length}"] = _timeit(run_prefill, repeats)
      run_decode()  # compile
      runs[length] = run_decode
    times = {length: [] for length in lengths}
    for _ in range(max(repeats, 5)):
      for length in lengths:
        times[length].append(runs[length]())
    for length, ts in times.items():
      out[f"{name}_decode_s_{length}"] = float(np.median(ts))
      out[f"{name}_decode_range_s_{length}"] = (float(np.min(ts)), float(np.max(ts)))
  return out


def scaling_report(res: dict, lengths) -> list[str]:
  """Markdown lines: prefill time and its fitted power of the length, decode ms per token."""
  prefill = np.array([res[f"prefill_s_{n}"] for n in lengths])
  slope = np.polyfit(np.log(lengths), np.log(prefill), 1)[0]
  lines = ["", "Qwen3.5 (`qwen3_5` model, harnax, batch 1): prefill time against the prompt "
           f"length, fitted `time ~ length^p`: **p = {slope:.2f}** (linear: 1). Decode time per "
           "token with the context filled to that length, for the model's hybrid stack (1 layer "
           "in 4 full attention) and for the same weights with every layer Gated DeltaNet: the "
           "median of interleaved rounds, with the fastest and slowest round in brackets:", "",
           "| context | prefill s | prefill tok/s | decode ms/token, hybrid | decode ms/token, "
           "all linear |", "|---|---|---|---|---|"]

  def ms(kind, n):
    lo, hi = res.get(f"{kind}_decode_range_s_{n}", (math.nan, math.nan))
    return f"{1e3 * res[f'{kind}_decode_s_{n}']:.1f} [{1e3 * lo:.1f}, {1e3 * hi:.1f}]"
  for n, t in zip(lengths, prefill):
    lines.append(f"| {n} | {t:.3f} | {n / t:.0f} | {ms('hybrid', n)} | {ms('linear', n)} |")
  return lines


def memory_bandwidth_gbs(nbytes: int = 512 * 1024**2, repeats: int = 5) -> float:
  """Copy bandwidth (read + write bytes per second) of a large numpy array, in GB/s."""
  src = np.ones(nbytes // 8, np.float64)
  dst = np.empty_like(src)
  seconds = _timeit(lambda: np.copyto(dst, src), repeats)
  return 2 * nbytes / seconds / 1e9


def _child(args):
  if args.child == "scaling":
    res = measure_scaling(args.path, args.lengths, args.new, args.repeats)
    print("RESULT " + json.dumps(res))
    return
  fn = measure_harnax if args.child == "harnax" else measure_torch
  res = fn(args.path, args.batch, args.prompt, args.new, args.decode_batches, args.repeats,
           dtype=args.dtype, torch_device=args.torch_device)
  print("RESULT " + json.dumps(res))


def _run_child(framework, path, args) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, "--path", path,
         "--batch", str(args.batch), "--prompt", str(args.prompt), "--new", str(args.new),
         "--repeats", str(args.repeats), "--dtype", args.dtype,
         "--torch-device", args.torch_device, "--decode-batches",
         *[str(b) for b in args.decode_batches], "--lengths", *[str(n) for n in args.lengths]]
  return run_child_command(cmd, framework)


def run_child_command(cmd, what: str) -> dict:
  """Runs a measuring child (repository on its path) and returns its ``RESULT {json}`` line."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"{what} run failed:\n{proc.stderr[-3000:]}")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", choices=list(PRESETS), default="100m",
                 help="100m: ~100M-parameter models of each family (the CPU comparison); "
                      "0.6b-2b: published Qwen3 0.6B/1.7B and Gemma 3 1B shapes (for a GPU)")
  p.add_argument("--out", help="results file (default benchmarks/results/lm_throughput.md, "
                               "or lm_throughput_<preset>.md for other presets)")
  p.add_argument("--families", nargs="+", help="models of the preset to run (default: all)")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
  p.add_argument("--checkpoint-dtype", choices=["float32", "bfloat16"],
                 help="dtype the random checkpoint is stored in (default: --dtype); bfloat16 "
                      "lets a model whose float32 weights fit memory once, not twice, be built")
  p.add_argument("--torch-device", default="auto",
                 help="cpu, cuda or cuda:N (default: cuda when torch sees one, else cpu)")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--prompt", type=int, default=128)
  p.add_argument("--new", type=int, default=32)
  p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--quick", action="store_true",
                 help="tiny sizes and model widths (QUICK_WIDTHS), for a smoke run")
  p.add_argument("--scaling", action="store_true",
                 help="also time Qwen3.5 prefill and decode against the context length")
  p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096],
                 help="context lengths of --scaling")
  p.add_argument("--child", choices=["harnax", "torch", "scaling"], help=argparse.SUPPRESS)
  p.add_argument("--path", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    return _child(args)
  configs = PRESETS[args.preset]
  families = args.families or list(configs)
  unknown = [f for f in families if f not in configs]
  if unknown:
    p.error(f"--families: {unknown} not in preset {args.preset!r} (has {sorted(configs)})")
  if args.torch_device == "auto":
    import torch
    args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  out_path = args.out or os.path.join(
      ROOT, "benchmarks", "results",
      "lm_throughput.md" if args.preset == "100m" else f"lm_throughput_{args.preset}.md")
  if args.quick:
    args.batch, args.prompt, args.new, args.repeats = 1, 16, 2, 1
    args.decode_batches = [1]
    args.lengths = [32, 64, 128, 256]

  # Sampled before and after every measurement: the run itself keeps up to os.cpu_count()
  # threads busy, so a higher value means other processes shared the CPUs.
  loads = [os.getloadavg()[0]]
  host_bandwidth = memory_bandwidth_gbs()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for family in families:
      path = os.path.join(tmp, family)
      n_params = build_checkpoint(family, path, args.preset,
                                  args.checkpoint_dtype or args.dtype, quick=args.quick)
      ours = _run_child("harnax", path, args)
      loads.append(os.getloadavg()[0])
      ref = _run_child("torch", path, args)
      loads.append(os.getloadavg()[0])
      rows.append((family, n_params, ours, ref))
      print(family, n_params, ours, ref, flush=True)
    scaling = None
    if args.scaling:
      path = os.path.join(tmp, "qwen3_5_scaling")
      build_checkpoint("qwen3_5", path, "100m", quick=args.quick)
      scaling = _run_child("scaling", path, args)
      print("scaling", scaling, flush=True)

  devices = sorted({r[2]["device"] for r in rows} | {r[3]["device"] for r in rows})
  on_cpu = all(r[2]["device"].startswith("jax cpu") and r[3]["device"] == "torch cpu"
               for r in rows)
  bandwidth = rows[0][2].get("bandwidth_gbs", host_bandwidth) if rows else host_bandwidth
  memory = "peak RSS" if on_cpu else "peak memory"
  lines = [
      f"# LM throughput: harnax (JAX jit) vs transformers (torch), preset {args.preset}",
      "",
      *(["**A `--quick` run: the preset's layouts at tiny widths, tiny sizes; the numbers are a "
         "smoke test.**", ""] if args.quick else []),
      "Generated by `benchmarks/lm_throughput.py` on "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
      f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}; "
      f"devices: {', '.join(devices)}; {args.dtype} weights and activations in both "
      f"frameworks; random weights (same for both"
      + (f", stored in {args.checkpoint_dtype})." if args.checkpoint_dtype not in (None, args.dtype)
         else ")."),
      f"Prefill: batch {args.batch} x {args.prompt} tokens, KV cache filled, last-position "
      f"logits only (both frameworks). Decode: {args.new} new tokens after a "
      f"{args.prompt}-token prompt (greedy), batch sizes {args.decode_batches}. Best of "
      f"{args.repeats} runs; "
      + ("peak RSS is the whole measuring process (framework included)." if on_cpu else
         "peak memory is each framework's peak device allocation (RSS where it ran on CPU)."),
      (f"Memory bandwidth (numpy copy, read+write): **{bandwidth:.1f} GB/s**." if on_cpu else
       f"Device memory bandwidth (jax elementwise pass, read+write): **{bandwidth:.1f} GB/s**."),
      "1-minute load average at the start and after each (framework, model) run: "
      + ", ".join(f"{x:.1f}" for x in loads)
      + (" (above the core count: other processes shared the CPUs and the absolute numbers, "
         "torch's OpenMP decode especially, are pessimistic)."
         if max(loads) > (os.cpu_count() or 1) else "."),
      "",
      "| model | params | metric | harnax | transformers | harnax / transformers |",
      "|---|---|---|---|---|---|",
  ]
  for family, n_params, ours, ref in rows:
    metrics = ["prefill_tok_s"] + [f"decode_b{b}_tok_s" for b in args.decode_batches]
    for m in metrics:
      lines.append(f"| {family} | {n_params / 1e6:.0f}M | {m.replace('_tok_s', '')} tok/s | "
                   f"{ours[m]:.1f} | {ref[m]:.1f} | {ours[m] / ref[m]:.2f} |")
    lines.append(f"| {family} | | {memory} MB | {ours['peak_mb']:.0f} | "
                 f"{ref['peak_mb']:.0f} | {ours['peak_mb'] / ref['peak_mb']:.2f} |")
  if on_cpu:
    lines += ["", "Where the peak memory goes (resident MB): after importing and starting the "
              "framework, after loading the weights, and the peak over the whole run (the rest: "
              "compiled programs, compilation, caches and activations).", "",
              "| model | framework | runtime | + weights | peak | peak - loaded |",
              "|---|---|---|---|---|---|"]
    for family, _, ours, ref in rows:
      for name, r in (("harnax", ours), ("transformers", ref)):
        lines.append(f"| {family} | {name} | {r['runtime_rss_mb']:.0f} | "
                     f"{r['loaded_rss_mb']:.0f} | {r['peak_mb']:.0f} | "
                     f"{r['peak_mb'] - r['loaded_rss_mb']:.0f} |")
  lines += ["", "Batch-1 decode against the memory-bandwidth bound (bound = bandwidth / bytes of "
            "the parameters one token reads: all of them, except the unrouted experts of an "
            "MoE and the per-layer input rows of other tokens):", "",
            "| model | bytes read / token (MB) | bound tok/s | harnax tok/s | fraction of bound "
            "| transformers fraction |",
            "|---|---|---|---|---|---|"]
  for family, _, ours, ref in rows:
    if "decode_b1_tok_s" not in ours:
      continue
    bound = bandwidth * 1e9 / ours["active_param_bytes"]
    lines.append(f"| {family} | {ours['active_param_bytes'] / 1e6:.0f} | {bound:.1f} | "
                 f"{ours['decode_b1_tok_s']:.1f} | {ours['decode_b1_tok_s'] / bound:.2f} | "
                 f"{ref['decode_b1_tok_s'] / bound:.2f} |")
  if scaling is not None:
    lines += scaling_report(scaling, args.lengths)
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  with open(out_path, "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
