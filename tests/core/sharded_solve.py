"""Run in a subprocess with 8 simulated CPU devices (see test_batching.py)."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import harnax as hx  # noqa: E402
from harnax.parallel.batch import batch_mesh  # noqa: E402
from harnax.parallel.batch import shard_batch  # noqa: E402


def main():
  jax.config.update("jax_enable_x64", True)
  assert jax.device_count() == 8, jax.devices()
  keys = jax.random.split(jax.random.key(0), 16)
  mdps = jax.vmap(lambda k: hx.random_dense_mdp(k, 12, 3, discount=0.95))(keys)
  taus = np.linspace(0.1, 2.0, 16)
  pi_ref = hx.uniform_reference(12, 3)
  solve = jax.jit(jax.vmap(lambda m, t: hx.solve_soft_bellman(m, pi_ref, t, tol=1e-10).v))
  expected = np.stack([np.asarray(hx.solve_soft_bellman(jax.tree.map(lambda x: x[i], mdps),
                                                        pi_ref, taus[i], tol=1e-10).v)
                       for i in range(16)])
  mesh = batch_mesh("data")
  s_mdps, s_taus = shard_batch((mdps, taus), mesh)
  out = solve(s_mdps, s_taus)
  assert len(out.sharding.device_set) == 8, out.sharding
  assert out.sharding.spec[0] == "data", out.sharding
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-9)
  # The exact gradient sharded too: d C / d rewards per problem.
  grad = jax.jit(jax.vmap(jax.grad(
      lambda m, t: hx.ceiling(m, pi_ref, t, tol=1e-10)), in_axes=(0, 0)))(s_mdps, s_taus)
  np.testing.assert_allclose(np.asarray(grad.rewards).sum((1, 2)), 1 / 0.05, rtol=1e-8)
  print("SHARDED_OK")


if __name__ == "__main__":
  main()
