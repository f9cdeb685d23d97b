"""Core tests compare against float64 references: run them with x64 on.

Module scope, so module fixtures are built in float64 too; float32 checks open
`jax.enable_x64(False)` themselves.
"""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _x64():
  with jax.enable_x64(True):
    yield
