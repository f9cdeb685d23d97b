"""MDP containers: construction, validation at the edge, dense/sparse conversion."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harnax as hx
from tests.core import reference as ref


@pytest.fixture(scope="module")
def prob():
  return ref.random_problem(np.random.default_rng(0), 5, 3)


def _make(p, **over):
  kw = dict(transitions=p["P"], rewards=p["r"], discount=p["gamma"], initial=p["mu0"])
  kw.update(over)
  return hx.TabularMDP(**kw)


def test_fields_shapes_and_dtypes(prob):
  mdp = _make(prob)
  assert (mdp.num_states, mdp.num_actions) == (5, 3)
  assert mdp.transitions.shape == (5, 3, 5) and mdp.discount.shape == ()
  with jax.enable_x64(False):
    assert _make(prob).rewards.dtype == jnp.float32


@pytest.mark.parametrize("field,value,match", [
    ("transitions", lambda p: p["P"] * 0.9, "transitions: expected probabilities summing to 1"),
    ("transitions", lambda p: np.where(np.arange(5) == 0, -0.1, p["P"] + 0.025),
     "transitions: expected non-negative"),
    ("transitions", lambda p: p["P"][:, :, :4], r"transitions: expected shape \[S, A, S\]"),
    ("rewards", lambda p: p["r"][:, :2], r"rewards: expected shape \[5, 3\]"),
    ("rewards", lambda p: np.where(np.eye(5, 3) > 0, np.nan, p["r"]), "rewards: expected finite"),
    ("rewards", lambda p: np.full((5, 3), np.inf), "rewards: expected finite"),
    ("discount", lambda p: 1.0, "discount: expected 0 <= gamma < 1"),
    ("discount", lambda p: -0.1, "discount: expected 0 <= gamma < 1"),
    ("discount", lambda p: np.array([0.9, 0.9]), "discount: expected shape"),
    ("initial", lambda p: np.ones(5), "initial: expected probabilities summing to 1"),
    ("initial", lambda p: np.ones(4) / 4, r"initial: expected shape \[5\]"),
    ("rewards", lambda p: "abc", "rewards: expected a"),
])
def test_bad_input_names_the_field(prob, field, value, match):
  with pytest.raises(ValueError, match=match):
    _make(prob, **{field: value(prob)})


def test_sparse_bad_input():
  with pytest.raises(ValueError, match=r"successors: expected state indices in \[0, 3\)"):
    hx.SparseTabularMDP(successors=[[[3]], [[0]], [[1]]], rewards=np.zeros((3, 1)), discount=0.5,
                        initial=np.ones(3) / 3)
  with pytest.raises(ValueError, match="successors: expected integer"):
    hx.SparseTabularMDP(successors=np.zeros((3, 1, 1)), rewards=np.zeros((3, 1)), discount=0.5,
                        initial=np.ones(3) / 3)
  with pytest.raises(ValueError, match="probabilities: expected probabilities summing to 1"):
    hx.SparseTabularMDP(successors=np.zeros((3, 1, 2), int), probabilities=np.full((3, 1, 2), 0.4),
                        rewards=np.zeros((3, 1)), discount=0.5, initial=np.ones(3) / 3)


def test_deterministic_shorthand_and_dense_round_trip(prob):
  succ = np.array([[1, 2], [2, 0], [0, 0]])
  m = hx.SparseTabularMDP(successors=succ, rewards=np.ones((3, 2)), discount=0.5,
                          initial=np.ones(3) / 3)
  assert m.num_successors == 1
  dense = hx.to_dense(m)
  np.testing.assert_array_equal(np.asarray(dense.transitions).argmax(-1), succ)
  back = hx.to_sparse(_make(prob))
  np.testing.assert_allclose(hx.to_dense(back).transitions, prob["P"], atol=1e-15)
  with pytest.raises(ValueError, match="num_successors"):
    hx.to_sparse(_make(prob), num_successors=2)


def test_stack_and_vmap_axes(prob):
  a, b = _make(prob), _make(prob, rewards=prob["r"] + 1)
  batch = hx.stack([a, b])
  assert batch.transitions.shape == (2, 5, 3, 5)
  spec = hx.TabularMDP.axes(transitions=None)
  assert spec.transitions is None and spec.rewards == 0
  with pytest.raises(ValueError, match="one kind"):
    hx.stack([a, hx.to_sparse(a)])
  with pytest.raises(ValueError, match="at least one"):
    hx.stack([])


def test_rebuilding_from_leaves_skips_validation(prob):
  # jit/vmap/tree_map rebuild containers from tracers and specs: no checks there.
  mdp = _make(prob)
  doubled = jax.tree.map(lambda x: x * 2, mdp)  # not stochastic any more, on purpose
  assert float(doubled.transitions.sum()) == pytest.approx(30.0)
  with pytest.raises(ValueError, match="transitions"):
    doubled.replace()  # an explicit replace validates again


@pytest.mark.parametrize("sparse", [False, True])
def test_containers_rebuild_from_any_leaves_but_validate_when_built(prob, sparse):
  mdp = hx.to_sparse(_make(prob)) if sparse else _make(prob)
  leaves, treedef = jax.tree.flatten(mdp)
  sentinels = [object() for _ in leaves]
  rebuilt = jax.tree.unflatten(treedef, sentinels)  # what jax.tree_util does internally
  assert [getattr(rebuilt, f) for f in ("rewards", "discount", "initial")] == sentinels[-3:]
  # Under jit the fields are tracers; the container passes through unchanged.
  out = jax.jit(lambda m: m)(mdp)
  chex.assert_trees_all_close(out, mdp)
  # The same fields given to the constructor are checked.
  with pytest.raises(ValueError, match="rewards"):
    type(mdp)(**{**{k: getattr(mdp, k) for k in _fields(mdp)}, "rewards": prob["r"][:, :2]})
  with pytest.raises(ValueError, match="replace: TabularMDP has no fields"):
    _make(prob).replace(gamma=0.5)


def _fields(mdp):
  return [k for k in ("transitions", "successors", "probabilities", "rewards", "discount",
                      "initial") if hasattr(mdp, k)]
