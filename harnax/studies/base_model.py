"""The pre-trained checkpoint of the harness-transfer study: a tiny Qwen3 that reads H0.

`build_base_model(cfg, directory)` makes, without any download, the "pre-trained model" that
the study post-trains on other harnesses (config: `configs/base_model.py`):

1. the training task instances of each family, drawn as the tabular study draws them
   (`harnax.envs.miniwob.task_split(family, num_train, num_test, seed=split_seed)[0]`; the
   held-out instances are never read);
2. a byte-level BPE tokenizer with Qwen's special tokens and chat format, trained on every
   observation of those instances under all six harnesses and both field orders, and on
   every candidate output (`harnax.models.tokenizer.train_tokenizer`);
3. a tiny Qwen3-architecture model (sizes in `cfg.model`, vocabulary = the tokenizer's);
4. transcripts of a reference policy under H0 only: episodes of the exact soft-optimal
   policy of H0 at temperature `cfg.reference_tau` (`harnax.solve_soft_bellman`), whose
   executed actions are mixed with `cfg.explore_epsilon` of the uniform reference policy so
   that off-path states appear. Every visited (non-final) state is one example: the prompt
   is its observation in the chat template with the assistant turn opened
   (`harnax.policies.lm.render_prompt`), the output a draw of the soft-optimal policy there
   (the name of its action, e.g. `click [3]`);
5. supervised next-token learning on the outputs (`harnax.train.train_sft`);
6. the model (`harnax.models.save_pretrained`), the tokenizer files and `manifest.json`
   (the config and a training summary) in one Hugging Face directory that both harnax and
   transformers load.

The directory appears atomically: everything is built in a temporary directory beside it and
renamed into place at the end, so an interrupted build leaves nothing a rerun would pick up. A
directory that already holds a build of an identical config is reused as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from typing import Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

import harnax as hx
from harnax import models
from harnax import train as train_lib
from harnax.envs import miniwob as mw
from harnax.envs.miniwob import harnesses as harnesses_lib
from harnax.models import tokenizer as tokenizer_lib
from harnax.policies import lm as lm_lib

Log = Callable[[str], None]

MANIFEST = "manifest.json"
OWNER = "build-owner.json"  # host and pid of the process writing a build folder
FORMAT = "harnax-base-model/1"


def config_dict(cfg) -> dict:
  """The config as plain JSON data (tuples as lists): what a build is identified by."""
  data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  return json.loads(json.dumps(data, sort_keys=True))


def check_config(cfg) -> None:
  """Raises ValueError naming the first field of `cfg` that is out of range."""
  if isinstance(cfg.families, str):
    raise ValueError(f"families: expected a sequence of names from {mw.FAMILIES}, got the "
                     f"string {cfg.families!r}")
  unknown = [f for f in cfg.families if f not in mw.FAMILIES]
  if not cfg.families or unknown:
    raise ValueError(f"families: expected names from {mw.FAMILIES}, got "
                     f"{list(cfg.families) if not unknown else unknown}")
  for field, value, low in (("num_train", cfg.num_train, 1), ("num_test", cfg.num_test, 0),
                            ("episodes_per_instance", cfg.episodes_per_instance, 1),
                            ("horizon", cfg.horizon, 1), ("sft.num_steps", cfg.sft.num_steps, 1),
                            ("sft.batch_size", cfg.sft.batch_size, 1)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{field}: expected an int >= {low}, got {value!r}")
  if not 0.0 <= float(cfg.discount) < 1.0:
    raise ValueError(f"discount: expected a float in [0, 1), got {cfg.discount!r}")
  if not float(cfg.reference_tau) > 0:
    raise ValueError(f"reference_tau: expected > 0, got {cfg.reference_tau!r}")
  if not 0.0 <= float(cfg.explore_epsilon) <= 1.0:
    raise ValueError(f"explore_epsilon: expected a float in [0, 1], got "
                     f"{cfg.explore_epsilon!r}")


def training_tasks(cfg) -> dict[str, tuple[mw.Task, ...]]:
  """`{family: training instances}`: the training split of the tabular study's convention."""
  return {family: mw.task_split(family, cfg.num_train, cfg.num_test, seed=cfg.split_seed)[0]
          for family in cfg.families}


def task_texts(tasks: dict[str, tuple[mw.Task, ...]], discount: float = 0.9) -> list[str]:
  """Every observation (all states, all harnesses, both field orders) and candidate output."""
  texts = set()
  for family_tasks in tasks.values():
    for task in family_tasks:
      texts.update(mw.candidate_outputs(task))
      for h in mw.HARNESSES:
        for reverse in (False, True):
          c = mw.compile_harness(task, h, discount=discount, reverse_fields=reverse)
          texts.update(c.observation(s) for s in range(c.done_state + 1))
  return sorted(texts)


def model_config(cfg, tokenizer) -> models.Qwen3Config:
  """The Qwen3 config of `cfg.model` with the tokenizer's vocabulary and special tokens."""
  m = cfg.model
  return models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
      "vocab_size": tokenizer.vocab_size, "hidden_size": m.hidden_size,
      "intermediate_size": m.intermediate_size, "num_hidden_layers": m.num_layers,
      "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
      "head_dim": m.head_dim, "max_position_embeddings": m.max_position_embeddings,
      "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
      "use_sliding_window": False, "tie_word_embeddings": bool(m.tie_word_embeddings),
      "rope_parameters": {"rope_type": "default", "rope_theta": float(m.rope_theta)},
      "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
      "pad_token_id": tokenizer.pad_token_id})


def init_model(model_cfg: models.Qwen3Config, *, seed: int, init_std: float,
               qk_norm_init: float = 1.0):
  """A fresh model whose embeddings and kernels are normal with standard deviation `init_std`.

  Qwen's own 0.02 suits wide models; a model this narrow leaves the plateau of its first steps
  (outputs that ignore the prompt) much sooner from weights nearer `1 / sqrt(hidden)`
  (measured on the default config: after 1000 SFT steps of 8 sequences, loss 0.08 per output
  token from 0.16 against 0.24 from 0.02). Drawn with NumPy (`seed`) into the abstract model,
  so initialization compiles nothing.

  Norm weights start at one, the query and key norms' at `qk_norm_init`. Why the second: with
  QK-norm an attention logit is at most ``g_q · g_k · sqrt(head_dim)`` (unit-RMS queries and
  keys scaled by the norm weights), 5.7 for 32-dim heads at weights one. Over a context of a
  few hundred tokens that cannot put most of a head's weight on one position, which copying a
  name from the context needs, and the weights grow only slowly in training.
  """
  if not float(init_std) > 0:
    raise ValueError(f"model.init_std: expected > 0, got {init_std!r}")
  if not float(qk_norm_init) > 0:
    raise ValueError(f"model.qk_norm_init: expected > 0, got {qk_norm_init!r}")
  if model_cfg.norm_style != "scale":
    raise ValueError(f"model_cfg.norm_style: expected 'scale' (norm weights start at one), got "
                     f"{model_cfg.norm_style!r}")
  graphdef, state = nnx.split(models.abstract_model(model_cfg))
  rng = np.random.default_rng(seed)
  leaves = []
  for path, var in nnx.to_flat_state(state):
    shape, dtype = var.get_value().shape, var.get_value().dtype
    if path[-1] in ("kernel", "embedding"):
      value = float(init_std) * rng.standard_normal(shape, np.float32)
    elif path[-1] == "weight" and any(p in ("q_norm", "k_norm") for p in path):
      value = np.full(shape, float(qk_norm_init), np.float32)
    elif path[-1] == "weight":                                          # RMSNorm scales
      value = np.ones(shape, np.float32)
    else:
      raise ValueError(f"model: no initialization rule for parameter {path}")
    leaves.append((path, var.replace(value=jnp.asarray(value, dtype))))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def padded_h0(compiled: list[mw.CompiledHarness]) -> tuple[hx.TabularMDP, np.ndarray]:
  """The H0 MDPs and reference policies of several instances stacked at one shape `[N, S, A]`.

  Padding states are absorbing (self-loops, reward 0) and unreachable, with `wait` as their
  only reference action; padding actions are unavailable (`pi_ref = 0`, self-loops). Neither
  changes the soft-optimal policy of a real state or any episode.
  """
  s_max = max(c.harness.num_states for c in compiled)
  a_max = max(c.harness.num_actions for c in compiled)
  dtype = np.asarray(compiled[0].harness.mdp.rewards).dtype
  n = len(compiled)
  p = np.zeros((n, s_max, a_max, s_max), dtype)
  p[:, np.arange(s_max), :, np.arange(s_max)] = 1.0
  r = np.zeros((n, s_max, a_max), dtype)
  mu0 = np.zeros((n, s_max), dtype)
  ref = np.zeros((n, s_max, a_max), dtype)
  ref[:, :, harnesses_lib.WAIT] = 1.0
  gamma = np.zeros(n, dtype)
  for i, c in enumerate(compiled):
    h = c.harness
    s, a = h.num_states, h.num_actions
    p[i, :s, :a] = 0.0
    p[i, :s, :a, :s] = np.asarray(h.mdp.transitions)
    r[i, :s, :a] = np.asarray(h.mdp.rewards)
    mu0[i, :s] = np.asarray(h.mdp.initial)
    ref[i, :s] = 0.0
    ref[i, :s, :a] = np.asarray(h.pi_ref)
    gamma[i] = np.asarray(h.mdp.discount)
  mdp = hx.TabularMDP(transitions=p, rewards=r, discount=gamma, initial=mu0)
  return mdp, ref


@jax.jit
def _soft_optimal(mdp, pi_ref, tau):
  return jax.vmap(lambda m, r: hx.solve_soft_bellman(m, r, tau).policy)(mdp, pi_ref)


def reference_policies(compiled: list[mw.CompiledHarness], tau: float) -> list[np.ndarray]:
  """The exact soft-optimal policy `[S_i, A_i]` (float64) of each compiled harness at `tau`.

  All are solved in one vmapped `hx.solve_soft_bellman` on the padded batch (`padded_h0`),
  so a set of instances of different sizes costs one compilation.
  """
  mdp, pi_ref = padded_h0(compiled)
  policy = np.asarray(_soft_optimal(mdp, pi_ref, np.asarray(tau, pi_ref.dtype)), np.float64)
  return [policy[i, :c.harness.num_states, :c.harness.num_actions]
          for i, c in enumerate(compiled)]


def sample_states(rng: np.random.Generator, mdp: hx.TabularMDP, policy: np.ndarray, *,
                  num_envs: int, num_steps: int) -> np.ndarray:
  """int `[N, num_envs, num_steps]`: the states `s_0 .. s_{T-1}` of episodes of a policy.

  `mdp` and `policy` `[N, S, A]` are batches of `N` problems; `s_0 ~ mu0`,
  `a_t ~ policy(.|s_t)`, `s_{t+1} ~ P(.|s_t, a_t)`, each by inversion of one uniform, all
  environments of all problems at once (NumPy: no compilation for a few thousand steps).
  """
  p = np.asarray(mdp.transitions, np.float64)
  n = p.shape[0]
  rows = np.arange(n)[:, None]

  def draw(probs):  # [N, E, K] -> [N, E]; zero entries are never drawn
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1])[..., None] * cdf[..., -1:]
    last = probs.shape[-1] - 1 - np.argmax(probs[..., ::-1] > 0, axis=-1)
    return np.minimum(np.sum(cdf <= u, axis=-1), last)

  s = draw(np.broadcast_to(np.asarray(mdp.initial, np.float64)[:, None],
                           (n, num_envs, p.shape[1])))
  out = np.zeros((n, num_envs, num_steps), np.int64)
  for t in range(num_steps):
    out[:, :, t] = s
    a = draw(policy[rows, s])
    s = draw(p[rows, s, a])
  return out


def transcripts(cfg, tasks: dict[str, tuple[mw.Task, ...]]) -> list[tuple[int, str, str]]:
  """The H0 examples `(family index, observation, output)` of every training instance.

  For each instance, `cfg.episodes_per_instance` episodes of `cfg.horizon` steps under
  `(1 - eps) pi* + eps pi_ref` (`sample_states`), with `pi*` the exact soft-optimal policy at
  `cfg.reference_tau` (`hx.solve_soft_bellman`, all instances in one vmapped solve, padded to
  one shape); each visited state before the end gives one example, its output drawn from
  `pi*` at that state (the name of the drawn action). Episodes and draws come from a NumPy
  generator seeded with `cfg.seed`.
  """
  compiled = [mw.compile_harness(task, "H0", discount=cfg.discount)
              for family in cfg.families for task in tasks[family]]
  family_of = [f for f, family in enumerate(cfg.families) for _ in tasks[family]]
  mdp, pi_ref = padded_h0(compiled)
  tau = np.asarray(cfg.reference_tau, pi_ref.dtype)
  pi_star = np.asarray(_soft_optimal(mdp, pi_ref, tau), np.float64)       # [N, S, A], padded
  eps = float(cfg.explore_epsilon)
  behavior = (1.0 - eps) * pi_star + eps * np.asarray(pi_ref, np.float64)
  rng = np.random.default_rng(int(cfg.seed))
  states = sample_states(rng, mdp, behavior, num_envs=int(cfg.episodes_per_instance),
                         num_steps=int(cfg.horizon))
  out = []
  for i, c in enumerate(compiled):
    pol = np.asarray(pi_star[i], np.float64)
    for s in np.asarray(states[i]).reshape(-1):
      if s == c.done_state:
        continue
      a = int(rng.choice(pol.shape[1], p=pol[s] / pol[s].sum()))
      out.append((family_of[i], c.observation(int(s)), c.actions[a].name))
  return out


def _read_manifest(directory: str) -> dict | None:
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def is_built(directory: str, cfg) -> bool:
  """Whether `directory` holds a complete base model built from a config equal to `cfg`."""
  manifest = _read_manifest(directory)
  return manifest is not None and manifest.get("config") == config_dict(cfg)


def build_base_model(cfg, directory: str, *, log: Log | None = None) -> str:
  """Builds (or reuses) the base model of `cfg` in `directory`; returns `directory`.

  Args:
    cfg: a `configs/base_model.py` config.
    directory: the Hugging Face model directory to write (`config.json`,
      `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`, `manifest.json`).
      Reused as it is when it holds a build of an identical config; replaced when it holds
      a build of another config; an error when it holds anything else.
    log: receives progress lines.

  Returns:
    `directory` as an absolute path.

  Raises:
    ValueError: a config field out of range (named), or `directory` exists and is not a
      base-model directory.
  """
  check_config(cfg)
  directory = os.path.abspath(directory)
  say = log or (lambda line: None)
  if is_built(directory, cfg):
    say(f"base model: reusing {directory} (identical config)")
    return directory
  if os.path.exists(directory) and (not os.path.isdir(directory) or (
      os.listdir(directory) and _read_manifest(directory) is None)):
    raise ValueError(f"directory: {directory} exists and is not a base-model directory (no "
                     f"{MANIFEST}); refusing to replace it")
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  remove_stale_builds(directory, log=say)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.build-", dir=parent)
  with open(os.path.join(tmp, OWNER), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)
  try:
    summary = _build(cfg, tmp, say)
    with open(os.path.join(tmp, MANIFEST), "w") as f:
      json.dump({"format": FORMAT, "config": config_dict(cfg), **summary}, f, indent=2,
                sort_keys=True)
    os.remove(os.path.join(tmp, OWNER))  # complete: the folder is the model now
    _install(tmp, directory, cfg)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  say(f"base model: wrote {directory} in {summary['seconds']:.1f} s")
  return directory


def _process_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, owned by another user
    return True
  return True


def remove_stale_builds(directory: str, *, log: Log | None = None,
                        max_age_s: float = 3600.0) -> list[str]:
  """Removes the hidden build folders a killed build left beside `directory`; returns them.

  A build works in `.<name>.build-*` and renames it into place when complete, so a build
  killed with SIGKILL leaves that folder behind (never mistaken for a model: resume looks
  only at `directory`). One is stale when its owner (host, pid in `build-owner.json`) is
  this host and that process is gone, or, without an owner file (and for the `.old-*`
  folder an install moves aside for an instant), when untouched for `max_age_s` seconds.
  A build still running, here or on another host sharing the folder, is left alone.
  """
  parent, name = os.path.split(os.path.abspath(directory))
  removed = []
  for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
    if not entry.startswith((f".{name}.build-", f".{name}.old-")):
      continue
    path = os.path.join(parent, entry)
    try:
      with open(os.path.join(path, OWNER)) as f:
        owner = json.load(f)
      stale = (owner.get("host") == socket.gethostname()
               and not _process_alive(int(owner["pid"])))
    except (OSError, ValueError, KeyError, TypeError):
      try:
        stale = time.time() - os.path.getmtime(path) > max_age_s
      except OSError:  # removed meanwhile
        continue
    if stale:
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
      if log is not None:
        log(f"base model: removed {path}, left by an interrupted build")
  return removed


def _install(tmp: str, directory: str, cfg) -> None:
  """Renames the finished build `tmp` to `directory`, replacing an older build there."""
  old = None
  if os.path.exists(directory):
    if is_built(directory, cfg):  # a concurrent build of the same config finished first
      return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-",
                           dir=os.path.dirname(directory))
    os.rmdir(old)
    os.rename(directory, old)
  try:
    os.rename(tmp, directory)
  except OSError:
    if not is_built(directory, cfg):
      raise
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def _build(cfg, path: str, say: Log) -> dict:
  t0 = time.time()
  tasks = training_tasks(cfg)
  texts = task_texts(tasks, cfg.discount)
  tok = tokenizer_lib.train_tokenizer(texts, path, vocab_size=int(cfg.tokenizer.vocab_size),
                                      min_frequency=int(cfg.tokenizer.min_frequency))
  say(f"base model: tokenizer of {tok.vocab_size} tokens from {len(texts)} texts "
      f"({time.time() - t0:.1f} s)")

  examples = transcripts(cfg, tasks)
  prompts = [lm_lib.render_prompt(tok, obs) for _, obs, _ in examples]
  data = train_lib.encode_examples(tok, prompts, [o for _, _, o in examples])
  model_cfg = model_config(cfg, tok)
  if data.ids.shape[1] > model_cfg.max_position_embeddings:
    raise ValueError(f"model.max_position_embeddings: {model_cfg.max_position_embeddings} is "
                     f"shorter than the longest example ({data.ids.shape[1]} tokens)")
  model = init_model(model_cfg, seed=int(cfg.seed), init_std=float(cfg.model.init_std))
  say(f"base model: {models.param_count(model)} parameters, {data.num_examples} examples of "
      f"at most {data.ids.shape[1]} tokens ({time.time() - t0:.1f} s)")

  t_sft = time.time()
  s = cfg.sft
  result = train_lib.train_sft(
      model, data, num_steps=int(s.num_steps), batch_size=int(s.batch_size),
      learning_rate=float(s.learning_rate), warmup_steps=int(s.warmup_steps),
      weight_decay=float(s.weight_decay), clip_norm=s.clip_norm, seed=int(cfg.seed), log=say,
      log_every=max(1, int(s.num_steps) // 5))
  sft_seconds = time.time() - t_sft
  models.save_pretrained(result.model, path)
  tail = result.losses[-max(1, len(result.losses) // 10):]
  counts = np.bincount([f for f, _, _ in examples], minlength=len(cfg.families))
  return {
      "tokenizer": {"vocab_size": tok.vocab_size, "num_texts": len(texts)},
      "model": {"num_params": int(models.param_count(result.model)),
                "vocab_size": model_cfg.vocab_size},
      "training": {
          "num_examples": data.num_examples,
          "examples_per_family": dict(zip(cfg.families, counts.tolist())),
          "max_length": int(data.ids.shape[1]),
          "num_steps": int(s.num_steps),
          "initial_loss": float(result.losses[0]),         # the first batch's loss
          "final_loss": float(np.mean(tail)),              # mean batch loss, last 10 % of steps
          "losses": [float(x) for x in result.losses[::max(1, len(result.losses) // 50)]],
          "seconds": sft_seconds},
      "train_instances": {family: [repr(t) for t in ts] for family, ts in tasks.items()},
      "seconds": time.time() - t0,
  }
