"""Experiment pipelines that the scripts in `scripts/` call: the top layer of harnax.

* `miniwob` — the tabular MiniWoB++ study across harnesses H0–H5 (docs/harnesses.md).
* `harness_report` — C, M, J and the swap table on the checkbox family, beside the
  sample-based estimates (docs/estimation.md).
* `synthetic_logs` — deployment logs with known truth for the proxy-optimum estimators.
* `text_agents` — text-game teachers and students built locally, and their evaluation under
  the HAD settings (docs/text_agents.md); `text_metrics` — the HAD paper's metrics
  (docs/text_eval.md).

Depends on everything below it; nothing in harnax imports it.
"""
