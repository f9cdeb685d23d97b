"""The exact policy-gradient step of a language model behind a harness: harnax vs torch.

One step scores every candidate output of a batch of states (`score_rows`, no gradient kept)
and pulls a fixed random cotangent `G [R, O]` back through the model (`pullback`: the gradient
of `sum(G * log p_theta)`, one micro-batch of states at a time), compiled once as one program.
This is `harnax.policies.lm.exact_value_and_grad` with the tabular objective replaced by a
fixed `G`, so the step measures the model passes only.

The workload: the MiniWoB++ click-checkboxes family under harness H5 (the first training
instances of `task_split("click-checkboxes", 4, 3, seed=0)`, their states in order), prompts
rendered with the chat template of a byte-level BPE tokenizer trained here on the
observations (`harnax.models.tokenizer.train_tokenizer`, no download), every candidate
(`click [1] [3] [4]`, ...) scored with its end token. Random-weight Qwen3 models: `tiny`
(hidden 64, 2 layers) and `small` (hidden 256, 4 layers), float32.

Measured, each configuration in its own subprocess (peak RSS is its own):

1. harnax's three scorers on the same states: `tree` (prompt + prefix tree of the
   candidates, one packed sequence per state), `cache` (one prefill per prompt, candidates
   continue from copies of its KV cache) and `unshared` (one full forward per (prompt,
   candidate));
2. harnax `tree` against the same prefix-tree scoring written with transformers
   (`Qwen3ForCausalLM` loaded from the harnax checkpoint: identical weights; the tree given
   as a 4-D mask over the packed row, the only way a transformers model takes one, where
   harnax's `CausalLM.tree_hidden_states` computes only the blocks the tree needs) and
   torch on CPU, eager, at the same thread count (`--threads`, default 1 and all cores; below the
   core count the process is bound to that many cores, so XLA's pool matches
   `torch.set_num_threads`). The two are timed alternately in one process, so both see the
   same machine load, after checking that their log-probs and gradients agree; the
   one-thread run also profiles one step of each (time per kind of op);
3. harnax `tree` against the micro-batch size: candidate tokens per second and peak RSS.

Timings: AOT `jax.jit(...).lower(...).compile()` (compile time listed separately), one
warm-up step, then the median (and the minimum) of `--repeats` steps. Progress goes to
stderr, the report to `--out` (default `benchmarks/results/lm_policy_gradient.md`).

Usage::

  python benchmarks/lm_policy_gradient.py            # full run, about 10 minutes on 2 cores
  python benchmarks/lm_policy_gradient.py --quick --out results/lm_pg.md   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

import children  # benchmarks/children.py (this folder is on sys.path when run as a script)
import memory  # benchmarks/memory.py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "lm_policy_gradient.md")

SIZES = children.SIZES
METHODS = ("tree", "cache", "unshared")
FULL = dict(sizes=["tiny", "small"], states=32, micro_batch=8, small_states=16,
            sweep_states=128, sweep=[8, 16, 32, 64, 128], repeats=5, slow_repeats=3,
            sweep_repeats=3, threads=None, instances=4, vocab=512)
QUICK = dict(sizes=["quick"], states=2, micro_batch=1, small_states=2, sweep_states=2,
             sweep=[1, 2], repeats=1, slow_repeats=1, sweep_repeats=1, threads=[1], instances=1,
             vocab=512)
TARGET_UNSHARED = 3.0
TARGET_TORCH = 1.0
_START = time.perf_counter()


def log(msg: str) -> None:
  """One progress line on stderr (the report goes to a file)."""
  print(f"[{time.perf_counter() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- the workload (parent process) ----------------------------------------------------------


def build_workload(directory: str, *, instances: int, states: int, vocab: int,
                   sizes: list[str]) -> dict:
  """Tokenizer, token arrays of the first `states` states and the models, under `directory`.

  Writes `tokens.npz` (the `CandidateTokens` arrays) and one Hugging Face checkpoint per
  size (`models.save_pretrained`, read by both frameworks). Returns the workload's shape.
  """
  from harnax import models
  from harnax.envs import miniwob as mw
  from harnax.models import tokenizer as tokenizer_lib
  from harnax.policies import lm

  train, _ = mw.task_split("click-checkboxes", 4, 3, seed=0)
  compiled = [mw.compile_harness(task, "H5") for task in train[:instances]]
  texts = sorted({c.observation(s) for c in compiled for s in range(c.harness.num_states)}
                 | {o for c in compiled for o in c.outputs})
  tok = tokenizer_lib.train_tokenizer(texts, os.path.join(directory, "tokenizer"),
                                      vocab_size=vocab)
  prompts, outputs = [], []
  for c in compiled:
    for s in range(c.harness.num_states):
      prompts.append(lm.render_prompt(tok, c.observation(s)))
      outputs.append(list(c.outputs))
  if len(prompts) < states:
    raise ValueError(f"--states: the {len(compiled)} instance(s) have {len(prompts)} states, "
                     f"fewer than {states}")
  tokens = lm.encode_candidates(tok, prompts[:states], outputs[:states])
  arrays = {k: np.asarray(getattr(tokens, k)) for k in ("prompt_ids", "prompt_mask",
                                                        "output_ids", "output_mask")}
  np.savez(os.path.join(directory, "tokens.npz"), **arrays)
  t0 = time.perf_counter()
  tree = lm.pack_candidates(tokens)
  pack_s = time.perf_counter() - t0
  info = dict(
      vocab=int(tok.vocab_size), states=states, instances=len(compiled),
      instance_states=[int(c.harness.num_states) for c in compiled],
      candidates=int(tokens.num_outputs), prompt_length=int(tokens.prompt_ids.shape[-1]),
      prompt_mean=float(arrays["prompt_mask"].sum(-1).mean()),
      output_length=int(tokens.output_ids.shape[-1]),
      output_mean=float(arrays["output_mask"].sum(-1)[arrays["output_mask"].any(-1)].mean()),
      candidate_tokens=int(arrays["output_mask"].sum()),
      nodes=int(tree.node_ids.shape[-1]), nodes_mean=float(np.asarray(tree.node_mask).sum(-1)
                                                           .mean()),
      pack_ms_per_state=1e3 * pack_s / states, params={})
  for size in sizes:
    cfg = models.Qwen3Config.from_hf_dict(dict(
        SIZES[size], architectures=["Qwen3ForCausalLM"], model_type="qwen3",
        vocab_size=tok.vocab_size, max_position_embeddings=1024, rms_norm_eps=1e-6,
        hidden_act="silu", attention_bias=False, use_sliding_window=False,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model = models.from_config(cfg, seed=0)
    models.save_pretrained(model, os.path.join(directory, size))
    info["params"][size] = int(models.param_count(model))
  return info


# -- harnax (child process) ------------------------------------------------------------------


def _load_tokens(directory: str, states: int):
  from harnax.policies import lm
  with np.load(os.path.join(directory, "tokens.npz")) as z:
    arrays = {k: z[k][:states] for k in z.files}
  return lm.CandidateTokens(**arrays)


def _cotangent(states: int, candidates: int) -> np.ndarray:
  """The fixed random cotangent `G [R, O]` (the same in both frameworks)."""
  return np.random.RandomState(0).randn(states, candidates).astype(np.float32)


def harnax_step(directory: str, size: str, method: str, states: int, micro_batch: int):
  """`(run, compile_s, tokens, compiled)`: `run()` is one step `-> (log_probs, grads)`."""
  import jax
  import jax.numpy as jnp

  from harnax import models
  from harnax.policies import lm

  model = models.load_pretrained(os.path.join(directory, size))
  tokens = _load_tokens(directory, states)
  score_fn, params = lm.split_model(model, method=method)
  inputs = lm.pack_candidates(tokens) if method == "tree" else tokens
  g = jnp.asarray(_cotangent(states, tokens.num_outputs))

  def step(params, inputs, g):
    log_probs = lm.score_rows(score_fn, params, inputs, micro_batch=micro_batch)
    grads = lm.pullback(score_fn, params, inputs, g, micro_batch=micro_batch)
    return log_probs, grads

  args = (params, inputs, g)
  t0 = time.perf_counter()
  compiled = jax.jit(step).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  return (lambda: jax.block_until_ready(compiled(*args))), compile_s, tokens, compiled


def _positions(method: str, tokens, nodes: int) -> int:
  """Model positions (padded) one step runs through the model, per forward pass."""
  r, tp = tokens.prompt_ids.shape
  o, tc = tokens.output_ids.shape[-2:]
  return {"tree": r * (tp + nodes), "cache": r * tp + r * o * tc,
          "unshared": r * o * (tp + tc)}[method]


def measure_harnax(directory: str, size: str, method: str, states: int, micro_batch: int,
                   repeats: int, slow_repeats: int) -> dict:
  """One harnax configuration: compile time, step times, peak RSS."""
  import jax.numpy as jnp
  jnp.zeros(1).block_until_ready()  # start the runtime
  out = {"runtime_rss_mb": memory.rss_mb()}
  run, out["compile_s"], tokens, _ = harnax_step(directory, size, method, states, micro_batch)
  out["loaded_rss_mb"] = memory.rss_mb()
  t0 = time.perf_counter()
  run()
  warm = time.perf_counter() - t0
  n = repeats if warm < 10.0 else min(repeats, slow_repeats)
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  from harnax.policies import lm
  nodes = lm.pack_candidates(tokens).node_ids.shape[-1]
  out.update(times=times, median_s=statistics.median(times), min_s=min(times),
             peak_mb=memory.peak_rss_mb(), positions=_positions(method, tokens, nodes),
             candidate_tokens=int(np.asarray(tokens.output_mask).sum()))
  return out


# -- where the time goes (one thread) ----------------------------------------------------------

CATEGORIES = ("matmuls", "attention kernel", "transposes & copies", "gather / scatter",
              "elementwise & reductions")
TOP_OPS = 6


def _hlo_kinds(hlo: str) -> dict[str, tuple[str | None, str]]:
  """Each instruction of an optimized HLO module -> `(category, op name)`: a category of
  `CATEGORIES` (None for control flow, whose time is its children's) and the jax op it
  comes from (its `op_name` metadata, the enclosing jit/loop/call scopes dropped)."""
  bodies, opcodes, calls, names, current = {}, {}, {}, {}, None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if head:
      current = head.group(1)
      bodies[current] = []
      continue
    inst = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$", line)
    if inst and current is not None:
      name, rest = inst.groups()
      bodies[current].append(line)
      op = re.search(r"\b([a-z][a-z0-9\-]*)\(", rest)
      opcodes[name] = op.group(1) if op else ""
      called = re.search(r"calls=%?([\w.\-]+)", rest)
      if called:
        calls[name] = called.group(1)
      op_name = re.search(r'op_name="([^"]*)"', rest)
      scopes = op_name.group(1).split("/") if op_name else [name]
      names[name] = "/".join(x for x in scopes if not re.match(
          r"^(jit\(step\)|while|body|cond|closed_call|checkpoint)$", x)) or name

  def kind(name: str, opcode: str):
    if opcode in ("while", "call", "conditional", "parameter", "tuple", "get-tuple-element",
                  "constant", "bitcast"):
      return None
    text = "\n".join(bodies.get(calls.get(name, ""), [])) if opcode == "fusion" else opcode + "("
    if re.search(r"\b(dot|convolution)\(", text):
      return "matmuls"
    if re.search(r"\b(gather|scatter|dynamic-slice|dynamic-update-slice)\(", text):
      return "gather / scatter"
    if re.search(r"\b(transpose|copy)\(", text) or name.startswith("copy"):
      return "transposes & copies"
    return "elementwise & reductions"

  return {name: (kind(name, op), names[name]) for name, op in opcodes.items()}


def _summary(items: dict[tuple[str, str], float], wall: float) -> dict:
  """Seconds per category and the largest `(op, category, seconds)` items."""
  out = dict.fromkeys(CATEGORIES, 0.0)
  for (category, _), seconds in items.items():
    out[category] += seconds
  top = sorted(items.items(), key=lambda kv: -kv[1])[:TOP_OPS]
  return dict(out, wall=wall, top=[(op, category, seconds) for (category, op), seconds in top])


def harnax_breakdown(run, compiled) -> dict:
  """Seconds per category of one step, from a jax profiler trace of its XLA thunks."""
  import glob
  import gzip

  import jax

  kinds = _hlo_kinds(compiled.as_text())
  with tempfile.TemporaryDirectory(prefix="lm_pg_trace_") as directory:
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    jax.profiler.stop_trace()
    [path] = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  items: dict = {}
  for e in events:
    category, op = kinds.get(e.get("name"), (None, "")) if e.get("ph") == "X" else (None, "")
    if category:
      items[(category, op)] = items.get((category, op), 0.0) + e.get("dur", 0) / 1e6
  return _summary(items, wall)


def torch_breakdown(run) -> dict:
  """Seconds per category of one step, from the torch profiler's self CPU times."""
  from torch import profiler

  with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
  items: dict = {}
  for e in prof.key_averages():
    name = e.key.split("::")[-1]
    if name in ("mm", "addmm", "bmm", "baddbmm", "dot", "matmul", "linear"):
      category = "matmuls"
    elif "scaled_dot_product" in name or "flash_attention" in name:
      category = "attention kernel"
    elif name in ("copy_", "clone", "contiguous", "cat", "_to_copy", "transpose", "t",
                  "permute", "reshape", "view", "expand", "_unsafe_view", "as_strided"):
      category = "transposes & copies"
    elif ("gather" in name or "scatter" in name or "index" in name or "embedding" in name
          or name in ("slice", "select")):
      category = "gather / scatter"
    else:
      category = "elementwise & reductions"
    items[(category, e.key)] = items.get((category, e.key), 0.0) + e.self_cpu_time_total / 1e6
  return _summary(items, wall)


# -- torch (child process) -------------------------------------------------------------------


def torch_tree_scorer(model, tree, torch):
  """`rows -> [rows, O]` log-probs: harnax's packed prefix-tree scoring, written in torch.

  The packed row is the prompt then the tree nodes; a node sees the real prompt tokens and
  its ancestors and sits at `prompt length + depth`. transformers takes the custom 4-D
  boolean mask `[B, 1, T, T]` (True: attend) as it is and hands it to SDPA; padding queries
  see themselves, so no softmax row is empty (their outputs are never read).
  """
  t = {k: torch.from_numpy(np.array(getattr(tree, k))) for k in (
      "prompt_ids", "prompt_mask", "node_ids", "node_mask", "node_parent", "node_path",
      "output_node")}
  r, tp = t["prompt_ids"].shape
  n = t["node_ids"].shape[1]
  ids = torch.cat([t["prompt_ids"], t["node_ids"]], 1).long()
  valid = torch.cat([t["prompt_mask"], t["node_mask"]], 1)
  length = t["prompt_mask"].sum(-1)
  depth = (t["node_path"] >= 0).sum(-1) - 1
  prompt_pos = (torch.cumsum(t["prompt_mask"].long(), -1) - 1).clamp(min=0)
  positions = torch.cat([prompt_pos, length[:, None] + depth.clamp(min=0)], 1).long()
  ancestors = (t["node_path"][:, :, :, None] == torch.arange(n)[None, None, None, :]).any(2)
  total = tp + n
  pair = torch.ones(r, total, total, dtype=torch.bool)
  pair[:, tp:, tp:] = ancestors
  causal = torch.ones(total, total, dtype=torch.bool).tril()
  mask = (pair & causal & valid[:, None, :]) | torch.eye(total, dtype=torch.bool)
  mask = mask[:, None]
  slot = torch.where(t["node_parent"] >= 0, tp + t["node_parent"], tp - 1).long()
  out_node = t["output_node"].long()
  path = torch.gather(t["node_path"].long(), 1,
                      out_node.clamp(min=0)[..., None].expand(-1, -1, t["node_path"].shape[-1]))
  node_ids, node_mask = t["node_ids"].long(), t["node_mask"]

  def score(rows: slice):
    hidden = model.model(input_ids=ids[rows], attention_mask=mask[rows],
                         position_ids=positions[rows]).last_hidden_state
    h = torch.gather(hidden, 1, slot[rows][..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.lm_head(h).float()
    node_lp = torch.log_softmax(logits, -1).gather(-1, node_ids[rows][..., None])[..., 0]
    node_lp = torch.where(node_mask[rows], node_lp, 0.0)
    p = path[rows]
    lp = torch.gather(node_lp[:, None, :].expand(-1, p.shape[1], -1), 2, p.clamp(min=0))
    totals = torch.where(p >= 0, lp, 0.0).sum(-1)
    return torch.where(out_node[rows] >= 0, totals, -1e30)

  return score, out_node >= 0


def measure_torch(directory: str, size: str, states: int, micro_batch: int, repeats: int,
                  slow_repeats: int, threads: int, profile: bool) -> dict:
  """harnax `tree` and torch, timed alternately, after checking that they agree.

  With fewer `threads` than cores the process is first bound to `threads` cores (before jax
  and torch start, so XLA's thread pool has that size too), and torch uses as many threads.
  """
  cpus = sorted(os.sched_getaffinity(0))
  if threads < len(cpus):
    os.sched_setaffinity(0, cpus[:threads])
  import jax
  import jax.numpy as jnp
  import torch
  import transformers

  from harnax.policies import lm

  torch.set_num_threads(threads)
  jnp.zeros(1).block_until_ready()
  run_jax, compile_s, tokens, compiled = harnax_step(directory, size, "tree", states,
                                                     micro_batch)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.join(directory, size), dtype=torch.float32).eval()
  score, exists = torch_tree_scorer(model, lm.pack_candidates(tokens), torch)
  g = torch.from_numpy(_cotangent(states, tokens.num_outputs))
  g = torch.where(exists, g, 0.0)
  chunks = [slice(s, s + micro_batch) for s in range(0, states, micro_batch)]

  def run_torch():
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
      log_probs = torch.cat([score(rows) for rows in chunks])
    for rows in chunks:
      loss = -(g[rows] * score(rows)).sum()
      loss.backward()
    return log_probs

  # Equal work: the same log-probs and the same gradient (the loss is -sum G L, harnax's
  # pullback +sum G L). The tied embedding's gradient and the global norm are compared.
  # These first calls are also the warm-up steps.
  lp_jax, grads = run_jax()
  t0 = time.perf_counter()
  lp_torch = run_torch().numpy()
  slow = time.perf_counter() - t0 >= 10.0
  exist = exists.numpy()
  lp_diff = float(np.abs(lp_torch - np.asarray(lp_jax))[exist].max())
  if not lp_diff <= 1e-4:
    raise AssertionError(f"torch and harnax log-probs differ by {lp_diff:.2e} (> 1e-4)")
  embed_jax = np.asarray(grads["embed_tokens"]["embedding"][...])
  embed_torch = -model.model.embed_tokens.weight.grad.numpy()
  embed_err = float(np.abs(embed_jax - embed_torch).max() / np.abs(embed_torch).max())
  norm_jax = float(np.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2))
                               for x in jax.tree.leaves(grads))))
  norm_torch = float(np.sqrt(sum(float((p.grad.double() ** 2).sum())
                                 for p in model.parameters())))
  norm_err = abs(norm_jax - norm_torch) / norm_torch
  if not (embed_err <= 1e-3 and norm_err <= 1e-3):
    raise AssertionError(f"torch and harnax gradients differ: embedding {embed_err:.2e}, "
                         f"norm {norm_err:.2e} (relative, > 1e-3)")
  n = min(repeats, slow_repeats) if slow else repeats
  times = {"harnax": [], "torch": []}
  cpu = {"harnax": [], "torch": []}  # process CPU time: robust to other processes' load
  for _ in range(n):
    for name, fn in (("harnax", run_jax), ("torch", run_torch)):
      t0, c0 = time.perf_counter(), time.process_time()
      fn()
      times[name].append(time.perf_counter() - t0)
      cpu[name].append(time.process_time() - c0)
  out = dict(compile_s=compile_s, lp_diff=lp_diff, embed_err=embed_err, norm_err=norm_err,
             times=times, threads=torch.get_num_threads(),
             cores=len(os.sched_getaffinity(0)), attn=model.config._attn_implementation,
             **{f"{k}_median_s": statistics.median(v) for k, v in times.items()},
             **{f"{k}_cpu_median_s": statistics.median(v) for k, v in cpu.items()},
             **{f"{k}_cpu_min_s": min(v) for k, v in cpu.items()},
             **{f"{k}_min_s": min(v) for k, v in times.items()})
  if profile:
    out["breakdown"] = {"harnax": harnax_breakdown(run_jax, compiled),
                        "torch": torch_breakdown(run_torch)}
  return out


# -- driver ------------------------------------------------------------------------------------


def _child(args) -> None:
  if args.child == "torch":
    res = measure_torch(args.dir, args.size, args.states, args.micro_batch, args.repeats,
                        args.slow_repeats, args.threads[0], args.profile)
  else:
    res = measure_harnax(args.dir, args.size, args.child, args.states, args.micro_batch,
                         args.repeats, args.slow_repeats)
  children.report(res)


_RESULTS: dict = {}


def _run_child(kind: str, directory: str, size: str, states: int, micro_batch: int,
               repeats: int, slow_repeats: int, loads: list, *, threads: int = 0,
               profile: bool = False) -> dict:
  """One configuration in a fresh subprocess (a configuration already run is reused).

  Appends the 1-minute load average after the run to `loads`.
  """
  key = (kind, directory, size, states, micro_batch, threads)
  if key in _RESULTS:
    return _RESULTS[key]
  args = ["--child", kind, "--dir", directory, "--size", size, "--states", str(states),
          "--micro-batch", str(micro_batch), "--repeats", str(repeats),
          "--slow-repeats", str(slow_repeats)]
  if kind == "torch":
    args += ["--threads", str(threads)] + (["--profile"] if profile else [])
  t0 = time.perf_counter()
  res = children.run_child(__file__, args, loads,
                           what=f"{kind} run ({size}, R={states}, micro-batch {micro_batch})")
  _RESULTS[key] = res
  log(f"{kind:8s} {size:5s} R={states:<4d} mb={micro_batch:<4d}"
      + (f" threads={threads}" if threads else "")
      + f" ({time.perf_counter() - t0:.0f} s): "
      + ", ".join(f"{k}={v:.3g}" for k, v in res.items() if isinstance(v, float)))
  return res


_ms = children.ms


def _threads(n: int) -> str:
  return f"{n} thread" + "s" * (n != 1)


def _met(value: float, goal: float | None) -> str:
  return "-" if goal is None else children.met(value, goal)


def write_report(path: str, *, info: dict, methods: dict, versus: dict, sweep: list,
                 loads: list, elapsed: float, notes: list) -> str:
  """The markdown report (the only place that formats results)."""
  from importlib import metadata  # versions without importing torch (seconds) here

  cpus = os.cpu_count() or 1
  thread_counts = sorted({k[1] for k in versus})
  lines = [
      "# Exact policy-gradient step of an LM behind a harness: harnax vs torch",
      "",
      f"Generated by `benchmarks/lm_policy_gradient.py` on "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {elapsed / 60:.1f} min.",
      f"Machine: {platform.machine()}, {cpus} CPU cores, Python {platform.python_version()}, "
      f"jax {metadata.version('jax')} (CPU), torch {metadata.version('torch')}, transformers "
      f"{metadata.version('transformers')}; float32 everywhere. Sections 1 and 3: harnax "
      f"with XLA's default CPU thread pool ({cpus} threads). Section 2: both frameworks with "
      f"the same thread count, {' and '.join(str(t) for t in thread_counts)}: "
      "`torch.set_num_threads(n)`, and for n below the core count the process bound to n "
      "cores (`os.sched_setaffinity`) before jax starts, so XLA's pool has n threads too.",
      "1-minute load average at the start and after each configuration: "
      + ", ".join(f"{x:.1f}" for x in loads)
      + (f" (above the {cpus} cores: other processes shared the CPUs, so absolute times are "
         "pessimistic and noisy; see the minimum columns)." if max(loads) > cpus else "."),
      "",
      "**Step** = score every candidate of every state (`score_rows`, forward only), then pull a "
      "fixed random cotangent `G [R, O]` back through the model (`pullback`: forward + backward "
      "of `sum(G * log p)`, one micro-batch of states at a time, gradients accumulated): "
      "`exact_value_and_grad` without the tabular objective. One compiled program; median "
      "(and minimum) of the timed steps after a warm-up step.",
      "",
      "## Workload",
      "",
      f"MiniWoB++ click-checkboxes, harness H5: the first {info['instances']} training "
      f"instance(s) of `task_split(\"click-checkboxes\", 4, 3, seed=0)` (with "
      f"{', '.join(str(n) for n in info['instance_states'])} states), their states in order; "
      f"a run with R states takes the first R. Prompts rendered with the chat template of a "
      f"byte-level BPE tokenizer trained on these instances' observations and candidates "
      f"({info['vocab']} tokens).",
      "",
      "| quantity | value |",
      "|---|---|",
      f"| states available (R at most) | {info['states']} |",
      f"| candidates per state O | {info['candidates']} |",
      f"| prompt length Tp (padded / mean real) | {info['prompt_length']} / "
      f"{info['prompt_mean']:.1f} |",
      f"| candidate length Tc, end token included (padded / mean real) | "
      f"{info['output_length']} / {info['output_mean']:.1f} |",
      f"| tree nodes per state N (padded / mean real) | {info['nodes']} / "
      f"{info['nodes_mean']:.1f} |",
      f"| candidate tokens scored per state (sum of real Tc) | "
      f"{info['candidate_tokens'] / info['states']:.0f} |",
      f"| model positions per state, tree: Tp + N | {info['prompt_length'] + info['nodes']} |",
      f"| model positions per state, cache: Tp + O Tc | "
      f"{info['prompt_length'] + info['candidates'] * info['output_length']} |",
      f"| model positions per state, unshared: O (Tp + Tc) | "
      f"{info['candidates'] * (info['prompt_length'] + info['output_length'])} |",
      f"| host-side packing (`pack_candidates`, not in the step) | "
      f"{info['pack_ms_per_state']:.2f} ms per state |",
      "",
      "Models (random weights, Qwen3 layout, tied embeddings, float32):",
      "",
      "| size | hidden | layers | heads / kv heads / head dim | MLP | parameters |",
      "|---|---|---|---|---|---|",
  ]
  for size, n in info["params"].items():
    c = SIZES[size]
    lines.append(f"| {size} | {c['hidden_size']} | {c['num_hidden_layers']} | "
                 f"{c['num_attention_heads']} / {c['num_key_value_heads']} / {c['head_dim']} | "
                 f"{c['intermediate_size']} | {n / 1e3:.0f}k |")

  targets = []
  lines += ["", "## 1. Prompt sharing: the three harnax scorers", "",
            "Same states, same micro-batch (states per micro-batch), same cotangent, one "
            "process per row. `time / tree` > 1 means slower than the tree (medians; the "
            "minimum's ratio in brackets). Candidate tok/s counts the real candidate tokens "
            "scored per step (the same for every method); positions are what one forward pass "
            "runs through the model, padding included.", "",
            "| size | method | R | micro-batch | step (median) | step (min) | time / tree | "
            "compile | candidate tok/s | positions / pass | peak RSS MB | runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for (size, method), res in methods.items():
    tree = methods[(size, "tree")]
    ratio, ratio_min = res["median_s"] / tree["median_s"], res["min_s"] / tree["min_s"]
    lines.append(
        f"| {size} | `{method}` | {res['states']} | {res['micro_batch']} | "
        f"{_ms(res['median_s'])} | {_ms(res['min_s'])} | {ratio:.2f} ({ratio_min:.2f}) | "
        f"{res['compile_s']:.1f} s | {res['candidate_tokens'] / res['median_s']:.0f} | "
        f"{res['positions']} | {res['peak_mb']:.0f} | {len(res['times'])} |")
    if method != "tree":
      targets.append((f"{size}: tree vs `{method}`", ratio, ratio_min,
                      TARGET_UNSHARED if method == "unshared" else None))

  lines += ["", "## 2. harnax vs transformers + torch (CPU, eager)", "",
            "The same prefix-tree scoring in torch: `Qwen3ForCausalLM` loaded with "
            "`AutoModelForCausalLM.from_pretrained` from the checkpoint harnax saved "
            "(`models.save_pretrained`), `model.model(input_ids, attention_mask=<4-D bool mask "
            "[B, 1, T, T]>, position_ids=...)` over the packed row (transformers 5 hands a 4-D "
            "mask to SDPA unchanged; a mask is the only way its models take a tree), the same "
            "gathers and sums, then `loss = -(G * logp).sum(); "
            "loss.backward()` per micro-batch after a `no_grad` scoring pass. Before timing, "
            "log-probs and gradients are checked equal (max |diff| of the log-probs; relative "
            "max error of the tied embedding's gradient and relative error of the global "
            "gradient norm). Both steps run in one process, alternating, so both see the same "
            "load; the harnax columns are that run's, not section 1's. `torch / harnax` > 1: "
            "harnax is faster. The work differs by design: harnax's "
            "`CausalLM.tree_hidden_states` skips the prompt slots' attention to the tree "
            "(always masked) and runs the last layer only at the slots that predict a token; "
            "torch runs every slot of every layer and the full `[T, T]` attention of the "
            "packed row under the mask. The CPU-time columns (process time) are the most "
            "robust to other processes on a shared machine, at one thread.", "",
            "| size | threads | R | micro-batch | harnax (median) | torch (median) | "
            "torch / harnax (median) | harnax (min) | torch (min) | torch / harnax (min) | "
            "CPU time harnax / torch (median) | CPU torch / harnax | "
            "log-prob diff | grad err (embed / norm) | runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for (size, threads), res in versus.items():
    med = res["torch_median_s"] / res["harnax_median_s"]
    best = res["torch_min_s"] / res["harnax_min_s"]
    lines.append(
        f"| {size} | {threads} | {res['states']} | {res['micro_batch']} | "
        f"{_ms(res['harnax_median_s'])} | {_ms(res['torch_median_s'])} | {med:.2f} | "
        f"{_ms(res['harnax_min_s'])} | {_ms(res['torch_min_s'])} | {best:.2f} | "
        f"{_ms(res['harnax_cpu_median_s'])} / {_ms(res['torch_cpu_median_s'])} | "
        f"{res['torch_cpu_median_s'] / res['harnax_cpu_median_s']:.2f} | "
        f"{res['lp_diff']:.1e} | {res['embed_err']:.1e} / {res['norm_err']:.1e} | "
        f"{len(res['times']['harnax'])} |")
    targets.append((f"{size}: harnax tree vs torch, {_threads(threads)}",
                    med, best,
                    TARGET_TORCH))
    if threads == 1:
      targets.append((f"{size}: harnax tree vs torch, 1 thread, CPU time",
                      res["torch_cpu_median_s"] / res["harnax_cpu_median_s"],
                      res["torch_cpu_min_s"] / res["harnax_cpu_min_s"], TARGET_TORCH))
  profiled = [(k, r["breakdown"]) for k, r in versus.items() if "breakdown" in r]
  if profiled:
    lines += ["", "Where the time of one step goes (a profiled step, so slower than the "
              "timed ones). harnax: XLA thunks of the compiled step (jax profiler), by what "
              "their fused computation contains: a dot (`matmuls`, the attention's QK and PV "
              "included), else a gather/scatter/dynamic slice, else a transpose or copy "
              "(`transposes & copies`, with any elementwise ops fused into it), else "
              "elementwise ops and reductions (softmax, norms, losses). torch: self CPU time "
              "per aten op (torch profiler); `attention kernel` is SDPA's fused CPU kernel "
              "(QK, softmax, PV) with its backward. Share of the profiled total in brackets.",
              "",
              "| size | threads | framework | total | " + " | ".join(CATEGORIES) + " |",
              "|---|---|---|---|" + "---|" * len(CATEGORIES)]
    for (size, threads), br in profiled:
      for name in ("harnax", "torch"):
        b = br[name]
        total = sum(b[c] for c in CATEGORIES)
        lines.append(f"| {size} | {threads} | {name} | {_ms(total)} | " + " | ".join(
            f"{_ms(b[c])} ({100 * b[c] / total:.0f}%)" for c in CATEGORIES) + " |")
    lines += ["", f"The {TOP_OPS} largest items of each profiled step: harnax by the jax op an "
              "XLA thunk comes from (its `op_name`, summed over layers and micro-batches; "
              "`transpose(jvp(...))` is that op's backward), torch by aten op.", "",
              "| size | threads | framework | op | category | time | share |",
              "|---|---|---|---|---|---|---|"]
    for (size, threads), br in profiled:
      for name in ("harnax", "torch"):
        total = sum(br[name][c] for c in CATEGORIES)
        for op, category, seconds in br[name]["top"]:
          op = op if len(op) <= 70 else op[:67] + "..."
          lines.append(f"| {size} | {threads} | {name} | `{op}` | {category} | {_ms(seconds)} | "
                       f"{100 * seconds / total:.0f}% |")

  if sweep:
    base = sweep[0]
    lines += ["", "## 3. Micro-batch size (harnax `tree`)", "",
              f"Size `{base['size']}`, R = {base['states']} states, one fresh process per row. "
              "Peak RSS is the whole process (Python, jax, the weights, the compiled program, "
              "its buffers); `runtime + inputs` is the RSS after loading the model and the "
              "token arrays and compiling, before the first step; `step memory` the "
              "difference. Positions / s: model positions of one forward pass (R (Tp + N)) "
              "per second of step (a step runs two forward passes and one backward).", "",
              "| micro-batch | step (median) | step (min) | candidate tok/s | positions / s | "
              "compile | runtime + inputs MB | peak RSS MB | step memory MB | runs |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for res in sweep:
      lines.append(
          f"| {res['micro_batch']} | {_ms(res['median_s'])} | {_ms(res['min_s'])} | "
          f"{res['candidate_tokens'] / res['median_s']:.0f} | "
          f"{res['positions'] / res['median_s']:.0f} | {res['compile_s']:.1f} s | "
          f"{res['loaded_rss_mb']:.0f} | {res['peak_mb']:.0f} | "
          f"{res['peak_mb'] - res['loaded_rss_mb']:.0f} | {len(res['times'])} |")

  lines += ["", "## Targets", "",
            "| comparison | speed-up of harnax tree (median) | (min) | goal | met (median) | "
            "met (min) |", "|---|---|---|---|---|---|"]
  for name, value, value_min, goal in targets:
    lines.append(f"| {name} | {value:.2f}x | {value_min:.2f}x | "
                 + (f">= {goal:g}x" if goal else "-")
                 + f" | {_met(value, goal)} | {_met(value_min, goal)} |")
  if notes:
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)
  return text


def _notes(versus: dict, skipped: set) -> list[str]:
  """Observations computed from the results (the spread of the timings, the breakdown)."""
  notes = []
  if skipped:
    notes.append(f"`unshared` is not run for {sorted(skipped)}: it runs every prompt once per "
                 "candidate, too slow for this benchmark's time budget at that size.")
  for (size, threads), res in versus.items():
    for name in ("harnax", "torch"):
      spread = res[f"{name}_median_s"] / res[f"{name}_min_s"]
      if spread > 1.5:
        notes.append(f"{size}, {_threads(threads)}: {name}'s median step is {spread:.1f}x its "
                     "fastest: other processes took cores during the run. A parallel region "
                     "that waits for its slowest thread (torch's OpenMP) stalls whenever "
                     "one of its threads is descheduled; the minimum is the better estimate "
                     "of the unshared machine.")
    one = versus.get((size, 1))
    for name in ("harnax", "torch"):
      if threads > 1 and one and res[f"{name}_min_s"] > one[f"{name}_min_s"]:
        notes.append(
            f"{size}: {name} with {_threads(threads)} is slower than with one (fastest step "
            f"{_ms(res[f'{name}_min_s'])} against {_ms(one[f'{name}_min_s'])}): its threads "
            "waited for cores that other processes held, so on this machine the "
            f"{_threads(threads)} row measures robustness to sharing more than kernel speed.")
    if "breakdown" in res:
      b = res["breakdown"]
      ratio = res["torch_median_s"] / res["harnax_median_s"]
      jt, tt = (sum(b[n][c] for c in CATEGORIES) for n in ("harnax", "torch"))
      if ratio < TARGET_TORCH:
        h = {c: f"{_ms(b['harnax'][c])} ({100 * b['harnax'][c] / jt:.0f}%)" for c in CATEGORIES}
        t = {c: f"{_ms(b['torch'][c])} ({100 * b['torch'][c] / tt:.0f}%)" for c in CATEGORIES}
        notes.append(
            f"{size}, {_threads(threads)}: harnax's step takes {1 / ratio:.2f}x torch's "
            f"(medians; profiled: {_ms(jt)} against {_ms(tt)}). Matmuls: harnax "
            f"{h['matmuls']}, the attention's included, against torch's matmuls "
            f"{t['matmuls']} plus its fused attention kernel {t['attention kernel']}. "
            f"Transposes and copies: harnax {h['transposes & copies']}, torch "
            f"{t['transposes & copies']}. Gathers and scatters: harnax "
            f"{h['gather / scatter']}, torch {t['gather / scatter']}. Elementwise and "
            f"reductions: harnax {h['elementwise & reductions']}, torch "
            f"{t['elementwise & reductions']}.")
  return notes


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=None, help="report path (default "
                 "benchmarks/results/lm_policy_gradient.md)")
  p.add_argument("--quick", action="store_true", help="a one-layer model, a few states")
  p.add_argument("--sizes", nargs="+", choices=list(SIZES), help="model sizes")
  p.add_argument("--states", type=int, help="states R of the method and torch comparisons")
  p.add_argument("--small-states", type=int, help="R for the larger size(s)")
  p.add_argument("--micro-batch", type=int, help="states per micro-batch in sections 1 and 2")
  p.add_argument("--sweep-states", type=int, help="R of the micro-batch sweep")
  p.add_argument("--sweep", type=int, nargs="*", help="micro-batch sizes to sweep")
  p.add_argument("--repeats", type=int, help="timed steps per configuration")
  p.add_argument("--slow-repeats", type=int, help="timed steps when one step takes > 10 s")
  p.add_argument("--sweep-repeats", type=int, help="timed steps per micro-batch size")
  p.add_argument("--threads", type=int, nargs="+",
                 help="thread counts of the torch comparison (default: 1 and all cores)")
  p.add_argument("--methods", nargs="+", choices=METHODS,
                 help="harnax scorers of section 1 (default: all; tree always runs)")
  p.add_argument("--skip-unshared", nargs="*", default=None,
                 help="sizes without the (slow) unshared method (default: all but the first)")
  p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--child", choices=list(METHODS) + ["torch"], help=argparse.SUPPRESS)
  p.add_argument("--dir", help=argparse.SUPPRESS)
  p.add_argument("--size", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    return _child(args)

  conf = dict(QUICK if args.quick else FULL)
  for key in ("sizes", "states", "small_states", "micro_batch", "sweep_states", "sweep",
              "repeats", "slow_repeats", "sweep_repeats", "threads"):
    if getattr(args, key) is not None:
      conf[key] = getattr(args, key)
  cores = len(os.sched_getaffinity(0))
  threads = sorted(set(conf["threads"] or [1, cores]))
  if threads[0] < 1 or threads[-1] > cores:
    p.error(f"--threads: {threads} outside 1..{cores} (the cores this process may use)")
  sizes = conf["sizes"]
  methods_run = ["tree"] + [m for m in (args.methods or METHODS) if m != "tree"]
  skip = set(sizes[1:] if args.skip_unshared is None else args.skip_unshared)
  skip &= set(sizes) if "unshared" in methods_run else set()
  size_states = {s: conf["states"] if i == 0 else conf["small_states"]
                 for i, s in enumerate(sizes)}
  for name in ("states", "small_states", "sweep_states"):
    mbs = [conf["micro_batch"]] if name != "sweep_states" else conf["sweep"]
    bad = [mb for mb in mbs if mb <= 0 or conf[name] % mb]
    if bad:
      p.error(f"micro-batch sizes {bad} do not divide --{name.replace('_', '-')} "
              f"{conf[name]} (padding rows would be timed)")
  out = args.out or DEFAULT_OUT
  loads = [os.getloadavg()[0]]
  started = time.perf_counter()
  reps = (conf["repeats"], conf["slow_repeats"])
  with tempfile.TemporaryDirectory(prefix="lm_pg_") as directory:
    need = max([conf["sweep_states"] if conf["sweep"] else 0] + list(size_states.values()))
    info = build_workload(directory, instances=conf["instances"], states=need,
                          vocab=conf["vocab"], sizes=sizes)
    log(f"workload: {json.dumps(info)}")
    methods, versus, sweep = {}, {}, []
    for size in sizes:
      r, mb = size_states[size], conf["micro_batch"]
      for method in methods_run:
        if method == "unshared" and size in skip:
          continue
        res = _run_child(method, directory, size, r, mb, *reps, loads)
        methods[(size, method)] = dict(res, states=r, micro_batch=mb)
      for n in threads:
        res = _run_child("torch", directory, size, r, mb, *reps, loads, threads=n,
                         profile=n == 1)
        versus[(size, n)] = dict(res, states=r, micro_batch=mb)
    for mb in conf["sweep"]:
      res = _run_child("tree", directory, sizes[0], conf["sweep_states"], mb,
                       conf["sweep_repeats"], conf["slow_repeats"], loads)
      sweep.append(dict(res, size=sizes[0], states=conf["sweep_states"], micro_batch=mb))
  text = write_report(out, info=info, methods=methods, versus=versus, sweep=sweep, loads=loads,
                      elapsed=time.perf_counter() - started, notes=_notes(versus, skip))
  log(f"report written to {out}")
  print(text)


if __name__ == "__main__":
  main()
