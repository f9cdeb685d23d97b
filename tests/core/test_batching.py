"""jit, vmap (batches of MDPs, temperatures, policies), shared transitions, sharding."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import pytree


@pytest.fixture(scope="module")
def batch():
  keys = jax.random.split(jax.random.key(0), 6)
  return jax.vmap(lambda k: hx.random_dense_mdp(k, 10, 3, discount=0.9))(keys)


def _item(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def test_vmap_over_a_batch_of_mdps(batch):
  pi_ref = hx.uniform_reference(10, 3)
  taus = jnp.linspace(0.2, 1.5, 6)
  out = jax.jit(jax.vmap(lambda m, t: hx.solve_soft_bellman(m, pi_ref, t, tol=1e-11)))(batch, taus)
  assert out.v.shape == (6, 10) and out.iterations.shape == (6,)
  for i in range(6):
    single = hx.solve_soft_bellman(_item(batch, i), pi_ref, taus[i], tol=1e-11)
    np.testing.assert_allclose(out.v[i], single.v, atol=1e-10)
  # Under jit: one compile per function instead of one per op of the batched trace.
  pols = jax.jit(jax.vmap(lambda k: hx.random_policy(k, pi_ref)))(
      jax.random.split(jax.random.key(1), 6))
  j = jax.jit(jax.vmap(lambda m, p, t: hx.regularized_return(m, p, pi_ref, t)))(batch, pols, taus)
  c = jax.jit(jax.vmap(lambda m, t: hx.ceiling(m, pi_ref, t, tol=1e-12)))(batch, taus)
  m = jax.jit(jax.vmap(lambda mm, p, t: hx.mismatch(mm, p, pi_ref, t, tol=1e-12)))(
      batch, pols, taus)
  np.testing.assert_allclose(j, c - m, atol=1e-9)


def test_shared_transitions_batch(batch):
  """One P, a batch of rewards / references: P stays unbatched inside vmap."""
  base = _item(batch, 0)
  rewards = jax.random.uniform(jax.random.key(2), (5, 10, 3), dtype=base.rewards.dtype)
  refs = jax.vmap(lambda k: hx.random_reference(k, 10, 3, unavailable_fraction=0.3))(
      jax.random.split(jax.random.key(3), 5))
  shared = pytree.unvalidated(
      hx.TabularMDP,
      transitions=base.transitions, rewards=rewards,
      discount=jnp.broadcast_to(base.discount, (5,)),
      initial=jnp.broadcast_to(base.initial, (5, 10)))
  axes = hx.TabularMDP.axes(transitions=None)
  fn = jax.jit(jax.vmap(lambda m, r: hx.solve_soft_bellman(m, r, 0.5, tol=1e-11).v,
                        in_axes=(axes, 0)))
  out = fn(shared, refs)
  # The batched sweep is one matrix product with P: no batched copy of P appears.
  hlo = fn.lower(shared, refs).as_text()
  assert "5x10x3x10" not in hlo
  for i in range(5):
    single = hx.solve_soft_bellman(base.replace(rewards=rewards[i]), refs[i], 0.5, tol=1e-11)
    np.testing.assert_allclose(out[i], single.v, atol=1e-10)


@pytest.mark.parametrize("size", [45, 47])
def test_a_batch_larger_than_the_cache_equals_its_members(size):
  """Batches of S = 64, A = 8 float64 MDPs (256 KB of transitions each) are solved in
  cache-sized chunks on the CPU (docs/theory.md §4.8): every member, its certificate and its
  gradient equal the solve of that member alone, for a batch size with divisors (45) and a
  prime one (47, one member per chunk)."""
  keys = jax.random.split(jax.random.key(5), size)
  mdps = jax.vmap(lambda k: hx.random_dense_mdp(k, 64, 8, discount=0.99))(keys)
  refs = jax.vmap(lambda k: hx.random_reference(k, 64, 8, unavailable_fraction=0.2))(
      jax.random.split(jax.random.key(6), size))
  solve = lambda m, r: hx.solve_soft_bellman(m, r, 0.3, tol=1e-9)  # noqa: E731
  ceiling_grad = jax.grad(lambda m, r: hx.ceiling(m, r, 0.3, tol=1e-9))
  out = jax.jit(jax.vmap(solve))(mdps, refs)
  grad = jax.jit(jax.vmap(ceiling_grad))(mdps, refs)
  solve_one, grad_one = jax.jit(solve), jax.jit(ceiling_grad)
  for i in (0, 1, size // 2, size - 1):
    single = solve_one(_item(mdps, i), refs[i])
    np.testing.assert_allclose(out.v[i], single.v, atol=1e-12)
    assert int(out.iterations[i]) == int(single.iterations)
    # The bound is a span of nearly equal numbers: a batched and a single sweep round
    # differently in the last bits (1e-14 here), which moves a 1e-10 bound by ~1e-4.
    np.testing.assert_allclose(out.error_bound[i], single.error_bound, rtol=1e-3)
    assert bool(out.converged[i]) == bool(single.converged)
    g = grad_one(_item(mdps, i), refs[i])
    np.testing.assert_allclose(grad.rewards[i], g.rewards, atol=1e-12)
    np.testing.assert_allclose(grad.transitions[i], g.transitions, atol=1e-12)


def test_grad_under_vmap_and_jit(batch):
  pi_ref = hx.uniform_reference(10, 3)
  g = jax.jit(jax.vmap(jax.grad(lambda m: hx.ceiling(m, pi_ref, 0.7, tol=1e-12))))(batch)
  # dC/dr sums to 1 / (1 - gamma) for every MDP of the batch.
  np.testing.assert_allclose(g.rewards.sum((1, 2)), 10.0, rtol=1e-9)
  assert g.transitions.shape == batch.transitions.shape


def test_sparse_batch_under_vmap():
  keys = jax.random.split(jax.random.key(4), 4)
  mdps = jax.vmap(lambda k: hx.random_sparse_mdp(k, 30, 3, 2, discount=0.9))(keys)
  pi_ref = hx.uniform_reference(30, 3)
  v = jax.jit(jax.vmap(lambda m: hx.solve_soft_bellman(m, pi_ref, 0.5, tol=1e-11).v))(mdps)
  d = jax.jit(jax.vmap(lambda m: hx.occupancy(m, pi_ref)))(mdps)
  for i in range(4):
    dense = hx.to_dense(_item(mdps, i))
    np.testing.assert_allclose(v[i], hx.solve_soft_bellman(dense, pi_ref, 0.5, tol=1e-11).v,
                               atol=1e-9)
    np.testing.assert_allclose(d[i], hx.occupancy(dense, pi_ref), atol=1e-10)


def test_sharded_over_a_mesh():
  """8 simulated devices: needs a fresh process (XLA_FLAGS before jax starts)."""
  env = dict(os.environ)
  # Appended: the suite's compile flags (tests/conftest.py) carry over to the child.
  env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-m", "tests.core.sharded_solve"], cwd=root, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "SHARDED_OK" in proc.stdout


def test_shard_batch_rejects_indivisible_batches():
  from harnax.parallel.batch import batch_mesh
  from harnax.parallel.batch import shard_batch
  mesh = batch_mesh("data")
  n = mesh.shape["data"]
  with pytest.raises(ValueError, match="leading batch axis"):
    shard_batch({"x": np.zeros(())}, mesh)
  if n > 1:
    with pytest.raises(ValueError, match="divisible"):
      shard_batch({"x": np.zeros((n + 1, 2))}, mesh)
  with pytest.raises(ValueError, match="axis"):
    shard_batch({"x": np.zeros((n, 2))}, mesh, axis="model")
