"""harnax.train.train: the config-driven loop, exact resume, bf16 compute, the mesh.

The toy objective is the exact mean return of a tabular softmax policy over a batch of
random MDPs (`harnax.evaluate_policy`); references are hand-written optax loops and the
core's closed-form policy gradient, never the loop itself.
"""

import json
import os
import shutil
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import harnax as hx
from harnax import models
from harnax import train
from harnax.core import mdp as mdp_lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TAU = 0.5
N, S, A = 8, 8, 4


def make_problem(n=N, s=S, a=A):
  mdps = mdp_lib.stack([hx.random_dense_mdp(jax.random.key(i), s, a, discount=0.8)
                        for i in range(n)])
  pi_ref = jnp.stack([hx.random_reference(jax.random.key(100 + i), s, a,
                                          unavailable_fraction=0.2) for i in range(n)])
  return mdps, pi_ref


def mean_return(theta, batch):
  mdps, pi_ref = batch
  one = lambda m, r: hx.evaluate_policy(m, hx.softmax_policy(theta, r), r, TAU).value
  return jnp.mean(jax.vmap(one)(mdps, pi_ref))


def dict_fn(params, batch):
  """value_and_grad_fn over params {"logits": [S, A]}, with one extra metric."""
  v, g = jax.value_and_grad(lambda p: mean_return(p["logits"], batch))(params)
  return v, g, {"regret_proxy": -v}


class Logits(nnx.Module):
  """Tabular logits as an NNX parameter with logical axes (sharded by the mesh rules)."""

  def __init__(self, s=S, a=A):
    self.logits = nnx.Param(jnp.zeros((s, a), jnp.float32), axes=("embed", "mlp"))


def state_fn(params, batch):
  v, g = jax.value_and_grad(lambda p: mean_return(p["logits"][...], batch))(params)
  return v, g, {}


def config(**kw):
  c = train.default_config()
  c.num_steps = 10
  c.checkpoint_every = 3
  c.learning_rate = 0.1
  c.log_every = 0
  c.update(kw)
  return c


@pytest.fixture(scope="module")
def problem():
  return make_problem()


def test_sgd_steps_are_exact_ascent_steps(problem, tmp_path):
  # Independent reference: the core's closed-form softmax policy gradient, averaged.
  lr, steps = 0.3, 4
  out = train.train(config(optimizer="sgd", learning_rate=lr, num_steps=steps), dict_fn,
                    {"logits": jnp.zeros((S, A))}, problem, workdir=str(tmp_path), progress=False)
  mdps, pi_ref = problem
  theta = jnp.zeros((S, A))
  for k in range(steps):
    grads = [hx.softmax_policy_gradient(jax.tree.map(lambda x: x[i], mdps), theta, pi_ref[i], TAU)
             for i in range(N)]
    value = float(mean_return(theta, problem))
    np.testing.assert_allclose(out.history[k]["value"], value, rtol=1e-6)
    np.testing.assert_allclose(out.history[k]["regret_proxy"], -value, rtol=1e-6)
    np.testing.assert_allclose(out.history[k]["grad_norm"],
                               np.linalg.norm(np.mean(grads, axis=0)), rtol=1e-4)
    theta = theta + lr * jnp.mean(jnp.stack(grads), axis=0)
  np.testing.assert_allclose(out.params["logits"], theta, atol=1e-6)
  assert [h["step"] for h in out.history] == list(range(steps))
  assert out.history[-1]["value"] > out.history[0]["value"]


def test_adamw_warmup_cosine_clipping_match_a_hand_written_optax_loop(problem, tmp_path):
  cfg = config(optimizer="adamw", schedule="warmup_cosine", warmup_steps=2, num_steps=6,
               learning_rate=0.2, weight_decay=0.01, grad_clip_norm=0.05)
  out = train.train(cfg, dict_fn, {"logits": jnp.zeros((S, A))}, problem,
                    workdir=str(tmp_path), progress=False)
  schedule = lambda k: 0.2 * k / 2 if k < 2 else 0.5 * 0.2 * (1 + np.cos(np.pi * (k - 2) / 4))
  tx = optax.chain(optax.clip_by_global_norm(0.05),
                   optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 0.2, 2, 6, 0.0),
                               weight_decay=0.01))
  params = {"logits": jnp.zeros((S, A))}
  state = tx.init(params)

  @jax.jit  # one compile instead of one per op and step
  def reference_step(params, state):
    v, g, _ = dict_fn(params, problem)
    updates, state = tx.update(jax.tree.map(jnp.negative, g), state, params)
    return v, optax.apply_updates(params, updates), state

  for k in range(6):
    v, params, state = reference_step(params, state)
    assert out.history[k]["value"] == pytest.approx(float(v), rel=1e-6)
    assert out.history[k]["learning_rate"] == pytest.approx(schedule(k), abs=1e-7)
  np.testing.assert_allclose(out.params["logits"], params["logits"], atol=1e-6)


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _strip(history):
  return [{k: v for k, v in h.items() if k != "step_time"} for h in history]


class Crash(RuntimeError):
  pass


def test_killed_and_resumed_run_is_bit_identical(problem, tmp_path):
  cfg = config(optimizer="adam", schedule="cosine", keep_checkpoints=2)
  params = {"logits": jnp.zeros((S, A))}
  straight = train.train(cfg, dict_fn, params, problem, workdir=str(tmp_path / "a"),
                         progress=False)

  # Killed while running step 5: the last checkpoint is step 3, steps 3 and 4 are logged.
  def crashing(step):
    if step == 5:
      raise Crash("killed")
    return problem

  work = str(tmp_path / "b")
  with pytest.raises(Crash):
    train.train(cfg, dict_fn, params, crashing, workdir=work, progress=False)
  assert [r["step"] for r in _records(work)] == [0, 1, 2, 3, 4]
  assert sorted(os.listdir(os.path.join(work, "checkpoints"))) == ["3"]
  # As in a new process: the step is traced and compiled afresh.
  train.loop._cached_step.cache_clear()
  ran = []
  resumed = train.train(cfg, dict_fn, params, lambda s: ran.append(s) or problem,
                        workdir=work, progress=False)
  assert ran == list(range(3, 10))                        # restarted from the step-3 checkpoint
  np.testing.assert_array_equal(resumed.params["logits"], straight.params["logits"])
  assert [r["step"] for r in _records(work)] == list(range(10))   # no duplicated lines
  assert _strip(resumed.history) == _strip(straight.history)
  assert _strip(_records(work)) == _strip(_records(str(tmp_path / "a")))
  # keep_checkpoints=2: the latest two (9, and the final 10).
  assert sorted(os.listdir(os.path.join(work, "checkpoints")), key=int) == ["9", "10"]

  # A job in slices of 4 steps ends at the same bits; a finished run resumes to a no-op.
  work = str(tmp_path / "c")
  for _ in range(3):
    sliced = train.train(cfg, dict_fn, params, problem, workdir=work, progress=False,
                         max_steps_this_run=4)
  np.testing.assert_array_equal(sliced.params["logits"], straight.params["logits"])
  ran = []
  again = train.train(cfg, dict_fn, params, lambda s: ran.append(s) or problem, workdir=work,
                      progress=False)
  assert ran == []
  np.testing.assert_array_equal(again.params["logits"], straight.params["logits"])
  assert len(again.history) == 10


def test_keep_steps_keeps_a_learning_curve_and_restore_params_reads_it(problem, tmp_path):
  # Reference: separate runs of 2 and 5 steps (the run is deterministic, so step k of a long
  # run equals a k-step run).
  params = {"logits": jnp.zeros((S, A))}
  cfg = config(optimizer="adam", num_steps=7, checkpoint_every=0, keep_checkpoints=1,
               keep_steps=(2, 5))
  work = str(tmp_path / "long")
  train.train(cfg, dict_fn, params, problem, workdir=work, progress=False)
  # Without keep_steps only the final checkpoint would be left (checkpoint_every=0, keep 1).
  assert train.checkpoint_steps(work) == [2, 5, 7]
  for k in (2, 5, 7):
    short = train.train(config(optimizer="adam", num_steps=k, checkpoint_every=0), dict_fn,
                        params, problem, workdir=str(tmp_path / f"short{k}"), progress=False)
    got = train.restore_params(cfg, params, work, k)
    np.testing.assert_array_equal(got["logits"], short.params["logits"])
    assert got["logits"].dtype == jnp.float32
  assert not np.array_equal(train.restore_params(cfg, params, work, 2)["logits"],
                            train.restore_params(cfg, params, work, 5)["logits"])
  # Resuming with keep_steps keeps the earlier points: 7 -> 9 steps keeps 2, 5 and the last.
  cfg.num_steps = 9
  train.train(cfg, dict_fn, params, problem, workdir=work, progress=False)
  assert train.checkpoint_steps(work) == [2, 5, 9]
  assert train.checkpoint_steps(str(tmp_path / "none")) == []

  with pytest.raises(ValueError, match=r"step: no checkpoint of step 3 .*kept: \[2, 5, 9\]"):
    train.restore_params(cfg, params, work, 3)
  with pytest.raises(ValueError, match="step: expected a positive integer"):
    train.restore_params(cfg, params, work, 0)
  with pytest.raises(ValueError, match="params: leaf 'logits' is"):
    train.restore_params(cfg, {"logits": jnp.zeros((S + 1, A))}, work, 2)
  with pytest.raises(ValueError, match="params: .*'other'.* missing in the checkpoint of step 2"):
    train.restore_params(cfg, {"other": jnp.zeros((S, A))}, work, 2)
  for bad in ((0,), (1.5,), "2", 3):
    with pytest.raises(ValueError, match="config.keep_steps: expected a tuple of integers"):
      train.check_config({"keep_steps": bad})


def test_an_unfinalized_checkpoint_is_never_restored(problem, tmp_path):
  cfg = config(optimizer="adam")
  params = {"logits": jnp.zeros((S, A))}
  straight = train.train(cfg, dict_fn, params, problem, workdir=str(tmp_path / "a"),
                         progress=False)
  work = str(tmp_path / "b")
  train.train(cfg, dict_fn, params, problem, workdir=work, progress=False, max_steps_this_run=6)
  ckpts = os.path.join(work, "checkpoints")
  # A write of step 9 interrupted before orbax's final rename: complete files, temp name.
  fake = os.path.join(ckpts, "9.orbax-checkpoint-tmp-1700000000000000")
  shutil.copytree(os.path.join(ckpts, "6"), fake)
  ran = []
  resumed = train.train(cfg, dict_fn, params, lambda s: ran.append(s) or problem,
                        workdir=work, progress=False)
  assert ran == [6, 7, 8, 9]
  assert not os.path.exists(fake)                      # cleaned up at start-up
  np.testing.assert_array_equal(resumed.params["logits"], straight.params["logits"])


def test_a_checkpoint_of_another_model_or_config_is_refused(problem, tmp_path):
  params = {"logits": jnp.zeros((S, A))}
  work = str(tmp_path)
  train.train(config(num_steps=3), dict_fn, params, problem, workdir=work, progress=False)
  wider = lambda p, b: (jnp.sum(p["logits"]), jax.tree.map(jnp.ones_like, p), {})
  with pytest.raises(ValueError, match=r"'logits' is \[8, 4\] float32 there and \[8, 5\]"):
    train.train(config(num_steps=5), wider, {"logits": jnp.zeros((S, A + 1))}, problem,
                workdir=work, progress=False)
  two = {"logits": jnp.zeros((S, A)), "bias": jnp.zeros((A,))}
  with pytest.raises(ValueError, match=r"missing \['bias'\]"):
    train.train(config(num_steps=5), wider, two, problem, workdir=work, progress=False)
  with pytest.raises(ValueError, match="config.learning_rate: 0.5 here, 0.1 in the run"):
    train.train(config(num_steps=5, learning_rate=0.5), dict_fn, params, problem, workdir=work,
                progress=False)
  with pytest.raises(ValueError, match="optimizer"):
    train.train(config(num_steps=5, optimizer="sgd"), dict_fn, params, problem, workdir=work,
                progress=False)
  # Settings that leave the trajectory alone may change: a constant-schedule run extended.
  ran = []
  out = train.train(config(num_steps=5, log_every=7, lora_rank=4, checkpoint_every=1),
                    dict_fn, params, lambda s: ran.append(s) or problem, workdir=work,
                    progress=False)
  assert ran == [3, 4] and [h["step"] for h in out.history] == [0, 1, 2, 3, 4]


def test_progress_lines_and_bar(problem, tmp_path, capsys, monkeypatch):
  params = {"logits": jnp.zeros((S, A))}
  train.train(config(num_steps=4, log_every=2), dict_fn, params, problem,
              workdir=str(tmp_path / "a"), progress=True)   # stderr is not a TTY here
  lines = capsys.readouterr().err.strip().splitlines()
  lines = [x for x in lines if x.startswith("step ")]
  assert [x.split()[1] for x in lines] == ["2/4", "4/4"]
  assert "regret_proxy" in lines[0] and "it/s" in lines[0]

  class Tty:
    def __init__(self):
      self.text = ""

    def write(self, s):
      self.text += s

    def flush(self):
      pass

    def isatty(self):
      return True

  tty = Tty()
  monkeypatch.setattr(sys, "stderr", tty)
  train.train(config(num_steps=3, log_every=1), dict_fn, params, problem,
              workdir=str(tmp_path / "b"), progress=True)
  assert tty.text.count("\r") == 3 and "3/3" in tty.text and tty.text.endswith("\n")
  assert "it/s" in tty.text and "step 1/3" not in tty.text
  tty.text = ""
  train.train(config(num_steps=2, log_every=0), dict_fn, params, problem,
              workdir=str(tmp_path / "c"), progress=False)
  assert tty.text == ""


def test_bad_configs_name_the_field():
  bad = [
      (dict(optimizer="rmsprop"), "config.optimizer"),
      (dict(schedule="linear"), "config.schedule"),
      (dict(finetune="qlora"), "config.finetune"),
      (dict(compute_dtype="float16"), "config.compute_dtype"),
      (dict(learning_rate=0.0), "config.learning_rate"),
      (dict(learning_rate=float("nan")), "config.learning_rate"),
      (dict(num_steps=0), "config.num_steps"),
      (dict(num_steps=2.5), "config.num_steps"),
      (dict(weight_decay=0.1), "config.weight_decay: only optimizer='adamw'"),
      (dict(warmup_steps=3), "config.warmup_steps: only schedule='warmup_cosine'"),
      (dict(schedule="warmup_cosine", warmup_steps=100), "config.warmup_steps"),
      (dict(grad_clip_norm=-1.0), "config.grad_clip_norm"),
      (dict(checkpoint_every=-1), "config.checkpoint_every"),
      (dict(keep_checkpoints=0), "config.keep_checkpoints"),
      (dict(finetune="lora", lora_rank=0), "config.lora_rank"),
      (dict(finetune="lora", lora_alpha=-1.0), "config.lora_alpha"),
      (dict(finetune="lora", lora_targets="(attn"), "config.lora_targets"),
      (dict(distributed="yes"), "config.distributed"),
      (dict(mesh=dict(pipeline=2)), "config.mesh.pipeline"),
      (dict(mesh=dict(data=0)), "config.mesh.data"),
      (dict(mesh=dict(data=-1, fsdp=-1)), "config.mesh"),
      (dict(learning_rte=0.1), "config.learning_rte: unknown field"),
  ]
  for fields, message in bad:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
      train.make_optimizer(fields)
  with pytest.raises(ValueError, match="config: expected a ConfigDict"):
    train.make_optimizer("adam")
  # A plain dict of some fields is completed with the defaults.
  assert train.check_config({"learning_rate": 0.5}).optimizer == "adam"


def test_bad_inputs_name_the_argument(problem, tmp_path):
  params = {"logits": jnp.zeros((S, A))}
  work = str(tmp_path)
  run = lambda fn, p=params, b=problem, **kw: train.train(  # noqa: E731
      config(num_steps=2, **kw), fn, p, b, workdir=work, progress=False)
  with pytest.raises(ValueError, match="config.mesh: .* needs 2 devices, 1 are available"):
    run(dict_fn, mesh=dict(data=2))
  with pytest.raises(ValueError, match="value_and_grad_fn: expected a callable"):
    run(None)
  with pytest.raises(ValueError, match="value_and_grad_fn: expected a tuple"):
    run(lambda p, b: jax.value_and_grad(lambda q: mean_return(q["logits"], b))(p))
  with pytest.raises(ValueError, match="value must be a scalar"):
    run(lambda p, b: (jnp.ones(2), p, {}))
  with pytest.raises(ValueError, match=r"gradient of 'logits' has shape \[4, 8\]"):
    run(lambda p, b: (jnp.sum(p["logits"]), {"logits": jnp.ones((A, S))}, {}))
  with pytest.raises(ValueError, match="grads have 2 leaves"):
    run(lambda p, b: (jnp.sum(p["logits"]), (p, p), {}))
  with pytest.raises(ValueError, match="metric name 'value'"):
    run(lambda p, b: (jnp.sum(p["logits"]), p, {"value": 1.0}))
  with pytest.raises(ValueError, match="metric 'm' must be a scalar"):
    run(lambda p, b: (jnp.sum(p["logits"]), p, {"m": jnp.ones(3)}))
  with pytest.raises(ValueError, match="params: leaf 'steps' is not a floating array"):
    run(dict_fn, p={"logits": jnp.zeros((S, A)), "steps": jnp.zeros((), jnp.int32)})
  with pytest.raises(ValueError, match="params: expected a pytree of arrays, got an nnx.Module"):
    run(state_fn, p=Logits())
  with pytest.raises(ValueError, match="params: expected a pytree with at least one array"):
    run(dict_fn, p={})
  with pytest.raises(ValueError, match="max_steps_this_run"):
    train.train(config(), dict_fn, params, problem, workdir=work, max_steps_this_run=0)
  with pytest.raises(ValueError, match="workdir"):
    train.train(config(), dict_fn, params, problem, workdir=None)


# -- bfloat16 compute on a tiny language model -------------------------------------------------


V = 48


def tiny_lm(seed=0):
  cfg = models.Qwen3Config.from_hf_dict(dict(
      architectures=["Qwen3ForCausalLM"], vocab_size=V, hidden_size=16, intermediate_size=32,
      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
      max_position_embeddings=64, rope_theta=1000.0, tie_word_embeddings=False))
  return models.from_config(cfg, seed=seed)


def make_likelihood_fn(graphdef, seen_dtypes=None):
  """The mean token log-likelihood of a batch of sequences (to maximize) and its gradient."""

  def fn(params, ids):
    if seen_dtypes is not None:
      seen_dtypes.update(str(x.dtype) for x in jax.tree.leaves(params))

    def objective(p):
      logits = nnx.merge(graphdef, p)(ids)
      return jnp.mean(models.token_logprobs(logits[:, :-1], ids[:, 1:]))

    value, grads = jax.value_and_grad(objective)(params)
    return value, grads, {}
  return fn


def test_bfloat16_compute_keeps_float32_master_weights(tmp_path):
  graphdef, params = nnx.split(tiny_lm())
  before = [np.array(x) for x in jax.tree.leaves(params)]
  ids = jnp.asarray(np.random.default_rng(0).integers(1, V, (4, 6)), jnp.int32)
  seen = set()
  cfg = config(num_steps=3, learning_rate=0.05, compute_dtype="bfloat16", checkpoint_every=0)
  out = train.train(cfg, make_likelihood_fn(graphdef, seen), params, ids,
                    workdir=str(tmp_path / "b"), progress=False)
  assert seen == {"bfloat16"}
  assert isinstance(out.params, nnx.State)
  assert {x.dtype for x in jax.tree.leaves(out.params)} == {jnp.dtype(jnp.float32)}
  values = [h["value"] for h in out.history]
  assert values[-1] > values[0]
  # Master weights and optimizer state are float32 in the checkpoint.
  import orbax.checkpoint as ocp
  mngr = ocp.CheckpointManager(str(tmp_path / "b" / "checkpoints"),
                               item_handlers=ocp.StandardCheckpointHandler())
  meta = mngr.metadata(3).item_metadata.tree
  mngr.close()
  dtypes = {str(m.dtype) for g in ("params", "opt_state") for m in meta[g].values()}
  assert dtypes == {"float32", "int32"}          # int32: Adam's step count
  # The bf16 run follows the float32 one to bf16 precision, but is not the float32 run.
  ref = train.train(config(num_steps=3, learning_rate=0.05, checkpoint_every=0),
                    make_likelihood_fn(graphdef), params, ids, workdir=str(tmp_path / "f"),
                    progress=False)
  ref_values = [h["value"] for h in ref.history]
  assert values != ref_values
  # Same start (bf16 forward and gradient at the float32 weights); Adam then lets the bf16
  # rounding steer the trajectory a little.
  assert values[0] == pytest.approx(ref_values[0], rel=1e-3)
  assert out.history[0]["grad_norm"] == pytest.approx(ref.history[0]["grad_norm"], rel=2e-2)
  np.testing.assert_allclose(values, ref_values, rtol=3e-2)
  # The caller's parameters are untouched (the loop trains and donates its own copies).
  for x, y in zip(jax.tree.leaves(params), before):
    np.testing.assert_array_equal(x, y)


# -- the same training on a mesh of 8 simulated devices -----------------------------------------


def mesh_run(workdir, mesh, max_steps_this_run=None):
  """5 SGD steps of the tabular problem with NNX params on `mesh`: (logits, spec, values)."""
  _, params = nnx.split(Logits())
  cfg = config(optimizer="sgd", learning_rate=0.5, num_steps=5, checkpoint_every=2, mesh=mesh)
  out = train.train(cfg, state_fn, params, make_problem(), workdir=workdir, progress=False,
                    max_steps_this_run=max_steps_this_run)
  logits = out.params["logits"][...]
  return np.asarray(logits), str(logits.sharding.spec), [h["value"] for h in out.history]


CHILD = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_loop
out, work = sys.argv[2], sys.argv[3]
results = {}
for name, mesh in [("4x2", dict(data=4, fsdp=2)), ("8x1", dict(data=8))]:
  logits, spec, values = test_loop.mesh_run(work + "/" + name, mesh)
  results[name], results[name + "_values"] = logits, np.asarray(values)
  print("SPEC", name, spec)
# A 4x2 run stopped after 2 steps finishes on a 2x4 mesh (the checkpoint is resharded).
test_loop.mesh_run(work + "/switch", dict(data=4, fsdp=2), max_steps_this_run=2)
logits, spec, values = test_loop.mesh_run(work + "/switch", dict(data=2, fsdp=4))
results["switch"], results["switch_values"] = logits, np.asarray(values)
# 6 task instances do not split over 4 data devices.
try:
  test_loop.train.train(test_loop.config(mesh=dict(data=4, fsdp=2)), test_loop.state_fn,
                        test_loop.nnx.split(test_loop.Logits())[1], test_loop.make_problem(n=6),
                        workdir=work + "/bad", progress=False)
except ValueError as e:
  print("BATCH_ERROR", e)
np.savez(out, **results)
"""


def test_data_parallel_and_fsdp_match_one_device(tmp_path):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  # Appended: the suite's compile flags (tests/conftest.py) carry over to the child.
  env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  out = str(tmp_path / "sharded.npz")
  proc = subprocess.Popen([sys.executable, "-c", CHILD, HERE, out, str(tmp_path)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  ref_logits, _, ref_values = mesh_run(str(tmp_path / "one"), dict(data=-1))
  stdout, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stdout + stderr[-4000:]
  # The logits' "embed" rows are split over the fsdp devices (2 of them on the 4x2 mesh).
  spec = str(jax.sharding.PartitionSpec("fsdp", "tensor"))
  assert f"SPEC 4x2 {spec}" in stdout and f"SPEC 8x1 {spec}" in stdout, stdout
  assert "BATCH_ERROR batch" in stdout and "split over 4 devices" in stdout, stdout
  sharded = np.load(out)
  assert np.abs(ref_logits).max() > 0.1
  for name in ("4x2", "8x1", "switch"):
    np.testing.assert_allclose(sharded[name], ref_logits, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(sharded[name + "_values"], ref_values, rtol=1e-6, err_msg=name)


def test_a_host_driven_function_trains_like_a_traced_one(problem, tmp_path):
  # traceable=False calls the function from Python (it may run its own compiled pieces);
  # the update is the same, so the trajectory equals the jitted one.
  calls = []

  def host_fn(params, batch):
    calls.append(1)
    v, g = jax.jit(jax.value_and_grad(lambda p: mean_return(p["logits"], batch)))(params)
    return v, g, {"regret_proxy": -v}

  params = {"logits": jnp.zeros((S, A), jnp.float32)}
  c = config(optimizer="adam", learning_rate=0.05, grad_clip_norm=1.0)
  ref = train.train(c, dict_fn, params, problem, workdir=str(tmp_path / "traced"),
                    progress=False)
  got = train.train(c, host_fn, params, problem, workdir=str(tmp_path / "host"),
                    progress=False, traceable=False)
  assert len(calls) == c.num_steps
  # float32, compiled differently: equal to rounding (Adam divides small gradients).
  np.testing.assert_allclose(got.params["logits"], ref.params["logits"], rtol=1e-5, atol=1e-6)
  assert [r["value"] for r in got.history] == pytest.approx([r["value"] for r in ref.history],
                                                             rel=1e-6)
