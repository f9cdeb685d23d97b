"""The base model build (micro config): HF directory, reuse, atomic writes, a real H0 readout."""

import importlib.util
import json
import os
import time

from flax import nnx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harnax import models  # noqa: E402
from harnax.envs import miniwob as mw  # noqa: E402
from harnax.policies import lm  # noqa: E402
from harnax.studies import base_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(variant="micro"):
  spec = importlib.util.spec_from_file_location("cfg_base_model",
                                                os.path.join(ROOT, "configs", "base_model.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  cfg = _config()
  directory = str(tmp_path_factory.mktemp("base") / "model")
  lines = []
  t0 = time.time()
  assert base_model.build_base_model(cfg, directory, log=lines.append) == directory
  return cfg, directory, lines, time.time() - t0


def test_directory_and_manifest(built):
  cfg, directory, lines, _ = built
  files = sorted(os.listdir(directory))
  assert files == ["config.json", "manifest.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json"]
  assert not [f for f in os.listdir(os.path.dirname(directory)) if f.startswith(".")]
  with open(os.path.join(directory, "manifest.json")) as f:
    manifest = json.load(f)
  assert manifest["config"] == json.loads(json.dumps(cfg.to_dict()))
  training = manifest["training"]
  assert training["num_examples"] == sum(training["examples_per_family"].values()) > 0
  assert training["final_loss"] < 0.5 * training["initial_loss"]
  # Only the training split of every family, never a held-out instance.
  for family in cfg.families:
    train, test = mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)
    assert manifest["train_instances"][family] == [repr(t) for t in train]
    assert not set(manifest["train_instances"][family]) & {repr(t) for t in test}
  assert any("sft step" in line for line in lines)


def test_loads_in_harnax_and_transformers_with_equal_logits(built):
  cfg, directory, _, _ = built
  ours = models.load_pretrained(directory)
  tok = models.Tokenizer.from_dir(directory)
  ref = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
  ref_tok = transformers.AutoTokenizer.from_pretrained(directory)
  assert ours.config.vocab_size == tok.vocab_size == len(ref_tok)
  assert ref.config.model_type == "qwen3"
  assert models.param_count(ours) == sum(p.numel() for p in ref.parameters())
  task = base_model.training_tasks(cfg)["click-option"][0]
  c = mw.compile_harness(task, "H0")
  prompt = lm.render_prompt(tok, c.observation(1)) + "click [2]"
  ids = tok.encode(prompt, add_special_tokens=False)
  assert ids == ref_tok.encode(prompt, add_special_tokens=False)
  logits = np.asarray(models.forward(ours, np.asarray([ids], np.int32)))
  with torch.no_grad():
    expected = ref(input_ids=torch.tensor([ids])).logits.float().numpy()
  np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)


def test_identical_config_is_reused(built):
  cfg, directory, _, _ = built
  model_file = os.path.join(directory, "model.safetensors")
  stamp = os.stat(model_file).st_mtime_ns
  lines = []
  t0 = time.time()
  assert base_model.build_base_model(cfg, directory, log=lines.append) == directory
  assert time.time() - t0 < 2.0
  assert os.stat(model_file).st_mtime_ns == stamp
  assert lines and "reusing" in lines[0]
  other = _config()
  other.sft.num_steps += 1
  assert base_model.is_built(directory, cfg) and not base_model.is_built(directory, other)


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
  cfg = _config()
  directory = str(tmp_path / "model")

  def crash(cfg, path, say):
    with open(os.path.join(path, "config.json"), "w") as f:
      f.write("{}")  # a half-written build
    raise KeyboardInterrupt

  monkeypatch.setattr(base_model, "_build", crash)
  with pytest.raises(KeyboardInterrupt):
    base_model.build_base_model(cfg, directory)
  assert os.listdir(tmp_path) == []


def test_folders_of_killed_builds_are_removed_and_running_ones_kept(tmp_path):
  import socket
  import subprocess
  done = subprocess.Popen(["true"])
  done.wait()  # a process that has exited: its pid is free
  here = socket.gethostname()
  owners = {".model.build-killed": (here, done.pid), ".model.build-running": (here, os.getpid()),
            ".model.build-other-host": ("another-host", done.pid), ".model.build-fresh": None,
            ".model.old-forgotten": None, ".other.build-killed": (here, done.pid)}
  for name, owner in owners.items():
    os.makedirs(tmp_path / name)
    if owner is not None:
      (tmp_path / name / base_model.OWNER).write_text(
          json.dumps({"host": owner[0], "pid": owner[1]}))
  two_hours_ago = time.time() - 7200
  os.utime(tmp_path / ".model.old-forgotten", (two_hours_ago, two_hours_ago))
  removed = base_model.remove_stale_builds(str(tmp_path / "model"))
  assert sorted(os.path.basename(p) for p in removed) == [".model.build-killed",
                                                          ".model.old-forgotten"]
  assert sorted(os.listdir(tmp_path)) == [".model.build-fresh", ".model.build-other-host",
                                          ".model.build-running", ".other.build-killed"]


def test_bad_input(tmp_path):
  cfg = _config()
  cfg.families = ("click-checkboxes", "click-nothing")
  with pytest.raises(ValueError, match="families.*click-nothing"):
    base_model.build_base_model(cfg, str(tmp_path / "a"))
  cfg = _config()
  cfg.explore_epsilon = 1.5
  with pytest.raises(ValueError, match="explore_epsilon"):
    base_model.build_base_model(cfg, str(tmp_path / "a"))
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "notes.txt").write_text("not a model")
  with pytest.raises(ValueError, match="directory"):
    base_model.build_base_model(_config(), str(tmp_path / "b"))
  with pytest.raises(ValueError, match="variant"):
    _config("huge")


def test_init_model_sets_the_query_and_key_norms_apart():
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 40,
      "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
      "max_position_embeddings": 32, "tie_word_embeddings": True})
  model = base_model.init_model(cfg, seed=0, init_std=0.1, qk_norm_init=2.5)
  flat = {tuple(str(p) for p in path): np.asarray(v.get_value())
          for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  qk = [v for path, v in flat.items() if {"q_norm", "k_norm"} & set(path)]
  other = [v for path, v in flat.items() if path[-1] == "weight" and not {"q_norm", "k_norm"}
           & set(path)]
  assert len(qk) == 4 and all(np.all(v == 2.5) for v in qk)
  assert len(other) == 5 and all(np.all(v == 1.0) for v in other)  # 2 per layer + the final
  same = base_model.init_model(cfg, seed=0, init_std=0.1)
  assert all(np.all(np.asarray(v.get_value()) == 1.0)
             for path, v in nnx.to_flat_state(nnx.state(same, nnx.Param)) if path[-1] == "weight")
  with pytest.raises(ValueError, match="qk_norm_init"):
    base_model.init_model(cfg, seed=0, init_std=0.1, qk_norm_init=0.0)


def _soft_optimal_numpy(h, tau, iters=600):
  """Soft value iteration in float64 on one instance (no padding): pi_ref exp((Q - V) / tau)."""
  p = np.asarray(h.mdp.transitions, np.float64)
  r = np.asarray(h.mdp.rewards, np.float64)
  ref = np.asarray(h.pi_ref, np.float64)
  gamma = float(h.mdp.discount)
  v = np.zeros(p.shape[0])
  for _ in range(iters):
    q = r + gamma * p @ v
    m = np.max(np.where(ref > 0, q, -np.inf), axis=1)
    v = m + tau * np.log(np.sum(ref * np.exp((q - m[:, None]) / tau), axis=1))
  return ref * np.exp((q - v[:, None]) / tau)


def test_reference_policies_match_numpy_soft_value_iteration(built):
  cfg, _, _, _ = built
  compiled = [mw.compile_harness(t, "H0", discount=cfg.discount)
              for ts in base_model.training_tasks(cfg).values() for t in ts]
  policies = base_model.reference_policies(compiled, cfg.reference_tau)   # padded, one solve
  for c, pi in zip(compiled, policies):
    assert pi.shape == (c.harness.num_states, c.harness.num_actions)
    np.testing.assert_allclose(pi, _soft_optimal_numpy(c.harness, cfg.reference_tau),
                               atol=2e-4)


def test_greedy_output_matches_the_reference_far_above_chance(built):
  """Over every non-final H0 state of the training instances: the model's most likely
  candidate output decodes to an action the soft-optimal policy takes (an argmax action),
  far more often than a uniformly random available action would (measured on this micro
  build: 0.63 against 0.34)."""
  cfg, directory, _, _ = built
  model = models.load_pretrained(directory)
  tok = models.Tokenizer.from_dir(directory)
  compiled = [mw.compile_harness(t, "H0", discount=cfg.discount)
              for ts in base_model.training_tasks(cfg).values() for t in ts]
  prompts, outputs, rows = [], [], []
  for i, c in enumerate(compiled):
    for s in range(c.done_state):
      prompts.append(lm.render_prompt(tok, c.observation(s)))
      outputs.append(c.outputs)
      rows.append((i, s))
  tokens = lm.encode_candidates(tok, prompts, outputs)
  score_fn, params = lm.split_model(model)
  log_probs = np.asarray(lm.score_in_chunks(score_fn, params, lm.pack_candidates(tokens),
                                            micro_batch=32))
  hits, chance = [], []
  policies = base_model.reference_policies(compiled, cfg.reference_tau)
  for r, (i, s) in enumerate(rows):
    h = compiled[i].harness
    pi = policies[i][s]
    best = pi >= 0.9 * pi.max()                      # the reference's (tied) argmax actions
    action = int(np.asarray(h.decode_table)[s, int(np.argmax(log_probs[r]))])
    hits.append(action >= 0 and bool(best[action]))
    available = np.asarray(h.pi_ref)[s] > 0
    chance.append(best[available].sum() / available.sum())
  hits, chance = np.mean(hits), np.mean(chance)
  assert hits > chance + 0.15 and hits > 1.5 * chance, (hits, chance)
  # Its outputs are well formed: little mass outside the candidates (the catch-all).
  assert np.mean(np.exp(log_probs).sum(-1)) > 0.8
