"""The Interface abstraction and the tabular harness: construction and validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from harnax import harness as hh
from tests.harness import reference as ref


def _arrays(seed=0, s=5, a=3, o=6):
  return ref.random_harness_arrays(np.random.default_rng(seed), s, a, o, unavailable=0.3)


def _harness(p, **kw):
  mdp = hx.TabularMDP(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])
  return hh.TabularHarness(mdp=mdp, pi_ref=p["pi_ref"], decode_table=p["table"], **kw)


def test_tabular_harness_shapes_and_interface_functions():
  p = _arrays()
  h = _harness(p, name="Hx")
  assert (h.num_states, h.num_actions, h.num_outputs) == (5, 3, 6)
  assert h.decode_table.dtype == jnp.int32
  assert h.action_names == ("action_0", "action_1", "action_2")
  iface = hh.as_interface(h)
  assert isinstance(iface, hh.Interface)
  for s in range(5):
    for o in range(6):
      assert int(iface.decode(s, o)) == p["table"][s, o]
      assert int(iface.decode(s, f"output_{o}")) == p["table"][s, o]
  probs, reward = iface.execute(2, 1)
  np.testing.assert_allclose(probs, p["P"][2, 1])
  assert float(reward) == p["r"][2, 1]
  with pytest.raises(ValueError, match="encoder"):
    iface.encode(0)


def test_harness_is_a_pytree_through_jit_and_vmap():
  p = _arrays()
  h = _harness(p, noop_action=None)
  leaves, treedef = jax.tree.flatten(h)
  assert len(leaves) == 4 + 2  # the MDP's four leaves, pi_ref, decode_table
  back = jax.tree.unflatten(treedef, leaves)
  assert back.name == h.name and back.action_names == h.action_names

  @jax.jit
  def valid_fraction(harness):
    return jnp.mean(harness.decode_table >= 0)

  np.testing.assert_allclose(valid_fraction(h), np.mean(p["table"] >= 0))
  batch = jax.tree.map(lambda *xs: jnp.stack(xs), h, h)
  np.testing.assert_allclose(jax.vmap(valid_fraction)(batch), [np.mean(p["table"] >= 0)] * 2)
  with pytest.raises(AttributeError):
    h.name = "other"
  # Rebuilding never validates: object() sentinels as leaves (as jax.tree_util uses)
  # and an in_axes spec with None and 0 leaves go through; the constructor checks.
  sentinels = [object() for _ in leaves]
  rebuilt = jax.tree.unflatten(treedef, sentinels)
  assert rebuilt.decode_table is sentinels[-1] and rebuilt.output_names == h.output_names
  spec = jax.tree.unflatten(treedef, [None] * 4 + [0, 0])
  out = jax.vmap(lambda hb: jnp.mean(hb.decode_table >= 0), in_axes=(spec,))(
      jax.tree.unflatten(treedef, leaves[:4] + [jnp.stack([x, x]) for x in leaves[4:]]))
  np.testing.assert_allclose(out, [np.mean(p["table"] >= 0)] * 2)


def test_field_encoder_orders_fields():
  enc = hh.FieldEncoder(fields=lambda s: [("a", str(s)), ("b", "x"), ("c", "y")], num_fields=3)
  assert enc(4) == "a: 4\nb: x\nc: y"
  assert enc.reversed()(4) == "c: y\nb: x\na: 4"
  assert enc.reordered((1, 0, 2))(4) == "b: x\na: 4\nc: y"
  assert enc.reversed().reversed()(4) == enc(4)
  assert hh.encode_fields(enc.reversed(), 1) == "c: y\nb: x\na: 1"
  with pytest.raises(ValueError, match="order: expected a permutation"):
    enc.reordered((0, 0, 1))
  with pytest.raises(ValueError, match="fields: expected 2"):
    hh.FieldEncoder(fields=lambda s: [("a", "1")], num_fields=2)(0)


def test_decode_table_from_a_python_decoder():
  outputs = ["go 0", "go 1", "noise"]

  def decode(state, out):
    return int(out[-1]) if out.startswith("go") and state > 0 else hh.INVALID

  table = hh.decode_table_from(decode, 3, outputs)
  np.testing.assert_array_equal(table, [[-1, -1, -1], [0, 1, -1], [0, 1, -1]])
  assert table.dtype == np.int32


def test_decode_table_with_out_of_range_ids_is_rejected():
  p = _arrays()
  bad = p["table"].copy()
  bad[1, 2] = 3  # A = 3
  with pytest.raises(ValueError, match=r"decode_table: .*output 2 in state 1 decodes to 3"):
    _harness(dict(p, table=bad))
  bad[1, 2] = -2
  with pytest.raises(ValueError, match="decode_table"):
    _harness(dict(p, table=bad))
  with pytest.raises(ValueError, match="decode_table: expected integer"):
    _harness(dict(p, table=p["table"].astype(float)))
  with pytest.raises(ValueError, match=r"decode_table: expected shape \[5, O\]"):
    _harness(dict(p, table=p["table"][:4]))


def test_decoding_to_an_unavailable_action_is_rejected():
  p = _arrays()
  s, a = map(int, np.argwhere(p["pi_ref"] == 0)[0])
  bad = p["table"].copy()
  bad[s, 0] = a
  with pytest.raises(ValueError, match=f"output 0 in state {s} decodes to action {a}, which "
                     "pi_ref marks unavailable"):
    _harness(dict(p, table=bad))


def test_noop_action_and_names_are_validated():
  p = _arrays()
  with pytest.raises(ValueError, match="noop_action: expected an action id"):
    _harness(p, noop_action=3)
  pi_ref = np.full((5, 3), 1 / 3)
  pi_ref[0] = [0.5, 0.5, 0.0]
  table = np.zeros((5, 2), np.int32)
  table[0, 1] = -1
  with pytest.raises(ValueError, match="noop_action: action 2 must be available .* state 0"):
    _harness(dict(p, pi_ref=pi_ref, table=table), noop_action=2)
  _harness(dict(p, pi_ref=pi_ref, table=table), noop_action=0)  # available there: fine
  with pytest.raises(ValueError, match="action_names: expected 3 names, got 2"):
    _harness(p, action_names=["x", "y"])
  with pytest.raises(ValueError, match="output_names: expected distinct names"):
    _harness(p, output_names=["o"] * 6)
  with pytest.raises(ValueError, match="pi_ref"):
    _harness(dict(p, pi_ref=p["pi_ref"][:, :2]))


def test_replace_revalidates():
  h = _harness(_arrays())
  assert h.replace(name="H9").name == "H9"
  with pytest.raises(ValueError, match="decode_table"):
    h.replace(decode_table=np.full((5, 6), 7, np.int32))
