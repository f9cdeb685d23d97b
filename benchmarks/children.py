"""What the benchmarks share: model sizes, each measurement in a fresh subprocess, verdicts.

A benchmark script runs every configuration as `python <script> --child KIND ...` so that jax
and torch start clean, with the thread count the configuration asks for. The child prints one
line `RESULT <json>`; the parent reads it back (`run_child`) and notes the load average.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Model sizes (Qwen3 layout, tied embeddings, float32); the vocabulary is the tokenizer's.
SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=512),
    "quick": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64),
}


def bind(threads: int) -> None:
  """Binds this process to `threads` cores before jax or torch start their thread pools."""
  cpus = sorted(os.sched_getaffinity(0))
  if 0 < threads < len(cpus):
    os.sched_setaffinity(0, cpus[:threads])


def report(result: dict) -> None:
  """The child's answer: one `RESULT` line on stdout."""
  print("RESULT " + json.dumps(result))


def run_child(script: str, args: list[str], loads: list, *, what: str) -> dict:
  """Runs `script --child ...` (`args`) in a fresh interpreter and returns its result.

  Appends the 1-minute load average after the run to `loads`. `what` names the run in the
  error raised when the child prints no result (with the end of its standard error).
  """
  cmd = [sys.executable, os.path.abspath(script), *args]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
  loads.append(os.getloadavg()[0])
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"{what} failed:\n{proc.stderr[-4000:]}")


def met(ratio: float, goal: float, *, digits: int = 2, at_most: bool = False) -> str:
  """A target's verdict on `ratio` as its table cell prints it, rounded to `digits` decimals.

  Deciding on the unrounded value would print "1.00x" beside "**no**" for a ratio of 0.997.
  `at_most`: the goal is an upper bound (ratio <= goal) rather than a lower one.
  """
  shown = round(ratio, digits)
  return "yes" if (shown <= goal if at_most else shown >= goal) else "**no**"


def ms(seconds: float) -> str:
  """A duration for a table cell: milliseconds below 10 s, else seconds."""
  return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"
