"""Harness tests compare against float64 NumPy references: run them with x64 on.

Module scope, so module fixtures (trained example models) are built in float64 too.
"""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _x64():
  with jax.enable_x64(True):
    yield
