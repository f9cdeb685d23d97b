"""Proxy-optimum estimates from logs: categorizer, JSONL reading with errors,
per-decision KL accumulation (ranking on synthetic logs with known truth:
tests/studies/test_synthetic_logs.py)."""

import io
import json

import numpy as np
import pytest

from harnax.estimate import proxy


@pytest.mark.parametrize("text,category", [
    ("cat src/main.py", "inspect_file"), ("grep -rn foo .", "inspect_file"),
    ("ls -la", "inspect_file"),
    ("sed -i 's/a/b/' x.py", "edit"), ("apply_patch <<EOF", "edit"), ("cat > new.py", "edit"),
    ("echo hi > out.txt", "edit"), ("pytest -q tests", "run_command"), ("$ make", "run_command"),
    ("python run.py", "run_command"), ("Plan: read the test first", "plan"),
    ("I will inspect the config", "plan"), ("sure, done", "other"), ("", "other"),
])
def test_default_categorizer(text, category):
  assert proxy.coding_agent_category(text) == category


def _episode(eid, harness="h", actor="policy", outcome=1.0, steps=None):
  if steps is None:
    steps = [{"state": 0, "policy_samples": ["cat a"], "proxy_samples": ["pytest"]}]
  return {"episode_id": eid, "harness": harness, "actor": actor, "outcome": outcome,
          "steps": steps}


def test_malformed_lines_are_reported_with_line_numbers_and_the_rest_is_read(tmp_path):
  lines = [
      json.dumps(_episode("e1")),
      "{not json",
      json.dumps({"episode_id": "e2", "harness": "h", "steps": []}),          # no outcome
      "",                                                                    # blank: skipped
      json.dumps(_episode("e3", outcome="high")),
      json.dumps(_episode("e4", steps=[{"state": 1, "policy_samples": [],
                                        "proxy_samples": ["ls"]}])),
      json.dumps(_episode("e5", actor="teacher")),
      json.dumps(_episode("e6", actor="proxy", steps=[])),
      "[1, 2]",
  ]
  path = tmp_path / "logs.jsonl"
  path.write_text("\n".join(lines) + "\n")
  parsed = proxy.read_episodes(path)
  assert [e.episode_id for e in parsed.episodes] == ["e1", "e6"]
  assert [e.line for e in parsed.episodes] == [1, 8]
  assert [e.line for e in parsed.errors] == [2, 3, 5, 6, 7, 9]
  msgs = dict(parsed.errors)
  assert "outcome" in msgs[3] and "outcome" in msgs[5]
  assert "policy_samples" in msgs[6] and "actor" in msgs[7]
  # Every non-blank line is accounted for.
  assert len(parsed.episodes) + len(parsed.errors) == sum(1 for l in lines if l.strip())
  with pytest.raises(ValueError, match=r"6 malformed line\(s\): line 2: .*line 9"):
    proxy.read_episodes(str(path), strict=True)
  # Other sources: an open file and an iterable of lines.
  assert len(proxy.read_episodes(io.StringIO("\n".join(lines))).episodes) == 2
  assert len(proxy.read_episodes(lines).errors) == 6


def test_unknown_category_raises_naming_the_decision():
  eps = proxy.read_episodes([json.dumps(_episode("e1"))]).episodes
  with pytest.raises(ValueError, match=r"unknown category 'weird'.*episode 'e1' \(line 1\)"):
    proxy.proxy_estimates(eps, categorizer=lambda t: "weird")
  with pytest.raises(ValueError, match="categories"):
    proxy.proxy_estimates(eps, categories=("a", "a"))


def test_empty_input_raises():
  with pytest.raises(ValueError, match="episodes"):
    proxy.proxy_estimates([])
  with pytest.raises(ValueError, match="policy_counts"):
    proxy.decision_kl([0, 0], [1, 1])
  with pytest.raises(ValueError, match="tau"):
    proxy.proxy_estimates(proxy.read_episodes([json.dumps(_episode("e"))]).episodes, tau=0.0)


def test_decision_kl_matches_numpy():
  p, q, alpha = np.array([3.0, 1.0, 0.0]), np.array([1.0, 1.0, 2.0]), 0.25
  ph = p / 4
  qt = (q + alpha) / (4 + 3 * alpha)
  want = np.sum(ph[:2] * np.log(ph[:2] / qt[:2]))
  assert proxy.decision_kl(p, q, smoothing=alpha, miller_madow=False) == pytest.approx(want)
  assert proxy.decision_kl(p, q, smoothing=alpha) == pytest.approx(max(want - 1 / 8, 0.0))


def test_mismatch_accumulates_with_the_number_of_decisions():
  step = {"state": 0, "policy_samples": ["cat a", "cat a", "pytest", "Plan: x"],
          "proxy_samples": ["pytest", "pytest", "pytest", "ok"]}
  eps = proxy.read_episodes([
      json.dumps(_episode("short", harness="few", steps=[step] * 2)),
      json.dumps(_episode("long", harness="many", steps=[step] * 6)),
  ]).episodes
  est = proxy.proxy_estimates(eps)
  assert est["few"].mismatch_per_decision == pytest.approx(est["many"].mismatch_per_decision)
  assert est["many"].mismatch == pytest.approx(3 * est["few"].mismatch)
  assert est["many"].decisions_per_episode == 6
  assert np.isnan(est["few"].ceiling)        # no proxy episodes logged


def test_exact_distributions_replace_samples_and_match_numpy():
  # Decision 1: the policy's exact distribution against the proxy's samples (smoothed);
  # decision 2: samples against the proxy's exact distribution (no smoothing on that side).
  steps = [{"state": 0, "policy_probs": {"cat a": 0.5, "ls": 0.25, "pytest": 0.25},
            "proxy_samples": ["pytest", "pytest", "cat b"]},
           {"state": 1, "policy_samples": ["pytest", "sure", "fine", "ok then"],
            "proxy_probs": {"pytest": 0.5, "Plan: y": 0.3, "ok": 0.2}}]
  parsed = proxy.read_episodes([json.dumps(_episode("e", steps=steps))])
  assert parsed.errors == []
  (ep,) = parsed.episodes
  assert ep.steps[0].policy_probs == (("cat a", 0.5), ("ls", 0.25), ("pytest", 0.25))
  # Categories (inspect_file, edit, run_command, plan, other); alpha = 1/4, K = 5.
  p1 = np.array([0.75, 0, 0.25, 0, 0])
  q1 = (np.array([1, 0, 2, 0, 0]) + 0.25) / (3 + 1.25)
  kl1 = np.sum(p1[[0, 2]] * np.log(p1[[0, 2]] / q1[[0, 2]]))     # no Miller–Madow: exact p
  p2, q2 = np.array([0.25, 0.75]), np.array([0.5, 0.2])      # run_command, other
  kl2 = max(np.sum(p2 * np.log(p2 / q2)) - (2 - 1) / (2 * 4), 0.0)  # Miller–Madow on p
  assert kl2 > 0.5
  est = proxy.proxy_estimates(parsed.episodes, discount=0.5, tau=2.0)["h"]
  assert est.mismatch == pytest.approx(2.0 * (kl1 + 0.5 * kl2), rel=1e-12)
  # An exact proxy with no mass on a category the policy used: infinite KL.
  assert proxy.decision_kl([1, 1], [1.0, 0.0], proxy_exact=True) == np.inf
  assert proxy.decision_kl([0.5, 0.5], [0.5, 0.5], policy_exact=True,
                           proxy_exact=True) == 0.0


@pytest.mark.parametrize("probs,match", [
    ({"a": 0.5, "b": 0.6}, "summing to 1"), ({"a": -0.5, "b": 1.5}, "probability >= 0"),
    ([0.5, 0.5], "object of output"), ({}, "non-empty object"),
    ({"a": True}, "probability >= 0"),
])
def test_bad_distributions_are_reported_on_their_line(probs, match):
  step = {"state": 0, "policy_samples": ["ls"], "proxy_probs": probs}
  parsed = proxy.read_episodes([json.dumps(_episode("e1")), json.dumps(_episode("e2",
                                                                                steps=[step]))])
  assert [e.episode_id for e in parsed.episodes] == ["e1"]
  ((line, msg),) = parsed.errors
  assert line == 2 and "steps[0].proxy_probs" in msg and match in msg
  with pytest.raises(ValueError, match="proxy_counts: expected non-negative probabilities"):
    proxy.decision_kl([1, 0], [0.7, 0.7], proxy_exact=True)
