"""Estimator tests compare against float64 exact values: run them with x64 on."""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _x64():
  with jax.enable_x64(True):
    yield
