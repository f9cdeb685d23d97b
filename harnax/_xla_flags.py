"""An XLA:CPU flag harnax sets before JAX starts its CPU backend.

On jaxlib 0.10 the CPU runtime intermittently deadlocks (every thread idle,
the result never ready) on single executables that run a `while_loop` solver
beside independent batched LU solves, e.g. one `jit` of `ceiling`, `mismatch`
and `evaluate_policy` over a vmapped batch. Turning off XLA:CPU's
concurrency-optimized scheduler removed it in our measurements (a reproducer
hung in 5 of 5 runs without the flag and in 0 of 12 with it; README, "Known
issues"). The flag only changes the order XLA schedules independent
instructions; results are identical.

It is added to `XLA_FLAGS` at `import harnax` unless the variable already
mentions it (set it to `true` yourself to opt out). It has no effect if the
CPU backend was started before harnax was imported.
"""

import os

_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"


def apply_cpu_workarounds() -> None:
  flags = os.environ.get("XLA_FLAGS", "")
  if _FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}=false".strip()
