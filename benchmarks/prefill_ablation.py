"""Where a prefill gap comes from: harnax / transformers prefill, one component changed at a time.

`benchmarks/lm_throughput.py` measures Qwen3.5 and Gemma 4 prefill at 0.69-0.88 of
transformers on CPU. This script rebuilds the same ~100M-parameter models with one component
changed (every layer of one kind, no per-layer inputs, no KV sharing, ...) and measures the
prefill of each variant in both frameworks, each in its own subprocess, with the measuring code
of `lm_throughput.py` (batch 4 x 128 tokens, KV cache filled, last-position logits only). A
component whose removal moves the ratio towards 1 is where the gap is; the absolute times per
variant say how much of each framework's time the component takes.

Usage::

  python benchmarks/prefill_ablation.py [--out benchmarks/results/prefill_ablation.md]
  python benchmarks/prefill_ablation.py --quick --out /tmp/ablation.md   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import lm_throughput as lt  # benchmarks/lm_throughput.py (this folder is on sys.path)

ROOT = lt.ROOT
_Q = lt.CONFIGS["qwen3_5"][1]
_G = lt.CONFIGS["gemma4"][1]

# (family, variant, what changed, config overrides). The first row of a family is its model
# as benchmarked in lm_throughput.py. No all-Gated-DeltaNet Qwen3.5 row: transformers' cache
# cannot hold only linear-attention layers (`get_seq_length` raises).
VARIANTS = [
    ("qwen3_5", "as benchmarked", "3 Gated DeltaNet layers to 1 gated full-attention layer",
     {}),
    ("qwen3_5", "all full attention", "every layer gated full attention",
     dict(layer_types=["full_attention"] * _Q["num_hidden_layers"])),
    ("qwen3_5_moe", "as benchmarked", "MoE MLPs (16 experts, top 4, shared expert)", {}),
    ("gemma4", "as benchmarked",
     "sliding/full layers, per-layer inputs, 4 KV-shared layers, double-wide MLP", {}),
    ("gemma4", "no KV sharing", "num_kv_shared_layers = 0 (every layer its own K/V)",
     dict(num_kv_shared_layers=0)),
    # Alone, transformers cannot prefill it (per-layer inputs of None are sliced with
    # logits_to_keep while KV sharing is on); compare with the row above.
    ("gemma4", "no KV sharing, no per-layer inputs", "the above, hidden_size_per_layer_input = 0",
     dict(num_kv_shared_layers=0, hidden_size_per_layer_input=0)),
    # transformers makes the last layer full attention whatever the config says.
    ("gemma4", "no KV sharing, one full layer", "no KV sharing, and every layer but the last "
     "sliding (head_dim 256; full layers have 512)",
     dict(num_kv_shared_layers=0,
          layer_types=["sliding_attention"] * (_G["num_hidden_layers"] - 1) + ["full_attention"])),
    ("gemma4", "no logit soft-cap", "final_logit_softcapping = None",
     dict(final_logit_softcapping=None)),
]

# --quick: the same variants on models small enough for a smoke run.
_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=2, num_key_value_heads=1)
_TINY_ROPE = dict(lt._QWEN35_ROPE, mrope_section=[2, 1, 1])  # 32 * 0.25 / 2 = 4 rotary pairs
_TINY_FAMILY = {
    "qwen3_5": dict(_TINY, head_dim=32, rope_parameters=_TINY_ROPE, linear_num_key_heads=2,
                    linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16),
    "qwen3_5_moe": dict(_TINY, head_dim=32, rope_parameters=_TINY_ROPE, linear_num_key_heads=2,
                        linear_num_value_heads=2, linear_key_head_dim=16,
                        linear_value_head_dim=16,
                        moe_intermediate_size=32, shared_expert_intermediate_size=32,
                        num_experts=4, num_experts_per_tok=2),
    "gemma4": dict(_TINY, head_dim=32, global_head_dim=64, sliding_window=8,
                   num_kv_shared_layers=2, hidden_size_per_layer_input=16,
                   vocab_size_per_layer_input=512),
}


def variant_config(family: str, overrides: dict, quick: bool):
  import transformers
  cls_name, kwargs = lt.CONFIGS[family]
  kwargs = dict(kwargs)
  if quick:
    kwargs.update(_TINY_FAMILY[family])
    layers = kwargs["num_hidden_layers"]
    if family.startswith("qwen3_5"):
      kwargs.pop("layer_types", None)
    else:
      # Both kinds among the layers that produce K/V and among those that share them.
      kwargs["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    overrides = {k: (v[:1] * (layers - 1) + v[-1:] if k == "layer_types" else v)
                 for k, v in overrides.items()}
  kwargs.update(overrides)
  return getattr(transformers, cls_name)(**kwargs)


def build(family: str, overrides: dict, path: str, quick: bool) -> int:
  import torch
  import transformers
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(variant_config(family, overrides, quick))
  model.save_pretrained(path)
  return sum(p.numel() for p in model.parameters())


def _child(args):
  fn = lt.measure_harnax if args.child == "harnax" else lt.measure_torch
  res = fn(args.path, args.batch, args.prompt, 0, (), args.repeats)
  print("RESULT " + json.dumps(res))


def _run_child(framework: str, path: str, args) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, "--path", path,
         "--batch", str(args.batch), "--prompt", str(args.prompt), "--repeats", str(args.repeats)]
  return lt.run_child_command(cmd, framework)


def report(rows, args, loads) -> str:
  lines = [
      "# Prefill ablation: harnax / transformers with one component changed",
      "",
      "Generated by `benchmarks/prefill_ablation.py"
      + (" --quick" if args.quick else "") + "` on "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
      f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores; float32; random weights "
      f"(the same in both frameworks). Prefill: batch {args.batch} x {args.prompt} tokens, KV "
      f"cache filled, last-position logits only; best of {args.repeats} runs; each "
      "(framework, variant) in its own process.",
      "1-minute load average at the start and after each variant: "
      + ", ".join(f"{x:.1f}" for x in loads) + ".",
      "",
      "| model | variant | what changed | params | harnax ms | transformers ms | "
      "harnax / transformers (throughput) |",
      "|---|---|---|---|---|---|---|",
  ]
  tokens = args.batch * args.prompt
  for family, name, what, n_params, ours, ref in rows:
    ms_ours = 1e3 * tokens / ours["prefill_tok_s"]
    ms_ref = 1e3 * tokens / ref["prefill_tok_s"]
    lines.append(f"| {family} | {name} | {what} | {n_params / 1e6:.1f}M | {ms_ours:.1f} | "
                 f"{ms_ref:.1f} | {ms_ref / ms_ours:.2f} |")
  return "\n".join(lines) + "\n"


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                               "prefill_ablation.md"))
  p.add_argument("--families", nargs="+", help="families to run (default: all)")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--prompt", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--quick", action="store_true", help="tiny models, one run each")
  p.add_argument("--child", choices=["harnax", "torch"], help=argparse.SUPPRESS)
  p.add_argument("--path", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    return _child(args)
  known = sorted({v[0] for v in VARIANTS})
  if args.families and set(args.families) - set(known):
    p.error(f"--families: expected some of {known}, got {args.families}")
  if args.quick:
    args.batch, args.prompt, args.repeats = 1, 16, 1
  loads, rows = [os.getloadavg()[0]], []
  with tempfile.TemporaryDirectory() as tmp:
    for i, (family, name, what, overrides) in enumerate(VARIANTS):
      if args.families and family not in args.families:
        continue
      path = os.path.join(tmp, str(i))
      n_params = build(family, overrides, path, args.quick)
      ours = _run_child("harnax", path, args)
      ref = _run_child("torch", path, args)
      loads.append(os.getloadavg()[0])
      rows.append((family, name, what, n_params, ours, ref))
      print(f"[{family}: {name}] harnax {ours['prefill_tok_s']:.0f} tok/s, transformers "
            f"{ref['prefill_tok_s']:.0f} tok/s", file=sys.stderr, flush=True)
  text = report(rows, args, loads)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    f.write(text)
  print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
  main()
