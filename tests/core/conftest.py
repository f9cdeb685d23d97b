"""Core tests compare against float64 references: run them with x64 on."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield
