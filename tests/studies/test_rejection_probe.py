"""The states after a rejected action (harnax.studies.rejection_probe) on hand-written logs,
and the repeat count with a stand-in generator."""

import json

import pytest

from harnax.studies import rejection_probe
from harnax.train import rollouts


def _turn(episode, action, accepted, context="ctx", output=""):
  return {"kind": "turn", "episode": episode, "action": action, "context": context,
          "output": output, "harness": {"accepted": accepted}}


def _log():
  return [
      {"kind": "run"},
      # Episode 0: go (accepted), take rejected, then the turn after it.
      {"kind": "reset", "episode": 0, "task": {"ident": "a"}},
      _turn(0, "go to cabinet 1", True, "c0"),
      _turn(0, "take mug 2 from cabinet 1", False, "c1"),
      _turn(0, "take mug 2 from cabinet 1", False, "c2", "Think: x\nAction: take mug 2 from "
            "cabinet 1"),
      _turn(0, "go to cabinet 2", True, "c3"),
      # Episode 1: a rejected 'open' first, then a rejected 'take'.
      {"kind": "reset", "episode": 1, "task": {"ident": "b"}},
      _turn(1, "open fridge 3", False, "d0"),
      _turn(1, "take egg 1 from fridge 1", False, "d1"),
      _turn(1, "go to fridge 1", True, "d2"),
      # Episode 2: a turn without an action (never reached the game), then nothing rejected.
      {"kind": "reset", "episode": 2, "task": {"ident": "c"}},
      _turn(2, None, False, "e0"),
      _turn(2, "look", True, "e1"),
      # Episode 3: ends on its rejected action: no turn after it.
      {"kind": "reset", "episode": 3, "task": {"ident": "d"}},
      _turn(3, "take pen 1 from desk 1", False, "f0"),
  ]


def test_the_turn_after_the_first_rejection_of_each_episode():
  states = rejection_probe.after_rejection(_log())
  assert [(s.episode, s.turn, s.context, s.rejected) for s in states] == [
      (0, 2, "c2", "take mug 2 from cabinet 1"), (1, 1, "d1", "open fridge 3")]
  assert states[0].output.endswith("take mug 2 from cabinet 1")


def test_a_verb_keeps_only_its_rejections():
  states = rejection_probe.after_rejection(_log(), verb="take")
  assert [(s.episode, s.context, s.rejected) for s in states] == [
      (0, "c2", "take mug 2 from cabinet 1"), (1, "d2", "take egg 1 from fridge 1")]
  assert rejection_probe.after_rejection(_log(), verb="heat") == []


def test_logged_repeats_counts_every_turn_after_a_rejection():
  rate = rejection_probe.logged_repeats(_log())
  # Episode 0: two rejections followed by a turn (one repeat); episode 1: two (no repeat);
  # episode 2: the turn without an action is not a rejected action; episode 3: none after.
  assert (rate.successes, rate.trials) == (1, 4)


def test_training_repeats_reads_the_rollout_logs_only(tmp_path):
  logs = tmp_path / "rollouts"
  logs.mkdir()
  with pytest.raises(ValueError, match="workdir"):
    rejection_probe.training_repeats(str(tmp_path))
  header = {"kind": "run", "format": rollouts.LOG_FORMAT}
  for step in (0, 1):
    (logs / f"step_{step:06d}.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [header] + _log()[1:]) + "\n")
  # HAD's pairs beside them have no header: read as a log, they would be refused.
  (logs / "pairs_step_000000.jsonl").write_text(json.dumps({"episode": 0, "turn": 0}) + "\n")
  rate = rejection_probe.training_repeats(str(tmp_path))
  assert (rate.successes, rate.trials) == (2, 8)


def test_repeats_counts_answers_whose_action_is_the_rejected_one():
  states = rejection_probe.after_rejection(_log(), verb="take")
  answers = {"c2": "Think: again.\nAction: Take mug 2 from cabinet 1",   # normalized: a repeat
             "d2": "Think: elsewhere.\nAction: go to fridge 1"}
  calls = []

  def generate(contexts):
    calls.append(list(contexts))
    return [answers[c] for c in contexts]

  rate, outputs = rejection_probe.repeats(generate, states, batch_size=1)
  assert (rate.successes, rate.trials) == (1, 2)
  assert outputs == [answers["c2"], answers["d2"]]
  assert calls == [["c2"], ["d2"]]
  rate, _ = rejection_probe.repeats(lambda cs: ["no action here"] * len(cs), states)
  assert (rate.successes, rate.trials) == (0, 2)


def test_bad_generators_and_batch_sizes_get_a_clear_error():
  states = rejection_probe.after_rejection(_log())
  with pytest.raises(ValueError, match="generate: expected 2 outputs"):
    rejection_probe.repeats(lambda cs: ["Action: look"], states)
  with pytest.raises(ValueError, match="batch_size: expected an int >= 1"):
    rejection_probe.repeats(lambda cs: cs, states, batch_size=0)


def test_output_logprobs_against_a_hand_shifted_log_softmax(tmp_path):
  import jax
  import numpy as np

  from harnax import models
  from harnax.models import tokenizer as tokenizer_lib
  from harnax.policies import text_agent

  contexts = ["You open the cabinet 1. In it, you see a mug 3.", "Nothing happens."]
  outputs = ["Think: I take mug 3.\nAction: take mug 3 from cabinet 1", "Action: look"]
  tok = tokenizer_lib.train_tokenizer(contexts + outputs, str(tmp_path / "tok"), vocab_size=300)
  cfg = models.Qwen3Config.from_hf_dict({
      "architectures": ["Qwen3ForCausalLM"], "vocab_size": tok.vocab_size, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 512,
      "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id})
  model = models.from_config(cfg, seed=0)
  got = rejection_probe.output_logprobs(model, tok, contexts, outputs, batch_size=1)
  for c, o, value in zip(contexts, outputs, got):
    prompt = tok.encode(text_agent.format_prompt(tok, c), add_special_tokens=False)
    answer = tok.encode(o, add_special_tokens=False) + [tok.eos_token_id]
    ids = prompt + answer
    # One unpadded row; the logits at position t - 1 predict token t (causal attention makes
    # them those of the prefix alone).
    logits = np.asarray(model(jax.numpy.asarray([ids]))[0], np.float64)
    lse = logits.max(-1) + np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1))
    total = sum(logits[t - 1, ids[t]] - lse[t - 1] for t in range(len(prompt), len(ids)))
    assert value == pytest.approx(total, rel=1e-5)
  both = rejection_probe.output_logprobs(model, tok, contexts, outputs)   # one padded batch
  np.testing.assert_allclose(both, got, rtol=1e-5)
  with pytest.raises(ValueError, match="outputs: expected 2"):
    rejection_probe.output_logprobs(model, tok, contexts, outputs[:1])
