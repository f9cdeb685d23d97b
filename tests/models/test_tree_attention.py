"""`CausalLM.tree_hidden_states`: a prompt packed with a prefix tree of continuations.

Reference: transformers run on every root-to-node path as its own plain sequence (prompt,
then the path's tokens), one forward per node, so nothing of the tree layout is shared
with the code under test. Gradients are checked in float64 against the dense `pair_mask`
forward (`hidden_states`), an independent code path.
"""

from conftest import VOCAB
from conftest import hf_logits
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Qwen3 with sliding-window layers covers plain Qwen3 too.
FAMILIES = ["qwen3_swa", "qwen3_moe", "gemma3"]
TOL = 1e-4  # float32 end to end, as tests/models/test_parity.py


def _trees(seed=0):
  """Two left-padded prompts and their candidate sets (shared prefixes, one branch deeper
  than the sliding window), packed by hand: ids, mask, node ids / mask / path / parent."""
  rng = np.random.RandomState(seed)
  prompts = [rng.randint(6, VOCAB, 9).tolist(), rng.randint(6, VOCAB, 5).tolist()]
  a, b, c = (rng.randint(6, VOCAB, 6).tolist() for _ in range(3))
  cands = [[a[:3], a[:5], a[:2] + b[:4], c[:1], c[:6]], [b[:2], b[:2] + a[:3], c[:4]]]
  tp = max(map(len, prompts))
  n_max, depth_max = 16, 8
  rows = []
  for prompt, cs in zip(prompts, cands):
    index, ids, parent, paths = {}, [], [], []
    for seq in cs:
      for t in range(len(seq)):
        key = tuple(seq[:t + 1])
        if key not in index:
          index[key] = len(ids)
          ids.append(seq[t])
          parent.append(index[key[:-1]] if t else -1)
          paths.append((paths[parent[-1]] if t else []) + [len(ids) - 1])
    rows.append((prompt, ids, parent, paths))
  out = dict(prompt_ids=np.zeros((2, tp), np.int32), prompt_mask=np.zeros((2, tp), bool),
             node_ids=np.zeros((2, n_max), np.int32), node_mask=np.zeros((2, n_max), bool),
             node_path=np.full((2, n_max, depth_max), -1, np.int32),
             node_parent=np.full((2, n_max), -1, np.int32))
  for r, (prompt, ids, parent, paths) in enumerate(rows):
    out["prompt_ids"][r, tp - len(prompt):] = prompt
    out["prompt_mask"][r, tp - len(prompt):] = True
    out["node_ids"][r, :len(ids)], out["node_mask"][r, :len(ids)] = ids, True
    out["node_parent"][r, :len(ids)] = parent
    for m, path in enumerate(paths):
      out["node_path"][r, m, :len(path)] = path
  return out, rows


def _reference_logits(hf, rows):
  """transformers' next-token logits after the prompt and after every node: `[(r, slot)]`."""
  seqs, keys = [], []
  for r, (prompt, ids, _, paths) in enumerate(rows):
    seqs.append(prompt)
    keys.append((r, 0))
    for m, path in enumerate(paths):
      seqs.append(prompt + [ids[i] for i in path])
      keys.append((r, 1 + m))
  length = max(map(len, seqs))
  ids = np.zeros((len(seqs), length), np.int64)
  mask = np.zeros((len(seqs), length), np.int64)
  for i, s in enumerate(seqs):
    ids[i, length - len(s):], mask[i, length - len(s):] = s, 1
  last = hf_logits(hf, ids, mask)[:, -1]
  return dict(zip(keys, last))


def _tree_logits(model, t):
  return _tree_logits_jit(model, *(jnp.asarray(t[k]) for k in (
      "prompt_ids", "prompt_mask", "node_ids", "node_mask", "node_path")))


@nnx.jit  # one compile instead of one per op
def _tree_logits_jit(model, *tree):
  return model.logits(model.tree_hidden_states(*tree))


@pytest.mark.parametrize("name", FAMILIES)
def test_tree_logits_match_transformers_path_by_path(pair_factory, name):
  pair = pair_factory(name)
  t, rows = _trees()
  ref = _reference_logits(pair.hf, rows)
  out = np.asarray(_tree_logits(pair.model, t))
  assert out.shape == (2, 1 + t["node_ids"].shape[1], VOCAB)
  # A branch reaches deeper than the tiny sliding window (4), where one is configured.
  assert max(len(p) for _, _, _, ps in rows for p in ps) > 4
  err = max(np.abs(out[r, slot] - x).max() for (r, slot), x in ref.items())
  assert err < TOL, err


def _float64(model):
  graph, state = nnx.split(model)
  return nnx.merge(graph, jax.tree.map(lambda x: x.astype(jnp.float64), state))


@pytest.mark.parametrize("name", ["qwen3_swa", "gemma3"])
def test_tree_forward_and_gradient_equal_the_dense_tree_mask(pair_factory, name):
  t, _ = _trees(seed=1)
  tp, n = t["prompt_ids"].shape[1], t["node_ids"].shape[1]
  # The dense reference: the packed row with a [T, T] tree mask (prompt sees the prompt,
  # a node the prompt and its ancestors), built here from the parent pointers.
  anc = np.zeros((2, n, n), bool)
  for r in range(2):
    for m in range(n):
      j = m if t["node_mask"][r, m] else -1
      while j >= 0:
        anc[r, m, j] = True
        j = t["node_parent"][r, j]
  pair_mask = np.ones((2, tp + n, tp + n), bool)
  pair_mask[:, tp:, tp:] = anc
  depth = (t["node_path"] >= 0).sum(-1) - 1
  positions = np.concatenate([np.clip(t["prompt_mask"].cumsum(-1) - 1, 0, None),
                              t["prompt_mask"].sum(-1)[:, None] + np.maximum(depth, 0)], -1)
  ids = np.concatenate([t["prompt_ids"], t["node_ids"]], -1)
  mask = np.concatenate([t["prompt_mask"], t["node_mask"]], -1)
  slots = np.concatenate([[tp - 1], tp + np.arange(n)])
  weights = np.random.RandomState(2).randn(2, 1 + n, VOCAB)
  real = np.concatenate([np.ones((2, 1), bool), t["node_mask"]], -1)[..., None]
  with jax.enable_x64(True):
    graph, params = nnx.split(_float64(pair_factory(name).model))

    def tree_loss(p):
      return jnp.sum(jnp.where(real, weights * _tree_logits(nnx.merge(graph, p), t), 0.0))

    def dense_loss(p):
      model = nnx.merge(graph, p)
      hidden = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask),
                                   positions=jnp.asarray(positions),
                                   pair_mask=jnp.asarray(pair_mask))
      return jnp.sum(jnp.where(real, weights * model.logits(hidden[:, slots]), 0.0))

    (a, ga), (b, gb) = (jax.jit(jax.value_and_grad(f))(params) for f in (tree_loss, dense_loss))
    np.testing.assert_allclose(a, b, rtol=1e-10)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
      np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("field, shape, match", [
    ("node_ids", (3, 16), "node_ids: expected shape"),
    ("node_mask", (2, 15), "node_mask: expected shape"),
    ("node_path", (2, 16), "node_path: expected shape"),
    ("prompt_ids", (2, 0), "prompt_ids: expected at least one"),
])
def test_tree_bad_shapes(pair_factory, field, shape, match):
  t, _ = _trees()
  t[field] = np.zeros(shape, np.int32)
  if field == "prompt_ids":
    t["prompt_mask"] = np.zeros(shape, bool)
  with pytest.raises(ValueError, match=match):
    _tree_logits(pair_factory("qwen3").model, t)
