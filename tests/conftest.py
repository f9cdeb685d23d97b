"""Shared test configuration: CPU threads, float64 references, deterministic Hypothesis."""

import os
import pathlib

import hypothesis
import jax
import pytest

# A test worker that crashes (an intermittent XLA:CPU abort while compiling) is replaced
# without hanging the run, and the test it died in runs once more (tests/xdist_crash_retry.py).
from xdist_crash_retry import pytest_handlecrashitem  # noqa: F401
from xdist_crash_retry import pytest_report_teststatus  # noqa: F401
from xdist_crash_retry import pytest_xdist_make_scheduler  # noqa: F401

# Tests run on the host CPU; keep XLA from grabbing every core per test worker. Most of the
# suite's time is compiling tiny programs: LLVM's cheapest optimization level compiles them
# about twice as fast (tests/policies, estimate and train: 240 s -> 136 s on 2 workers) and
# changes no result (XLA:CPU does not enable fast math at any level).
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "--xla_backend_optimization_level=0")
# For the same reason, tests call models and multi-step references under `jax.jit` /
# `nnx.jit` unless they test eager behaviour: op by op, every new (op, shape) is its own XLA
# compile (~40 ms here), and a tiny model's forward pass is hundreds of them (test_lm's
# three scorers: 26 s eager, 5 s jitted). A child process that needs more host devices
# appends to XLA_FLAGS rather than replacing it.

# Property tests draw the same examples on every run and on every machine: a failure
# found once is found again, and CI never turns red on a new random draw.
hypothesis.settings.register_profile("harnax", derandomize=True, deadline=None,
                                     print_blob=True)
hypothesis.settings.load_profile("harnax")

# Test folders whose modules compare against float64 references: x64 is on for every
# module in them (module scope, so module fixtures are built in float64 too). A module
# elsewhere opts in with `pytestmark = pytest.mark.x64`; a float32 check inside an x64
# module opens `jax.enable_x64(False)` itself.
X64_FOLDERS = ("core", "estimate", "harness")


def _wants_x64(module_path: pathlib.Path, marked: bool) -> bool:
  here = pathlib.Path(__file__).parent
  try:
    folder = module_path.relative_to(here).parts[0]
  except ValueError:
    return marked
  return marked or folder in X64_FOLDERS


@pytest.fixture(autouse=True, scope="module")
def x64(request):
  """float64 on for the whole module (see `X64_FOLDERS`)."""
  marked = request.node.get_closest_marker("x64") is not None
  if _wants_x64(pathlib.Path(str(request.node.path)), marked):
    with jax.enable_x64(True):
      yield
  else:
    yield


CHECKBOX_TAU = 0.1
CHECKBOX_STEPS = 300


@pytest.fixture(scope="session")
def checkbox_models():
  """The checkbox family, a model trained on each harness, and every adaptation.

  Returns a dict: `harnesses` {name: harness}, `features` {name: [S, O, D]},
  `theta` {name: weights trained there}, `adapted` {(i, j): theta_i adapted to j},
  `tau`. Built once per test worker, in float64 (it outlives any module's x64 scope).
  """
  from harnax import train
  from harnax.envs import checkbox
  with jax.enable_x64(True):
    harnesses = checkbox.checkbox_harnesses()
    features = {k: checkbox.checkbox_features(h) for k, h in harnesses.items()}
    fit = lambda h, f, theta=None: train.fit_log_linear(  # noqa: E731
        h, f, CHECKBOX_TAU, theta=theta, num_steps=CHECKBOX_STEPS).params
    theta = {k: fit(h, features[k]) for k, h in harnesses.items()}
    adapted = {(i, j): fit(harnesses[j], features[j], theta[i])
               for i in harnesses for j in harnesses if i != j}
  return dict(harnesses=harnesses, features=features, theta=theta, adapted=adapted,
              tau=CHECKBOX_TAU)
