"""Agent rollouts in ALFWorld: harnax's batched KV-cache generation vs a transformers loop.

The workload: the first `--games` generated ALFWorld tasks (`alfworld.tasks("seen")`, one of
each task type in turn), played by a random-weight Qwen3 with the chat prompt of
`harnax.policies.text_agent` (a byte-level BPE tokenizer trained here on the games' texts, no
download), `--batch` live games at a time, `--max-turns` turns each, greedy, `--new` new
tokens at most per turn (`harnax.train.rollouts.rollout`, games in this process).

Measured, each in its own subprocess bound to `--threads` cores (one by default: XLA's pool
and `torch.set_num_threads` then both have one thread):

1. the harnax rollout end to end (compilation included): turns, generated tokens, wall time,
   time in generation and in the games; environment turns per second;
2. generation alone on the SAME turns: the rollout's batches of contexts, read back from its
   JSONL log, generated again by harnax (`LMGenerator`, warm) and by transformers
   (`Qwen3ForCausalLM.generate` on the checkpoint harnax saved: identical weights; the same
   prompts, left-padded, greedy, the same stop tokens and `max_new_tokens`), timed
   alternately in one process; the outputs are compared text for text;
3. each game's own cost: loading a game, reset, and a step (the expert plan's commands and
   an invalid one) for ALFWorld with and without admissible commands, and ScienceWorld where
   a Java runtime is available.

Usage::

  python benchmarks/text_rollouts.py                       # full run
  python benchmarks/text_rollouts.py --quick --out results/tr.md   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import children  # benchmarks/children.py (this folder is on sys.path when run as a script)
import memory  # benchmarks/memory.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "text_rollouts.md")

SIZES = children.SIZES
FULL = dict(sizes=["tiny", "small"], games=8, batch=4, max_turns=4, new=48, vocab=1024,
            repeats=3, env_games=3, scienceworld=True)
QUICK = dict(sizes=["quick"], games=2, batch=2, max_turns=2, new=8, vocab=400, repeats=1,
             env_games=1, scienceworld=False)
TARGET = 1.0
_START = time.perf_counter()


def log(msg: str) -> None:
  print(f"[{time.perf_counter() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def make_game(task):
  from harnax.envs.text import alfworld
  return alfworld.make(task, check_solvable=False)


# -- the workload (parent process) ----------------------------------------------------------


def build_workload(directory: str, conf: dict) -> dict:
  """The tokenizer (trained on the games' texts) and one HF checkpoint per model size."""
  from harnax import models
  from harnax.envs.text import alfworld
  from harnax.models import tokenizer as tokenizer_lib
  from harnax.policies import text_agent

  tasks = alfworld.tasks("seen", per_type=max(1, -(-conf["games"] // 6)))
  tasks = [tasks[(i % 6) * (len(tasks) // 6) + i // 6] for i in range(conf["games"])]
  texts = [text_agent.SYSTEM_PROMPT]
  for task in tasks:
    game = make_game(task)
    obs, info = game.reset()
    texts.append(obs)
    for action in game.expert_plan():
      texts.append(text_agent.format_output("I look for it.", action) + "\n"
                   + game.step(action)[0])
    game.close()
  tok = tokenizer_lib.train_tokenizer(texts, os.path.join(directory, "tokenizer"),
                                      vocab_size=conf["vocab"])
  info = dict(tasks=[t.ident for t in tasks], vocab=tok.vocab_size, params={})
  for size in conf["sizes"]:
    cfg = models.Qwen3Config.from_hf_dict(dict(
        SIZES[size], architectures=["Qwen3ForCausalLM"], model_type="qwen3",
        vocab_size=tok.vocab_size, max_position_embeddings=4096, rms_norm_eps=1e-6,
        hidden_act="silu", attention_bias=False, use_sliding_window=False,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model = models.from_config(cfg, seed=0)
    models.save_pretrained(model, os.path.join(directory, size))
    for name in ("tokenizer.json", "tokenizer_config.json"):  # transformers reads both here
      with open(os.path.join(directory, "tokenizer", name)) as src, open(
          os.path.join(directory, size, name), "w") as dst:
        dst.write(src.read())
    info["params"][size] = int(models.param_count(model))
  with open(os.path.join(directory, "tasks.json"), "w") as f:
    json.dump([[t.game, t.task_type, t.split, t.ident, list(t.params)] for t in tasks], f)
  return info


def _tasks(directory: str):
  from harnax.envs.text.base import GameTask
  with open(os.path.join(directory, "tasks.json")) as f:
    return [GameTask(g, tt, s, i, tuple(p)) for g, tt, s, i, p in json.load(f)]


def _generator(directory: str, size: str, conf: dict):
  from harnax import models
  from harnax.train import rollouts
  model = models.load_pretrained(os.path.join(directory, size))
  tok = models.Tokenizer.from_dir(os.path.join(directory, "tokenizer"))
  return rollouts.LMGenerator(model, tok, max_new_tokens=conf["new"])


# -- 1. the rollout (child) ----------------------------------------------------------------------


def measure_rollout(directory: str, size: str, conf: dict) -> dict:
  from harnax.train import rollouts
  gen = _generator(directory, size, conf)
  path = os.path.join(directory, f"rollout-{size}.jsonl")
  res = rollouts.rollout(_tasks(directory), make_game, gen, batch_size=conf["batch"],
                         max_turns=conf["max_turns"], log_path=path)
  return dict(turns=res.turns, batches=len(res.batch_sizes), tokens=res.generated_tokens,
              seconds=res.seconds, generate_s=res.generate_seconds, env_s=res.env_seconds,
              parse_failures=sum(e.parse_failures for e in res.episodes),
              shapes=sorted(gen.stats["shapes"]), prompt_tokens=gen.stats["prompt_tokens"],
              peak_mb=memory.peak_rss_mb())


# -- 2. generation on the same turns (child) ----------------------------------------------------


def _batches(path: str) -> list[list[dict]]:
  """The rollout's batches of turn records, in order (a batch: one record per live game)."""
  from harnax.train import rollouts
  records = rollouts.read_log(path)
  turns = [r for r in records if r["kind"] == "turn"]
  batches: dict[int, list[dict]] = {}
  for r in turns:
    batches.setdefault(r["batch"], []).append(r)
  return [batches[k] for k in sorted(batches)]


def torch_generator(path: str, tok, gen, torch):
  """`contexts -> [(text, tokens)]`: transformers' greedy `generate` on the harnax prompts."""
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

  def run(contexts):
    rows = [tok.encode(gen.prompt(c), add_special_tokens=False) for c in contexts]
    t = max(len(r) for r in rows)
    ids = torch.full((len(rows), t), gen.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), t), dtype=torch.long)
    for i, r in enumerate(rows):
      ids[i, t - len(r):] = torch.tensor(r)
      mask[i, t - len(r):] = 1
    with torch.no_grad():
      out = model.generate(ids, attention_mask=mask, max_new_tokens=gen.max_new_tokens,
                           do_sample=False, eos_token_id=list(gen.stop_tokens),
                           pad_token_id=gen.pad_id)
    results = []
    for row in out[:, t:].tolist():
      n = next((k + 1 for k, x in enumerate(row) if x in gen.stop_tokens), len(row))
      results.append((tok.decode(row[:n], skip_special_tokens=True), n))
    return results

  return run


def measure_versus(directory: str, size: str, conf: dict) -> dict:
  import torch
  torch.set_num_threads(conf["threads"])
  gen = _generator(directory, size, conf)
  batches = _batches(os.path.join(directory, f"rollout-{size}.jsonl"))
  contexts = [[r["context"] for r in b] for b in batches]
  logged = [[r["output"] for r in b] for b in batches]
  run_torch = torch_generator(os.path.join(directory, size), gen.tokenizer, gen, torch)

  def run_jax():
    return [[(g.text, g.num_tokens) for g in gen(c)] for c in contexts]

  def run_t():
    return [run_torch(c) for c in contexts]

  jax_out, torch_out = run_jax(), run_t()  # warm-up (compiles what the rollout compiled)
  pairs = [(a, b) for x, y in zip(jax_out, torch_out) for a, b in zip(x, y)]
  same = sum(a[0] == b[0] for a, b in pairs)
  same_log = sum(a[0] == o for x, lo in zip(jax_out, logged) for a, o in zip(x, lo))
  tokens = {"harnax": sum(a[1] for a, _ in pairs), "torch": sum(b[1] for _, b in pairs)}
  times = {"harnax": [], "torch": []}
  cpu = {"harnax": [], "torch": []}
  for _ in range(conf["repeats"]):
    for name, fn in (("harnax", run_jax), ("torch", run_t)):
      t0, c0 = time.perf_counter(), time.process_time()
      fn()
      times[name].append(time.perf_counter() - t0)
      cpu[name].append(time.process_time() - c0)
  return dict(outputs=len(pairs), same=same, same_log=same_log, tokens=tokens,
              batches=len(batches), cores=len(os.sched_getaffinity(0)),
              torch_threads=torch.get_num_threads(),
              **{f"{k}_median_s": statistics.median(v) for k, v in times.items()},
              **{f"{k}_min_s": min(v) for k, v in times.items()},
              **{f"{k}_cpu_s": statistics.median(v) for k, v in cpu.items()})


# -- 3. the games' own cost (child) -------------------------------------------------------------


def _game_cost(make, tasks) -> dict:
  load, reset, step, invalid, steps = [], [], [], [], 0
  for task in tasks:
    t0 = time.perf_counter()
    game = make(task)
    load.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    game.reset()
    reset.append(time.perf_counter() - t0)
    plan = game.expert_plan()
    t0 = time.perf_counter()
    game.step("xyzzy")
    invalid.append(time.perf_counter() - t0)
    for action in plan:
      t0 = time.perf_counter()
      _, _, terminated, truncated, _ = game.step(action)
      step.append(time.perf_counter() - t0)
      steps += 1
      if terminated or truncated:
        break
    game.close()
  return dict(games=len(tasks), steps=steps, load_s=statistics.median(load),
              reset_s=statistics.median(reset), step_s=statistics.median(step),
              invalid_s=statistics.median(invalid))


def measure_env(directory: str, conf: dict) -> dict:
  import functools

  from harnax.envs.text import alfworld
  tasks = _tasks(directory)[:conf["env_games"]]
  # The engine memoizes a problem's translation: the first load of a game costs more than any
  # later one (a rollout worker pays it once per game). Measured here, then every row loads
  # the games again.
  first = []
  for task in tasks:
    t0 = time.perf_counter()
    alfworld.make(task, check_solvable=False).close()
    first.append(time.perf_counter() - t0)
  out = {"ALFWorld, first load": dict(games=len(tasks), load_s=statistics.median(first))}
  for adm in (True, False):
    out[f"ALFWorld, admissible={adm}"] = _game_cost(
        functools.partial(alfworld.make, admissible=adm, check_solvable=False), tasks)
  if conf["scienceworld"]:
    try:
      from harnax.envs.text import scienceworld as sw
      sw_tasks = sw.tasks("seen", per_task=1)[:conf["env_games"]]
      for adm in (True, False):
        out[f"ScienceWorld, admissible={adm}"] = _game_cost(
            functools.partial(sw.make, admissible=adm), sw_tasks)
    except Exception as e:  # no Java runtime, or the module is missing
      out["ScienceWorld"] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
  return out


# -- driver ------------------------------------------------------------------------------------


def _child(args) -> None:
  conf = json.loads(args.conf)
  children.bind(conf["threads"])
  if args.child == "rollout":
    res = measure_rollout(args.dir, args.size, conf)
  elif args.child == "versus":
    res = measure_versus(args.dir, args.size, conf)
  else:
    res = measure_env(args.dir, conf)
  children.report(res)


def _run_child(kind: str, directory: str, size: str, conf: dict, loads: list) -> dict:
  t0 = time.perf_counter()
  res = children.run_child(__file__, ["--child", kind, "--dir", directory, "--size", size,
                                      "--conf", json.dumps(conf)], loads,
                           what=f"{kind} {size}")
  log(f"{kind} {size}: {time.perf_counter() - t0:.1f} s")
  return res


_ms = children.ms


def write_report(path: str, *, conf: dict, info: dict, rollout: dict, versus: dict, env: dict,
                 loads: list, elapsed: float) -> str:
  import jax
  import torch
  import transformers
  cores = len(os.sched_getaffinity(0))
  lines = [
      "# Agent rollouts in ALFWorld: harnax vs a transformers generate loop", "",
      f"Generated by `benchmarks/text_rollouts.py` on "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {elapsed / 60:.1f} min.",
      f"Machine: {platform.machine()}, {cores} CPU cores, Python {platform.python_version()}, "
      f"jax {jax.__version__} (CPU), torch {torch.__version__}, transformers "
      f"{transformers.__version__}; float32. Every measurement runs in a subprocess bound to "
      f"{conf['threads']} core(s) (`os.sched_setaffinity` before jax starts, so XLA's pool has "
      f"that many threads) with `torch.set_num_threads({conf['threads']})`.",
      "1-minute load average at the start and after each subprocess: "
      + ", ".join(f"{x:.1f}" for x in loads)
      + (f" (above the {cores} cores: other processes shared the CPUs; compare the CPU-time "
         "column)." if max(loads) > cores else "."),
      "", "## Workload", "",
      f"{len(info['tasks'])} generated ALFWorld tasks (seen split, the task types in turn), "
      f"{conf['batch']} live games at a time (a finished game is replaced from the queue), "
      f"{conf['max_turns']} turns per episode, greedy, at most {conf['new']} new tokens per "
      "turn; prompts: the chat template of a byte-level BPE tokenizer trained on these games' "
      f"texts ({info['vocab']} tokens), the default system prompt, the plain context (opening "
      "observation and the last turns). Random-weight Qwen3 models (tied embeddings):", "",
      "| size | hidden | layers | heads / kv heads / head dim | MLP | parameters |",
      "|---|---|---|---|---|---|"]
  for size in conf["sizes"]:
    s = SIZES[size]
    lines.append(f"| {size} | {s['hidden_size']} | {s['num_hidden_layers']} | "
                 f"{s['num_attention_heads']} / {s['num_key_value_heads']} / {s['head_dim']} | "
                 f"{s['intermediate_size']} | {info['params'][size] / 1e3:.0f}k |")
  lines += [
      "", "## 1. The harnax rollout, end to end", "",
      "`harnax.train.rollouts.rollout` with `LMGenerator` (prompt lengths rounded up to powers "
      "of two from 64, batches to powers of two), games in the process. Wall time includes "
      "compiling each (batch, prompt length) shape once and loading every game.", "",
      "| size | turns | batched turns | tokens | shapes compiled | wall | generation | games | "
      "env turns/s | generated tok/s (generation time) | parse failures | peak RSS MB |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for size, r in rollout.items():
    lines.append(
        f"| {size} | {r['turns']} | {r['batches']} | {r['tokens']} | {len(r['shapes'])} | "
        f"{_ms(r['seconds'])} | {_ms(r['generate_s'])} | {_ms(r['env_s'])} | "
        f"{r['turns'] / r['seconds']:.2f} | {r['tokens'] / r['generate_s']:.0f} | "
        f"{r['parse_failures']} | {r['peak_mb']:.0f} |")
  lines += [
      "", "## 2. Generation on the same turns: harnax vs transformers", "",
      "The rollout's batches of contexts (read back from its JSONL log) generated again: harnax "
      "`LMGenerator` (warm: its shapes were compiled by the warm-up pass) against "
      "`Qwen3ForCausalLM.generate` (transformers, torch eager, CPU) on the checkpoint harnax "
      "saved, with the same prompts left-padded to the batch's longest (harnax pads further, "
      "to its bucket), greedy, the same stop tokens and `max_new_tokens`. Alternating in one "
      f"process, median of {conf['repeats']} passes over all batches. `torch / harnax` > 1: "
      "harnax is faster. Env turns/s: turns / (generation + the rollout's game time).", "",
      "| size | batches | outputs | same text (torch / log) | tokens | harnax | torch | "
      "torch / harnax (median) | (min) | CPU harnax / torch | harnax tok/s | torch tok/s | "
      "env turns/s harnax | env turns/s torch |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  targets = []
  for size, v in versus.items():
    r = rollout[size]
    h, t = v["harnax_median_s"], v["torch_median_s"]
    ratio, ratio_min = t / h, v["torch_min_s"] / v["harnax_min_s"]
    targets.append((size, ratio, ratio_min, v["torch_cpu_s"] / v["harnax_cpu_s"]))
    lines.append(
        f"| {size} | {v['batches']} | {v['outputs']} | {v['same']} / {v['same_log']} | "
        f"{v['tokens']['harnax']} | {_ms(h)} | {_ms(t)} | {ratio:.2f} | {ratio_min:.2f} | "
        f"{_ms(v['harnax_cpu_s'])} / {_ms(v['torch_cpu_s'])} | "
        f"{v['tokens']['harnax'] / h:.0f} | {v['tokens']['torch'] / t:.0f} | "
        f"{r['turns'] / (h + r['env_s']):.2f} | {r['turns'] / (t + r['env_s']):.2f} |")
  lines += ["", "## 3. The games' own cost", "",
            "Median seconds over the first games of the workload: building the game "
            "(`make`, TextWorld's PDDL engine loading the problem, the planner check skipped; "
            "the ScienceWorld JVM start included), `reset`, a step of the expert plan, and an "
            "invalid command. ALFWorld's first load of a game translates its PDDL problem "
            "(memoized in the process): its own row; the other rows load the games again.", "",
            "| game | games | steps | make | reset | step | invalid step |",
            "|---|---|---|---|---|---|---|"]
  for name, e in env.items():
    if "error" in e:
      lines.append(f"| {name} | not run: {e['error']} | | | | | |")
      continue
    if "step_s" not in e:
      lines.append(f"| {name} | {e['games']} | - | {_ms(e['load_s'])} | - | - | - |")
      continue
    lines.append(f"| {name} | {e['games']} | {e['steps']} | {_ms(e['load_s'])} | "
                 f"{_ms(e['reset_s'])} | {_ms(e['step_s'])} | {_ms(e['invalid_s'])} |")
  lines += ["", "## Target", "", "| size | torch / harnax (median) | (min) | (CPU time) | goal | "
            "met (median) |", "|---|---|---|---|---|---|"]
  for size, ratio, ratio_min, cpu_ratio in targets:
    lines.append(f"| {size} | {ratio:.2f}x | {ratio_min:.2f}x | {cpu_ratio:.2f}x | "
                 f">= {TARGET:g}x | {children.met(ratio, TARGET)} |")
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)
  return text


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=None, help="report path (default "
                 "benchmarks/results/text_rollouts.md)")
  p.add_argument("--quick", action="store_true", help="a one-layer model, two short games")
  p.add_argument("--sizes", nargs="+", choices=list(SIZES), help="model sizes")
  p.add_argument("--games", type=int, help="ALFWorld tasks in the queue")
  p.add_argument("--batch", type=int, help="live games at a time")
  p.add_argument("--max-turns", type=int, help="turns per episode")
  p.add_argument("--new", type=int, help="max new tokens per turn")
  p.add_argument("--repeats", type=int, help="timed passes of section 2")
  p.add_argument("--threads", type=int, default=1, help="cores of each subprocess (default 1)")
  p.add_argument("--no-scienceworld", action="store_true", help="skip ScienceWorld's row")
  p.add_argument("--child", choices=["rollout", "versus", "env"], help=argparse.SUPPRESS)
  p.add_argument("--dir", help=argparse.SUPPRESS)
  p.add_argument("--size", help=argparse.SUPPRESS)
  p.add_argument("--conf", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    return _child(args)
  conf = dict(QUICK if args.quick else FULL)
  for key in ("sizes", "games", "batch", "max_turns", "new", "repeats"):
    if getattr(args, key) is not None:
      conf[key] = getattr(args, key)
  for key in ("games", "batch", "max_turns", "new", "repeats"):
    if conf[key] < 1:
      p.error(f"--{key.replace('_', '-')}: expected >= 1, got {conf[key]}")
  cores = len(os.sched_getaffinity(0))
  if not 1 <= args.threads <= cores:
    p.error(f"--threads: {args.threads} outside 1..{cores} (the cores this process may use)")
  conf["threads"] = args.threads
  conf["scienceworld"] = conf["scienceworld"] and not args.no_scienceworld
  conf["env_games"] = min(conf["env_games"], conf["games"])
  out = args.out or DEFAULT_OUT
  loads = [os.getloadavg()[0]]
  started = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="text_rollouts_") as directory:
    info = build_workload(directory, conf)
    log(f"workload: {json.dumps(info)}")
    rollout, versus = {}, {}
    for size in conf["sizes"]:
      rollout[size] = _run_child("rollout", directory, size, conf, loads)
      versus[size] = _run_child("versus", directory, size, conf, loads)
    env = _run_child("env", directory, "-", conf, loads)
  text = write_report(out, conf=conf, info=info, rollout=rollout, versus=versus, env=env,
                      loads=loads, elapsed=time.perf_counter() - started)
  log(f"report written to {out}")
  print(text)


if __name__ == "__main__":
  main()
