"""benchmarks/lm_throughput.py end to end on a tiny run: its tables are consistent, and bad
arguments are refused with the valid choices."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "lm_throughput.py")


def _module():
  sys.path.insert(0, os.path.dirname(SCRIPT))
  try:
    import lm_throughput
  finally:
    sys.path.pop(0)
  return lm_throughput


def _qwen3_moe_params(c):
  """Qwen3-MoE's parameter count from its config (tied embeddings, every layer an MoE of
  bias-free projections) and the part of it a batch-1 decode step does not read (the unrouted
  experts)."""
  h, q, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
  hd, e, k = c["head_dim"], c["num_experts"], c["num_experts_per_tok"]
  mi = c["moe_intermediate_size"]
  attention = 2 * h * q * hd + 2 * h * kv * hd + 2 * hd  # q, o; k, v; q and k norms
  layer = attention + 2 * h + h * e + e * 3 * h * mi    # two norms, router, experts
  total = c["vocab_size"] * h + c["num_hidden_layers"] * layer + h
  return total, c["num_hidden_layers"] * (e - k) * 3 * h * mi


def _run(*args, **kw):
  # Smoke runs: XLA's cheapest optimisation level cuts the harnax child's compile time.
  flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=flags)
  return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env,
                        timeout=600, **kw)


@pytest.mark.slow
def test_lm_throughput_quick_moe_run_writes_consistent_tables(tmp_path):
  out = tmp_path / "lm.md"
  # The checkpoint stored in bfloat16 (as for Gemma-4-E2B on a small machine), measured in
  # float32 by both frameworks.
  proc = _run("--quick", "--families", "qwen3_moe", "--torch-device", "cpu", "--out", str(out),
              "--checkpoint-dtype", "bfloat16")
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  assert "float32 weights and activations in both frameworks" in text
  assert "same for both, stored in bfloat16" in text
  # --quick builds the tiny-width model of its config: the parameter count of that config.
  _, config = _module().model_config("qwen3_moe", "100m", quick=True)
  n_params, unrouted = _qwen3_moe_params(config)
  assert n_params < 10**7  # a tiny model, not the preset's ~100M
  rows = re.findall(rf"^\| qwen3_moe \| {n_params / 1e6:.0f}M \| (\w+) tok/s \| ([\d.]+) \| "
                    r"([\d.]+) \| ([\d.]+) \|$", text, re.M)
  assert [r[0] for r in rows] == ["prefill", "decode_b1"]
  for _, ours, ref, ratio in rows:
    ours, ref, ratio = float(ours), float(ref), float(ratio)
    assert ours > 0 and ref > 0
    # Rates are printed to 0.1 and the ratio (of the unrounded rates) to 0.01.
    lo, hi = (ours - 0.05) / (ref + 0.05), (ours + 0.05) / (ref - 0.05)
    assert lo - 0.005 <= ratio <= hi + 0.005
  # Memory breakdown: runtime < loaded <= peak for both frameworks.
  row = r"^\| qwen3_moe \| (harnax|transformers) \| (\d+) \| (\d+) \| (\d+) \| (-?\d+) \|$"
  mem = re.findall(row, text, re.M)
  assert [m[0] for m in mem] == ["harnax", "transformers"]
  for _, runtime, loaded, peak, extra in mem:
    assert int(runtime) < int(loaded) <= int(peak)
    assert abs(int(extra) - (int(peak) - int(loaded))) <= 1  # each printed rounded
  # The bound row: the MoE reads its routed experts only (4 of 16 per layer): fewer MB than
  # all parameters (float32), exactly the parameters less the unrouted experts.
  bound = re.search(r"^\| qwen3_moe \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
  assert bound is not None and int(bound.group(1)) < n_params * 4 / 1e6
  assert abs(int(bound.group(1)) - (n_params - unrouted) * 4 / 1e6) <= 0.5


def test_lm_throughput_refuses_an_unknown_family_naming_the_choices():
  proc = _run("--preset", "0.6b-2b", "--families", "qwen3_moe")
  assert proc.returncode == 2
  assert "--families: ['qwen3_moe'] not in preset '0.6b-2b'" in proc.stderr
  assert "qwen3-0.6b" in proc.stderr


def test_scaling_report_fits_the_exponent_and_prints_the_decode_spread():
  lm_throughput = _module()
  lengths = [512, 1024, 2048, 4096]
  res = {}
  for n in lengths:
    res[f"prefill_s_{n}"] = 3e-4 * n ** 1.5  # a made-up power law (3.476 s at 512): p = 1.5
    for kind in ("hybrid", "linear"):
      res[f"{kind}_decode_s_{n}"] = 0.020
      res[f"{kind}_decode_range_s_{n}"] = (0.0185, 0.0251)
  text = "\n".join(lm_throughput.scaling_report(res, lengths))
  assert "**p = 1.50**" in text
  rows = [line for line in text.splitlines() if re.match(r"^\| \d+ \|", line)]
  assert len(rows) == 4
  assert rows[0].startswith("| 512 | 3.476 | 147 | 20.0 [18.5, 25.1] | 20.0 [18.5, 25.1] |")
