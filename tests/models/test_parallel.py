"""Sharded forward and optax train step on 8 simulated CPU devices.

``--xla_force_host_platform_device_count=8`` must be set before jax is imported, so the check
runs in a subprocess (``sharded_check.py``) and the rest of the suite keeps one device.
"""

import os
import subprocess
import sys

import pytest

from harnax import parallel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_sharded_forward_and_train_step_match_unsharded(pair_factory):
  # Qwen3-MoE covers the Qwen3 attention stack; Gemma 3 the sandwich norms and windows.
  paths = [pair_factory(n).path for n in ("qwen3_moe", "gemma3")]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  # Appended: the suite's compile flags (tests/conftest.py) carry over to the child.
  env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  proc = subprocess.run([sys.executable, os.path.join(HERE, "sharded_check.py"), *paths],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  assert proc.stdout.count("OK ") == 2, proc.stdout


def test_logical_to_spec_rules():
  import jax
  mesh = jax.sharding.Mesh([[[jax.devices()[0]]]], parallel.MESH_AXES)
  spec = parallel.logical_to_spec(("embed", "mlp"), (4, 8), mesh)
  assert spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  # a mesh axis is used at most once per array
  spec = parallel.logical_to_spec(("mlp", "vocab"), (4, 8), mesh)
  assert spec == jax.sharding.PartitionSpec("tensor", None)
  with pytest.raises(ValueError, match="axes"):
    parallel.logical_to_spec(("embed",), (4, 8), mesh)
  with pytest.raises(ValueError, match="devices"):
    parallel.make_mesh({"data": 3})


def test_constrain_is_identity_without_rules():
  import jax.numpy as jnp
  x = jnp.ones((2, 3))
  assert parallel.constrain(x, ("batch", None)) is x
