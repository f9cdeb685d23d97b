"""Sharded forward + optax train step on 8 simulated CPU devices (run as a subprocess).

Usage: ``python sharded_check.py MODEL_DIR [MODEL_DIR ...]``. XLA_FLAGS must request 8 host
devices before jax is imported, which is why this is a separate process
(``test_parallel.py`` launches it). Prints one ``OK ...`` line per model, exits non-zero on a
failed check.
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from harnax import models  # noqa: E402
from harnax import parallel  # noqa: E402
from harnax.models import logprobs  # noqa: E402


def train_step(graphdef, params, rest, opt_state, ids, mask, tx):
  """One optax step on the mean token NLL; also returns the forward's logits."""

  def loss_fn(p):
    model = nnx.merge(graphdef, p, rest)
    logits = model(ids, attention_mask=mask)
    lp = logprobs.token_logprobs(logits[:, :-1], ids[:, 1:])
    valid = mask[:, 1:] * mask[:, :-1]
    return -(lp * valid).sum() / valid.sum(), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return loss, logits, optax.apply_updates(params, updates), opt_state


def run(path, mesh):
  rng = np.random.RandomState(0)
  ref_model = models.load_pretrained(path, moe_impl="ragged")
  ids = jnp.asarray(rng.randint(0, ref_model.config.vocab_size, (8, 12)), jnp.int32)
  mask = np.ones((8, 12), np.int32)
  mask[1, :5] = 0
  mask[6, :9] = 0
  mask = jnp.asarray(mask)
  # SGD keeps the update proportional to the gradient (Adam would amplify float noise in
  # near-zero gradients into full-size steps), so sharded == unsharded is a tight check.
  tx = optax.sgd(0.1, momentum=0.9)

  g, p, rest = nnx.split(ref_model, nnx.Param, ...)
  step = jax.jit(train_step, static_argnames=("graphdef", "tx"))
  ref_loss, ref_logits, ref_params, _ = step(g, p, rest, tx.init(p), ids, mask, tx=tx)

  # Straight into the sharded layout; "ragged" keeps the grouped-matmul MoE path under test.
  model = models.load_pretrained(path, mesh=mesh, moe_impl="ragged")
  specs = [v.get_value().sharding.spec for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
  q = model.layers[0].attn.q_proj.kernel[...]
  # [out, in] = (q_heads, embed) -> (tensor, fsdp).
  assert q.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp"), q.sharding.spec
  assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (
      q.shape[0] // 2, q.shape[1] // 2), q.addressable_shards[0].data.shape
  assert sum(1 for s in specs if any(a is not None for a in s)) >= len(specs) // 2, specs

  ids_s = jax.device_put(ids, jax.sharding.NamedSharding(
      mesh, parallel.logical_to_spec(("batch", "seq"), ids.shape, mesh)))
  mask_s = jax.device_put(mask, ids_s.sharding)
  g, p, rest = nnx.split(model, nnx.Param, ...)

  def sharded_step(graphdef, params, rest, opt_state, ids, mask, tx):
    with parallel.sharding_rules(mesh):  # activation constraints are live in this trace
      return train_step(graphdef, params, rest, opt_state, ids, mask, tx)

  opt_state = jax.jit(tx.init)(p)
  jitted = jax.jit(sharded_step, static_argnames=("graphdef", "tx"))
  # The activation constraints must reach the program, not be silently dropped.
  hlo = jitted.lower(g, p, rest, opt_state, ids_s, mask_s, tx=tx).as_text()
  assert hlo.count("sharding_constraint") >= model.config.num_layers, "no activation constraints"
  loss, logits, new_p, _ = jitted(g, p, rest, opt_state, ids_s, mask_s, tx=tx)
  err = float(jnp.max(jnp.abs(logits - ref_logits)))
  assert err < 1e-4, err
  assert logits.sharding.spec[0] == ("data", "fsdp"), logits.sharding
  assert abs(float(loss) - float(ref_loss)) < 1e-5, (loss, ref_loss)
  diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), new_p, ref_params)
  worst = max(jax.tree.leaves(diffs))
  assert worst < 1e-5, worst
  new_q = new_p["layers"][0]["attn"]["q_proj"]["kernel"][...]
  assert new_q.sharding.spec == q.sharding.spec, new_q.sharding
  print(f"OK {os.path.basename(path)} logits_err={err:.2e} params_err={worst:.2e} "
        f"loss={float(loss):.4f}")


def main():
  assert jax.device_count() == 8, jax.devices()
  mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  for path in sys.argv[1:]:
    run(path, mesh)


if __name__ == "__main__":
  main()
