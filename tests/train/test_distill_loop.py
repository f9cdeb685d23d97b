"""The distillation step and loop (harnax.train.distill_loop): the losses against separate
NumPy computations on a tiny model, λ as the gradient-norm ratio, a micro end-to-end update for
HAD, every baseline and every ablation on real ALFWorld games, exact resume, malformed teacher
outputs counted, and the loss blind to reward, success and later turns."""

import dataclasses
import functools
import json
import types

from flax import nnx
import jax
import numpy as np
import optax
import pytest

from harnax import models
from harnax.envs.text import alfworld
from harnax.models import tokenizer as tokenizer_lib
from harnax.policies import text_agent
from harnax.studies.text_agents import HarnessedGameMaker
from harnax.train import distill_loop
from harnax.train import had
from harnax.train import rollouts
from tests.train import tiny

TEXTS = ["You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a "
         "countertop 1, a fridge 1 and a shelf 1.\nYour task is to: put a apple in fridge.",
         "<harness_state>\nlocation: unknown\ninventory: nothing\nvisited: none\nnot visited: "
         "cabinet 1, countertop 1\n</harness_state>", text_agent.SYSTEM_PROMPT,
         "Think: I go there.\nAction: go to fridge 1", "take apple 1 from countertop 1"]


_model = tiny.tiny_qwen3


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return tokenizer_lib.train_tokenizer(TEXTS, str(tmp_path_factory.mktemp("tok")),
                                       vocab_size=400)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("weighting", ["none", "given", "sopd"])
def test_response_distillation_against_numpy(tok, weighting):
  with jax.enable_x64(True):
    _check_response_distillation(tok, weighting)


def _check_response_distillation(tok, weighting):
  student = _model(tok, 16, 0, jax.numpy.float64)
  rng = np.random.default_rng(0)
  ids = rng.integers(3, tok.vocab_size, (2, 7)).astype(np.int32)
  attention = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)
  response = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]], bool)
  teacher = rng.normal(size=(2, 7, tok.vocab_size))
  turn_w = np.array([0.2, 0.7])
  # Under jit: one compile instead of one per eager op.
  loss, aux = nnx.jit(lambda m: distill_loop.response_distillation(
      m, ids, attention, response, teacher, None, turn_w, weighting=weighting,
      sopd_temperature=0.5))(student)
  # Independently: full forwards of each row, the KL at the positions predicting response
  # tokens (position t-1 predicts token t).
  kls = []
  for r in range(2):
    n = attention[r].sum()
    ls = _log_softmax(np.asarray(models.forward(student, jax.numpy.asarray(ids[r:r + 1, :n])))[0])
    lt = _log_softmax(teacher[r, :n])
    kls.append([float(np.sum(np.exp(ls[t - 1]) * (ls[t - 1] - lt[t - 1])))
                for t in range(1, n) if response[r, t]])
  n_tok = sum(map(len, kls))
  if weighting == "none":
    u = np.ones(2)
  elif weighting == "given":
    u = turn_w
  else:
    u = np.exp(-np.array([np.mean(k) for k in kls]) / 0.5)
  scale = n_tok / sum(ui * len(k) for ui, k in zip(u, kls))
  want = sum(scale * ui * sum(k) for ui, k in zip(u, kls)) / n_tok
  np.testing.assert_allclose(float(loss), want, rtol=1e-9)
  np.testing.assert_allclose(float(aux["kl"]), sum(map(sum, kls)) / n_tok, rtol=1e-9)


def test_lambda_is_the_gradient_norm_ratio_and_inactive_pairs_add_nothing(tok):
  with jax.enable_x64(True):
    _check_lambda(tok)


def _check_lambda(tok):
  student = _model(tok, 16, 0, jax.numpy.float64)
  graphdef, params, rest = nnx.split(student, nnx.Param, ...)
  rng = np.random.default_rng(1)
  ids = rng.integers(3, tok.vocab_size, (2, 8)).astype(np.int32)
  pair_ids = np.repeat(rng.integers(3, tok.vocab_size, (2, 8)), 2, axis=0).astype(np.int32)
  pair_ids[1::2, 6:] = rng.integers(3, tok.vocab_size, (2, 2))    # a⁻ differs in its tokens
  action = np.zeros((4, 8), bool)
  action[:, 6:] = True
  arrays = dict(ids=ids, attention_mask=np.ones((2, 8), bool),
                response_mask=np.array([[0] * 4 + [1] * 4] * 2, bool),
                teacher_logits=rng.normal(size=(2, 8, tok.vocab_size)),
                pairs_ids=pair_ids, pairs_attention=np.ones((4, 8), bool), pairs_action=action,
                differ=np.array([True, True]), valid=np.array([True, False]))
  arrays = {k: jax.numpy.asarray(v) for k, v in arrays.items()}
  kw = dict(weighting="none", kl="full", sopd_temperature=1.0, beta=1.0)
  grads, aux = distill_loop.loss_and_grads(graphdef, params, rest, arrays, pref="preference", **kw)

  def rd(p):
    return distill_loop.response_distillation(
        nnx.merge(graphdef, p, rest), arrays["ids"], arrays["attention_mask"],
        arrays["response_mask"], arrays["teacher_logits"])[0]

  def pref(p):
    return distill_loop.preference_term(
        nnx.merge(graphdef, p, rest), arrays["pairs_ids"], arrays["pairs_attention"],
        arrays["pairs_action"], arrays["differ"], arrays["valid"], mode="preference")[0]

  g_rd, g_pref = jax.jit(jax.grad(rd))(params), jax.jit(jax.grad(pref))(params)
  lam = float(optax.tree.norm(g_rd) / optax.tree.norm(g_pref))
  assert float(aux["lambda"]) == pytest.approx(lam, rel=1e-9) and int(aux["active_pairs"]) == 1
  assert float(aux["grad_norm_ratio"]) == float(aux["lambda"])
  want = jax.tree.map(lambda a, b: a + lam * b, g_rd, g_pref)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-14)
  # A fixed λ replaces the ratio in the gradient and the loss; the ratio is still reported.
  cfg = distill_loop.default_config()
  assert distill_loop.loss_settings(cfg)["pref_lambda"] is None
  cfg.pref_lambda = 0.35
  assert distill_loop.loss_settings(cfg)["pref_lambda"] == 0.35
  grads, aux = distill_loop.loss_and_grads(graphdef, params, rest, arrays, pref="preference",
                                           pref_lambda=0.35, **kw)
  assert float(aux["lambda"]) == 0.35
  assert float(aux["grad_norm_ratio"]) == pytest.approx(lam, rel=1e-9)
  assert float(aux["loss"]) == pytest.approx(float(aux["rd"]) + 0.35 * float(aux["pref"]),
                                             rel=1e-12)
  want = jax.tree.map(lambda a, b: a + 0.35 * b, g_rd, g_pref)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-14)
  # The pair the mask drops and a pair whose actions agree contribute exactly zero.
  off = dict(arrays, differ=jax.numpy.array([False, True]), valid=jax.numpy.array([True, False]))
  grads, aux = distill_loop.loss_and_grads(graphdef, params, rest, off, pref="preference", **kw)
  assert float(aux["pref"]) == 0.0 and float(aux["lambda"]) == 0.0
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(g_rd)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


# -- end to end on ALFWorld --------------------------------------------------------------------


class StubTeacher:
  """HAD's teacher queries answered by rule: with the harness, go to the fridge; without it,
  look (`garbage`: no action at all, a malformed teacher; `first_only`: only the first state's
  answers differ, the harness changes nothing later)."""

  def __init__(self, garbage=False, first_only=False):
    self.garbage, self.first_only = garbage, first_only

  def __call__(self, contexts):
    out, harnessed = [], 0
    for c in contexts:
      fridge = "<harness_state>" in c and not (self.first_only and harnessed)
      harnessed += "<harness_state>" in c
      text = "" if self.garbage else "Think: x\nAction: " + ("go to fridge 1" if fridge else "look")
      out.append(rollouts.Generated(text, 5, 10))
    return out


@dataclasses.dataclass(frozen=True)
class LyingGame:
  """Games whose rewards, scores and success flags are changed (nothing else)."""

  maker: HarnessedGameMaker

  def __call__(self, task):
    game = self.maker(task)
    step = game.step

    def lying_step(action):
      obs, reward, terminated, truncated, info = step(action)
      return obs, reward + 100.0, terminated, truncated, dict(info, won=True, score=99.0)

    game.step = lying_step
    return game


@pytest.fixture(scope="module")
def setup(tok):
  tasks = alfworld.tasks("seen", per_type=2, task_types=("pick_and_place_simple",))
  return tok, _model(tok, 16, 0), _model(tok, 32, 1), tasks


def _cfg(method, **kw):
  c = distill_loop.default_config()
  c.method = method
  c.episodes_per_step, c.batch_size, c.max_turns, c.window = 1, 1, 2, 1
  c.max_new_tokens, c.length_bucket = 12, 1024
  c.guided.p0 = 1.0
  c.train.num_steps, c.train.checkpoint_every, c.train.log_every = 1, 0, 0
  for k, v in kw.items():
    c[k] = v
  return c


def _run(setup, tmp_path, method, *, teacher_generate=None, make_game=None, max_steps=None,
         workdir=None, **kw):
  tok, student, teacher, tasks = setup
  if method in ("had",) + distill_loop.ABLATIONS and teacher_generate is None:
    teacher_generate = StubTeacher()
  return distill_loop.train(_cfg(method, **kw), student, tok, teacher,
                            make_game or HarnessedGameMaker(max_steps=5), tasks,
                            workdir=str(workdir or tmp_path / method), progress=False,
                            teacher_generate=teacher_generate, max_steps_this_run=max_steps,
                            teacher_tokenizer=tok)


def _two_turns(setup, tmp_path, method):
  """`(cfg, turns, prompt)`: a 2-turn student rollout of one task and the student's prompt."""
  tok, student, teacher, tasks = setup
  cfg = _cfg(method)
  turns, _ = distill_loop.collect(cfg, 0, student, tok, teacher, HarnessedGameMaker(max_steps=5),
                                  tasks[:1], log_path=str(tmp_path / "log.jsonl"))
  assert len(turns) == 2
  return cfg, turns, rollouts.LMGenerator(student, tok, max_new_tokens=1).prompt


@pytest.mark.slow
@pytest.mark.parametrize("method", distill_loop.ALL_METHODS)
def test_micro_update_of_every_method(setup, tmp_path, method):
  _, result = _run(setup, tmp_path, method)
  (rec,) = result.history
  assert np.isfinite(rec["value"]) and rec["grad_norm"] > 0 and rec["turns"] == 2
  assert rec["student_tokens"] > 0 and rec["teacher_scored_tokens"] > rec["student_tokens"]
  if method == "guided_opd":
    assert rec["teacher_prob"] == 1.0 and rec["teacher_turns"] == 2
  if method in ("had", "no_negative_action"):
    # The stub teacher's two answers differ at every state; none contradicts the record.
    assert rec["pairs_differ"] == 2 and rec["active_pairs"] == 2 and rec["pref"] > 0
    assert rec["lambda"] == rec["grad_norm_ratio"] > 0     # the balancing, as published
  if method == "no_preference" or method in ("opd", "sage_opd", "sopd"):
    assert rec["pref"] == 0 and rec["lambda"] == 0 and rec["grad_norm_ratio"] == 0
  with open(tmp_path / method / "metrics.jsonl") as f:
    assert len(f.readlines()) == 1
  # HAD's pairs are kept beside the rollout log, one per visited state, in the log's order.
  pairs_path = tmp_path / method / "rollouts" / "pairs_step_000000.jsonl"
  if distill_loop.loss_settings(_cfg(method))["pref"] is None:
    assert not pairs_path.exists()
  else:
    log = [r for r in rollouts.read_log(str(tmp_path / method / "rollouts" /
                                            "step_000000.jsonl")) if r["kind"] == "turn"]
    pairs = [json.loads(line) for line in pairs_path.read_text().splitlines()]
    assert [(p["episode"], p["turn"], p["action"]) for p in pairs] == [
        (r["episode"], r["turn"], r["action"]) for r in log]
    # The stub teacher: "go to fridge 1" with the harness, "look" without.
    assert all(p["differ"] and p["valid"] and not p["unparsable"] for p in pairs)
    assert {(p["positive"], p["negative"]) for p in pairs} == {("go to fridge 1", "look")}


@pytest.mark.slow
def test_resume_is_exact(setup, tmp_path):
  tok, student, teacher, tasks = setup
  cfg = _cfg("sopd")
  cfg.train.num_steps = 2
  run = functools.partial(distill_loop.train, cfg, student, tok, teacher,
                          HarnessedGameMaker(max_steps=5), tasks, progress=False)
  m_full, r_full = run(workdir=str(tmp_path / "a"))
  run(workdir=str(tmp_path / "b"), max_steps_this_run=1)
  m_split, r_split = run(workdir=str(tmp_path / "b"))
  for a, b in zip(jax.tree.leaves(nnx.state(m_full, nnx.Param)),
                  jax.tree.leaves(nnx.state(m_split, nnx.Param))):
    np.testing.assert_array_equal(a, b)
  drop = lambda r: {k: v for k, v in r.items() if k != "step_time"}  # noqa: E731
  assert [drop(r) for r in r_full.history] == [drop(r) for r in r_split.history]


@pytest.mark.slow
def test_malformed_teacher_outputs_are_counted_and_the_run_goes_on(setup, tmp_path):
  _, result = _run(setup, tmp_path, "had", teacher_generate=StubTeacher(garbage=True))
  (rec,) = result.history
  assert rec["teacher_unparsable"] == rec["turns"] == 2
  assert rec["active_pairs"] == 0 and rec["pref"] == 0 and np.isfinite(rec["value"])


@pytest.mark.slow
def test_only_the_states_whose_answers_differ_are_paired(setup, tmp_path):
  tok, _, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "had")
  data = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt,
                                      teacher_generate=StubTeacher(first_only=True))
  assert data.stats["pairs_differ"] == 1 and data.stats["pairs_invalid"] == 0
  # One pair (a positive and a negative row), averaged over both states.
  assert data.pairs.ids.shape[0] == 2 and data.pair_states == 2
  assert data.differ.tolist() == [True] and data.valid.tolist() == [True]
  # The queries go to the teacher `query_batch` at a time, with the same labels.
  calls = []
  counting = lambda contexts: calls.append(len(contexts)) or StubTeacher(first_only=True)(  # noqa: E731
      contexts)
  cfg.query_batch = 3
  again = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt,
                                       teacher_generate=counting)
  assert calls == [3, 1] and again.stats == data.stats
  same = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt,
                                      teacher_generate=StubTeacher(garbage=True))
  # No state differs: one inactive pair stands in, so the shapes stay static.
  assert same.stats["pairs_differ"] == 0 and same.differ.tolist() == [False]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sage_opd"])
def test_reward_and_success_never_reach_the_loss(setup, tmp_path, method):
  honest, r1 = _run(setup, tmp_path, method, workdir=tmp_path / "honest")
  lying, r2 = _run(setup, tmp_path, method, workdir=tmp_path / "lying",
                   make_game=LyingGame(HarnessedGameMaker(max_steps=5)))
  # The logs do differ in reward and success ...
  honest_log = rollouts.read_log(str(tmp_path / "honest" / "rollouts" / "step_000000.jsonl"))
  lying_log = rollouts.read_log(str(tmp_path / "lying" / "rollouts" / "step_000000.jsonl"))
  turns = lambda log: [r for r in log if r["kind"] == "turn"]  # noqa: E731
  assert [r["reward"] + 100 for r in turns(honest_log)] == [r["reward"] for r in turns(lying_log)]
  assert all(r["won"] for r in turns(lying_log))
  # ... and the update does not.
  for a, b in zip(jax.tree.leaves(nnx.state(honest, nnx.Param)),
                  jax.tree.leaves(nnx.state(lying, nnx.Param))):
    np.testing.assert_array_equal(a, b)
  drop = lambda r: {k: v for k, v in r.items() if k != "step_time"}  # noqa: E731
  assert drop(r1.history[0]) == drop(r2.history[0])


@pytest.mark.slow
def test_no_preference_is_opd_to_the_bit(setup, tmp_path):
  # The ablation removes the preference term and nothing else: with one seed it must make
  # OPD's rollouts and OPD's update (the paper reports 43.5 % for both).
  opd, r1 = _run(setup, tmp_path, "opd")
  ablated, r2 = _run(setup, tmp_path, "no_preference")
  for a, b in zip(jax.tree.leaves(nnx.state(opd, nnx.Param)),
                  jax.tree.leaves(nnx.state(ablated, nnx.Param))):
    np.testing.assert_array_equal(a, b)
  drop = lambda r: {k: v for k, v in r.items() if k != "step_time"}  # noqa: E731
  assert drop(r1.history[0]) == drop(r2.history[0]) and r1.history[0]["grad_norm"] > 0


@pytest.mark.slow
def test_a_turn_rows_do_not_depend_on_later_turns(setup, tmp_path):
  tok, _, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "sage_opd")
  full = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt)
  first = distill_loop.build_step_data(cfg, turns[:1], tok, teacher, prompt=prompt)
  np.testing.assert_array_equal(full.ids[0], first.ids[0])
  np.testing.assert_array_equal(full.response_mask[0], first.response_mask[0])
  np.testing.assert_allclose(full.turn_weights[0], first.turn_weights[0], rtol=1e-5)


def test_turns_after_a_rejected_action_are_marked(tmp_path):
  # Two episodes interleaved in the log, as a batched rollout writes them. Episode 0: accepted,
  # rejected, rejected, accepted; episode 1: an unparsable output (no verdict: not a
  # rejection), then a rejected action with the verdict flag missing from another (not marked).
  def turn(ep, action, accepted):
    harness = None if accepted is None else ({} if accepted == "?" else {"accepted": accepted})
    return dict(kind="turn", episode=ep, context=f"c{ep}-{len(log)}", output="o",
                reasoning="r", action=action, harness=harness, observation="x", reward=0.0)
  log = []
  for ep, action, accepted in ((0, "go to a", True), (1, None, None), (0, "take b", False),
                               (1, "take c", False), (0, "take b", False), (1, "look", "?"),
                               (0, "look", True), (1, "look", True)):
    log.append(turn(ep, action, accepted))
  path = tmp_path / "log.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in
                            [{"format": rollouts.LOG_FORMAT}] + log) + "\n")
  collector = types.SimpleNamespace(contexts=[r["context"] for r in log],
                                    by_teacher=[False] * len(log))
  turns = distill_loop._turns_from_log(str(path), collector)
  assert [t["after_rejection"] for t in turns] == [False, False, False, False, True, True,
                                                   True, False]
  assert [t["episode"] for t in turns] == [0, 1, 0, 1, 0, 1, 0, 1]
  # Nothing the loss must not read rides along.
  assert not {"reward", "harness", "won", "score"} & set(turns[0])


@pytest.mark.slow
def test_dropping_the_turns_after_a_rejection_is_training_on_the_others(setup, tmp_path):
  tok, student, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "opd")
  turns = [dict(turns[0], after_rejection=False), dict(turns[1], after_rejection=True)]
  keep = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt)
  cfg.rd_after_rejection = "drop"
  drop = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt)
  alone = distill_loop.build_step_data(cfg, turns[:1], tok, teacher, prompt=prompt)
  assert keep.response_mask[1].any() and not drop.response_mask[1].any()
  np.testing.assert_array_equal(keep.response_mask[0], drop.response_mask[0])
  assert keep.stats["turns_after_rejection"] == drop.stats["turns_after_rejection"] == 1
  assert keep.stats["rd_dropped_turns"] == 0 and drop.stats["rd_dropped_turns"] == 1
  assert drop.stats["student_tokens"] == alone.stats["student_tokens"] == int(
      keep.response_mask[0].sum())
  # The update is the one on the first turn alone, and differs from keeping both.
  graphdef, params, rest = nnx.split(student, nnx.Param, ...)
  settings = distill_loop.loss_settings(cfg)
  run = lambda d: distill_loop.loss_and_grads(graphdef, params, rest,  # noqa: E731
                                              distill_loop.loss_arrays(d), **settings)
  (g_drop, a_drop), (g_alone, a_alone), (g_keep, _) = run(drop), run(alone), run(keep)
  np.testing.assert_allclose(a_drop["rd"], a_alone["rd"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_drop), jax.tree.leaves(g_alone)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(g_drop),
                                                    jax.tree.leaves(g_keep)))


@pytest.mark.slow
def test_pairs_against_the_reasoning_leave_the_preference_term(setup, tmp_path):
  tok, student, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "had")
  # The stub teacher's a⁺ is "go to fridge 1": against the first turn's reasoning, which names
  # the action taken; the second names nothing.
  said = [("I look around first.", "look"), ("Nothing here yet.", "look")]
  turns = [dict(t, reasoning=r, action=a, output=f"Think: {r}\nAction: {a}")
           for t, (r, a) in zip(turns, said)]
  build = lambda: distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt,  # noqa: E731
                                               teacher_generate=StubTeacher())
  keep = build()
  cfg.pref_against_reasoning = "drop"
  drop = build()
  assert [p["against_reasoning"] for p in drop.pair_log] == [True, False]
  assert [p["valid"] for p in keep.pair_log] == [True, True]
  assert [p["valid"] for p in drop.pair_log] == [False, True]
  assert keep.stats["pairs_against_reasoning"] == drop.stats["pairs_against_reasoning"] == 1
  np.testing.assert_array_equal(keep.valid[:2], [True, True])
  np.testing.assert_array_equal(drop.valid[:2], [False, True])
  _one_of_two_pairs_dropped(student, cfg, keep, drop, kept=1)


def _one_of_two_pairs_dropped(student, cfg, keep, drop, *, kept):
  """Checks that `drop` is `keep` with the pair of turn `1 - kept` made inactive: every other
  input of the loss equal, L_RD unchanged, and the preference term by hand from the student's
  action scores (the dropped pair's state still counts in the term's denominator,
  `pair_states`, as the pairs the validity filter drops: the kept pair's loss over 2)."""
  for f in ("ids", "attention_mask", "response_mask", "positions", "teacher_logits", "differ"):
    np.testing.assert_array_equal(getattr(keep, f), getattr(drop, f))
  np.testing.assert_array_equal(keep.pairs.ids, drop.pairs.ids)
  graphdef, params, rest = nnx.split(student, nnx.Param, ...)
  settings = distill_loop.loss_settings(cfg)
  run = lambda d: distill_loop.loss_and_grads(graphdef, params, rest,  # noqa: E731
                                              distill_loop.loss_arrays(d), **settings)[1]
  a_keep, a_drop = run(keep), run(drop)
  assert int(a_keep["active_pairs"]) == 2 and int(a_drop["active_pairs"]) == 1
  np.testing.assert_allclose(a_keep["rd"], a_drop["rd"], rtol=1e-6)
  pos, neg = (np.asarray(x, np.float64) for x in had.action_means(student, keep.pairs))
  softplus = lambda x: np.log1p(np.exp(x))  # noqa: E731
  np.testing.assert_allclose(a_keep["pref"], softplus(neg[:2] - pos[:2]).sum() / 2, rtol=1e-5)
  np.testing.assert_allclose(a_drop["pref"], softplus(neg[kept] - pos[kept]) / 2, rtol=1e-5)


@pytest.mark.slow
def test_pairs_after_a_rejection_leave_the_preference_term(setup, tmp_path):
  tok, student, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "had")
  # The second turn follows a rejected action (as `collect` marks it from the monitor).
  turns = [dict(t, after_rejection=i == 1) for i, t in enumerate(turns)]
  build = lambda: distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt,  # noqa: E731
                                               teacher_generate=StubTeacher())
  keep = build()
  cfg.pref_after_rejection = "drop"
  drop = build()
  assert [p["after_rejection"] for p in drop.pair_log] == [False, True]
  assert [p["valid"] for p in keep.pair_log] == [True, True]
  assert [p["valid"] for p in drop.pair_log] == [True, False]
  # Counted whether or not they are dropped, as pairs_against_reasoning.
  assert keep.stats["pairs_after_rejection"] == drop.stats["pairs_after_rejection"] == 1
  _one_of_two_pairs_dropped(student, cfg, keep, drop, kept=0)


def test_padded_rows_by_hand():
  pr = distill_loop.padded_rows
  assert [pr(n, 8) for n in (1, 3, 5, 8, 9, 17, 71)] == [1, 4, 8, 8, 16, 24, 72]
  assert pr(71, None) == 128 and pr(5, 6) == 6 and pr(7, 3) == 9
  with pytest.raises(ValueError, match="n"):
    pr(0, 8)


@pytest.mark.slow
def test_rows_padded_to_the_chunk_score_as_a_power_of_two(setup, tmp_path):
  tok, _, teacher, _ = setup
  cfg, turns, prompt = _two_turns(setup, tmp_path, "sage_opd")
  turns = turns * 2 + turns[:1]                 # 5 turns
  cfg.chunk = None
  whole = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt)
  cfg.chunk = 2
  chunked = distill_loop.build_step_data(cfg, turns, tok, teacher, prompt=prompt)
  assert whole.ids.shape[0] == 8 and chunked.ids.shape[0] == 6
  np.testing.assert_array_equal(whole.ids[:6], chunked.ids)
  np.testing.assert_allclose(whole.turn_weights[:6], chunked.turn_weights, rtol=1e-5)
  np.testing.assert_allclose(whole.teacher_logits[:6], chunked.teacher_logits, rtol=1e-5,
                             atol=1e-5)
  assert chunked.turn_weights[5] == 0


def test_bad_configs_are_named(setup, tmp_path):
  tok, student, teacher, tasks = setup
  for field, value, match in (("method", "dpo", "method"), ("kl", "forward", "kl"),
                              ("teacher_budget", 3, "teacher_budget"),
                              ("max_turns", 0, "max_turns"), ("query_batch", 0, "query_batch"),
                              ("chunk", 0, "chunk"),
                              ("rd_after_rejection", "mask", "rd_after_rejection"),
                              ("pref_against_reasoning", "mask", "pref_against_reasoning"),
                              ("pref_after_rejection", "mask", "pref_after_rejection"),
                              ("pref_lambda", -0.5, "pref_lambda"),
                              ("pref_lambda", float("nan"), "pref_lambda")):
    cfg = _cfg("opd")
    cfg[field] = value
    with pytest.raises(ValueError, match=match):
      distill_loop.train(cfg, student, tok, teacher,
                         HarnessedGameMaker(), tasks, workdir=str(tmp_path / "bad"))
  with pytest.raises(ValueError, match="kl"):
    distill_loop.check_config(_cfg("guided_opd", kl="sampled"))
  with pytest.raises(ValueError, match="tasks"):
    distill_loop.train(_cfg("opd"), student, tok, teacher, HarnessedGameMaker(), [],
                       workdir=str(tmp_path / "bad"))


# -- memory: logits only where the loss reads them, rows in chunks ------------------------------


def test_response_positions_by_hand():
  response = np.array([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
  attention = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  got = distill_loop.response_positions(response, attention, multiple=4)
  # Position t predicts token t + 1: row 0's response tokens 2, 3 are predicted at 1, 2.
  np.testing.assert_array_equal(got, [[1, 2, -1, -1], [0, 1, 2, 3], [-1, -1, -1, -1]])
  with pytest.raises(ValueError, match="response_mask"):
    distill_loop.response_positions(response[:, :4], attention)


def _step_arrays(tok, rng, n=4, t=9, m=3, positions=True):
  ids = rng.integers(3, tok.vocab_size, (n, t)).astype(np.int32)
  attention = np.ones((n, t), bool)
  attention[1, 7:] = False
  response = np.zeros((n, t), bool)
  response[:, 5:] = True
  response[1, 7:] = False
  response[3] = False                       # a row without response tokens (padding)
  full = rng.normal(size=(n, t, tok.vocab_size))
  pair_ids = rng.integers(3, tok.vocab_size, (2 * m, 8)).astype(np.int32)
  action = np.zeros((2 * m, 8), bool)
  action[:, 6:] = True
  arrays = dict(ids=ids, attention_mask=attention, response_mask=response,
                turn_weights=np.array([0.2, 0.7, 1.5, 0.0]), pairs_ids=pair_ids,
                pairs_attention=np.ones((2 * m, 8), bool), pairs_action=action,
                differ=np.array([True, True, False]), valid=np.array([True, False, True]),
                pair_states=np.asarray(5.0))
  if positions:
    pos = distill_loop.response_positions(response, attention, multiple=4)
    arrays["positions"] = pos
    arrays["teacher_logits"] = np.take_along_axis(full, np.maximum(pos, 0)[..., None], axis=1)
  else:
    arrays["teacher_logits"] = full
  return {k: jax.numpy.asarray(v) for k, v in arrays.items()}, full


@pytest.mark.parametrize("weighting", ["none", "given", "sopd"])
def test_logits_at_the_response_positions_give_the_full_loss(tok, weighting):
  with jax.enable_x64(True):
    student = _model(tok, 16, 0, jax.numpy.float64)
    compact, full = _step_arrays(tok, np.random.default_rng(2))
    kw = dict(weighting=weighting, sopd_temperature=0.5)
    args = [compact[k] for k in ("ids", "attention_mask", "response_mask")]
    want = nnx.jit(lambda m: distill_loop.response_distillation(
        m, *args, jax.numpy.asarray(full), None, compact["turn_weights"], **kw))(student)
    got = nnx.jit(lambda m: distill_loop.response_distillation(
        m, *args, compact["teacher_logits"], None, compact["turn_weights"],
        positions=compact["positions"], **kw))(student)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-12)
    np.testing.assert_allclose(float(got[1]["kl"]), float(want[1]["kl"]), rtol=1e-12)
    # The teacher's scores at the positions are its full forward's rows there.
    teacher = _model(tok, 32, 1, jax.numpy.float64)
    ids, att, pos = (np.asarray(compact[k]) for k in ("ids", "attention_mask", "positions"))
    whole, _ = distill_loop.teacher_scores(teacher, ids, att, kl="full")
    parts, _ = distill_loop.teacher_scores(teacher, ids, att, kl="full", positions=pos, chunk=3)
    gathered = np.take_along_axis(np.asarray(whole), np.maximum(pos, 0)[..., None], axis=1)
    np.testing.assert_allclose(np.asarray(parts), gathered, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("weighting,pref", [("none", "preference"), ("given", None),
                                            ("sopd", None), ("none", "positive_only")])
def test_chunks_give_the_whole_batch_update(tok, weighting, pref):
  with jax.enable_x64(True):
    student = _model(tok, 16, 0, jax.numpy.float64)
    graphdef, params, rest = nnx.split(student, nnx.Param, ...)
    arrays, _ = _step_arrays(tok, np.random.default_rng(3))
    kw = dict(weighting=weighting, kl="full", sopd_temperature=0.5, pref=pref, beta=1.0)
    g1, a1 = distill_loop.loss_and_grads(graphdef, params, rest, arrays, chunk=None, **kw)
    g3, a3 = distill_loop.loss_and_grads(graphdef, params, rest, arrays, chunk=3, **kw)
    for k in a1:
      np.testing.assert_allclose(float(a3[k]), float(a1[k]), rtol=1e-10, atol=1e-14)
    for a, b in zip(jax.tree.leaves(g3), jax.tree.leaves(g1)):
      np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14)
    # The unchunked loss is response_distillation's and the preference term averaged over the
    # visited states (pair_states), not over the pairs kept.
    rd, _ = distill_loop.response_distillation(
        student, arrays["ids"], arrays["attention_mask"], arrays["response_mask"],
        arrays["teacher_logits"], None, arrays["turn_weights"], weighting=weighting,
        sopd_temperature=0.5, positions=arrays["positions"])
    np.testing.assert_allclose(float(a1["rd"]), float(rd), rtol=1e-12)
    if pref == "preference":
      p, active = distill_loop.preference_term(
          student, arrays["pairs_ids"], arrays["pairs_attention"], arrays["pairs_action"],
          arrays["differ"], arrays["valid"], mode=pref)
      np.testing.assert_allclose(float(a1["pref"]), float(p) * 3 / 5, rtol=1e-12)
      assert int(a1["active_pairs"]) == int(active) == 1
    with pytest.raises(ValueError, match="chunk"):
      distill_loop.loss_and_grads(graphdef, params, rest, arrays, chunk=0, **kw)
