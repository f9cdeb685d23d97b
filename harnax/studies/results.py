"""Writing a study's results: markdown, JSON metrics and the config, side by side."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import numpy as np

Log = Callable[[str], None]


def stderr_log(line: str) -> None:
  """A progress line on standard error (stdout stays the report)."""
  print(line, file=sys.stderr, flush=True)


def to_json(x: Any) -> Any:
  """Arrays and NumPy scalars as plain lists and numbers, recursively."""
  if isinstance(x, dict):
    return {str(k): to_json(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_json(v) for v in x]
  if isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__"):
    return np.asarray(x).tolist()
  return x


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
  """A markdown table from a header and rows of already formatted cells."""
  if any(len(r) != len(header) for r in rows):
    raise ValueError(f"rows: expected {len(header)} cells per row (the header's count)")
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def write_results(output_dir: str, *, report: dict[str, str], metrics: dict | None = None,
                  config=None) -> list[str]:
  """Writes `report` ({file name: text}), `metrics.json` and `config.json` to `output_dir`.

  Args:
    output_dir: created if missing.
    report: text files to write, e.g. `{"report.md": text}`.
    metrics: a JSON-serializable dict (arrays allowed: see `to_json`), or None.
    config: an `ml_collections.ConfigDict` saved beside the results, or None.

  Returns:
    The paths written.
  """
  os.makedirs(output_dir, exist_ok=True)
  written = []
  for name, text in report.items():
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    written.append(path)
  if metrics is not None:
    path = os.path.join(output_dir, "metrics.json")
    with open(path, "w", encoding="utf-8") as f:
      json.dump(to_json(metrics), f, indent=1)
    written.append(path)
  if config is not None:
    path = os.path.join(output_dir, "config.json")
    with open(path, "w", encoding="utf-8") as f:
      f.write(config.to_json_best_effort(indent=1))
    written.append(path)
  return written


def run_study(study, cfg, *, plot_file: str | None = None) -> list[str]:
  """A study module's whole script: run, render, write, plot, print.

  `study.run(cfg, log=stderr_log)` and `study.render(cfg, result)` (under float64: the exact
  tabular side), then `report.md`, `study.metrics(result)` as `metrics.json` and the config
  in `cfg.output_dir`, and `study.plot(result, path)` as `plot_file` when `cfg.plot` is set.
  The report goes to stdout, progress to stderr. Returns the paths written.
  """
  import jax  # noqa: PLC0415  (only the scripts need it here)
  with jax.enable_x64(True):
    result = study.run(cfg, log=stderr_log)
    text = study.render(cfg, result)
  paths = write_results(cfg.output_dir, report={"report.md": text},
                        metrics=study.metrics(result), config=cfg)
  if plot_file is not None and cfg.get("plot"):
    paths.append(os.path.join(cfg.output_dir, plot_file))
    study.plot(result, paths[-1])
  print(text)
  print("wrote " + ", ".join(paths))
  return paths


def run_script(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)` with absl logging at WARNING unless `--verbosity` is given.

  At INFO, JAX reports every accelerator backend it probes and cannot load (TPU, GPU
  plugins): noise before a CPU run's first line of output.
  """
  from absl import app  # noqa: PLC0415  (absl is the scripts' dependency, not the library's)
  from absl import flags  # noqa: PLC0415
  from absl import logging  # noqa: PLC0415

  def quiet_main(argv):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity("warning")
    return main(argv)

  app.run(quiet_main)
