"""Synthetic deployment logs with known truth (harnax.studies.synthetic_logs) and the
proxy-optimum estimators on them: only C - M ranks the harnesses right."""

import numpy as np
import pytest

from harnax.estimate import proxy
from harnax.estimate import rank
from harnax.studies import synthetic_logs as synthetic

pytestmark = pytest.mark.x64


def test_synthetic_renderings_map_back_to_their_category():
  for cat, texts in synthetic.RENDERINGS.items():
    for t in texts:
      assert proxy.coding_agent_category(t) == cat


@pytest.fixture(scope="module")
def harnesses():
  return synthetic.synthetic_harnesses(seed=0)


def test_synthetic_truth_hits_its_targets(harnesses):
  for h in harnesses:
    c, m, _, _ = synthetic.DEFAULT_TARGETS[h.name]
    assert h.ceiling == pytest.approx(c, abs=1e-8)
    assert h.mismatch == pytest.approx(m, abs=1e-8)
    assert h.value == pytest.approx(h.ceiling - h.mismatch, abs=1e-8)   # J = C - M


def test_committed_synthetic_logs_rank_harnesses_like_exact_c_minus_m(harnesses):
  parsed = proxy.read_episodes(synthetic.DATA_FILE)
  assert parsed.errors == []
  h0 = harnesses[0]
  est = proxy.proxy_estimates(parsed.episodes, tau=h0.tau, discount=float(h0.mdp.discount))
  truth = sorted((h.name for h in harnesses),
                 key=lambda n: -next(h.value for h in harnesses if h.name == n))
  assert proxy.rank_harnesses(est) == truth
  # The ceiling alone and the mismatch alone rank them wrongly (the harness-transfer study's point).
  assert proxy.rank_harnesses(est, key="ceiling") != truth
  assert proxy.rank_harnesses(est, key="mismatch") != truth
  exact = np.array([h.value for h in harnesses])
  score = np.array([est[h.name].score for h in harnesses])
  assert float(rank.kendall_tau_b(score, exact)) == pytest.approx(1.0)
  assert float(rank.spearman(score, exact)) == pytest.approx(1.0)
  # C~ from the proxy's episodes is exact here (deterministic MDPs: the
  # regularized return of pi* telescopes to V*(s0)).
  for h in harnesses:
    assert est[h.name].ceiling == pytest.approx(h.ceiling, abs=1e-5)


def test_generator_writes_readable_logs(harnesses, tmp_path):
  recs = synthetic.synthetic_logs(harnesses[:2], seed=5, num_policy_episodes=3,
                                  num_proxy_episodes=2, num_samples=4)
  path = tmp_path / "small.jsonl"
  synthetic.write_jsonl(recs, path)
  parsed = proxy.read_episodes(path)
  assert parsed.errors == [] and len(parsed.episodes) == 10
  ep = parsed.episodes[0]
  assert ep.actor == "policy" and all(len(s.policy_samples) == 4 for s in ep.steps)
  # Logged states are non-terminal states of the harness's MDP.
  assert all(0 <= s.state < harnesses[0].mdp.num_states - 1 for s in ep.steps)
