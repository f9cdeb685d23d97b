"""Harness tests compare against float64 NumPy references: run them with x64 on.

Module scope, so module fixtures (trained example models) are built in float64 too.
"""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _x64():
  with jax.enable_x64(True):
    yield


TAU = 0.1
STEPS = 300
LEARNING_RATE = 10.0


@pytest.fixture(scope="session")
def checkbox_models():
  """The checkbox family, a model trained on each harness, and every adaptation.

  Returns a dict: `harnesses` {name: harness}, `features` {name: [S, O, D]},
  `theta` {name: weights trained there}, `adapted` {(i, j): theta_i adapted to j}.
  Built once per test worker, in float64 (it outlives the module x64 fixture).
  """
  from harnax import harness as hh
  with jax.enable_x64(True):
    harnesses = hh.checkbox_harnesses()
    features = {k: hh.checkbox_features(h) for k, h in harnesses.items()}
    theta = {k: hh.fit_log_linear(h, features[k], tau=TAU, steps=STEPS,
                                  learning_rate=LEARNING_RATE) for k, h in harnesses.items()}
    adapted = {(i, j): hh.fit_log_linear(harnesses[j], features[j], tau=TAU, theta=theta[i],
                                         steps=STEPS, learning_rate=LEARNING_RATE)
               for i in harnesses for j in harnesses if i != j}
  return dict(harnesses=harnesses, features=features, theta=theta, adapted=adapted, tau=TAU)
