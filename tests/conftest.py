"""Shared test configuration."""

import os

# Tests run on the host CPU; keep XLA from grabbing every core per test worker.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
