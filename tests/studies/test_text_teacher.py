"""A text-game teacher that wins, at CI size: the teacher's recipe (configs/text_agents.py,
variant "micro_teacher") trained on the expert's walkthroughs of 8 seen bathroom tasks plays
those tasks greedily through the harness and wins them, where a random admissible agent wins
none. Generalization to other instances needs the full build (docs/text_agents.md, "Status");
this checks that the whole path (walkthroughs, tokenizer, SFT, checkpoint, batched rollouts,
parser, harness) yields an agent that wins, not only one that runs."""

import math

import pytest

from configs import text_agents as config_lib
from harnax.studies import text_agents

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  cfg = config_lib.get_config("micro_teacher")
  cfg.agent_dir = str(tmp_path_factory.mktemp("micro_teacher") / "agent")
  directory = text_agents.build_agent(cfg, cfg.agent_dir)
  return cfg, text_agents.load_agent(directory)


def _one_sided_fisher(a: int, b: int, n: int) -> float:
  """P(agent wins >= a | a + b wins among 2n games, split at random): Fisher's exact test."""
  k = a + b
  return sum(math.comb(n, i) * math.comb(n, k - i) for i in range(a, min(k, n) + 1)
             ) / math.comb(2 * n, k)


def test_micro_teacher_wins_its_seen_tasks_where_random_does_not(teacher):
  cfg, (model, tok) = teacher
  tasks = text_agents.eval_tasks(cfg)["seen"]
  assert [t.ident for t in tasks] == [t.ident for t in text_agents.train_tasks(cfg)]
  traces, stats = text_agents.evaluate(model, tok, tasks, "with_harness", window=cfg.window,
                                       max_steps=cfg.eval.max_steps)
  rnd = text_agents.random_agent(tasks, max_steps=cfg.eval.max_steps, seed=0)
  won, rnd_won, n = sum(t.won for t in traces), sum(t.won for t in rnd), len(tasks)
  assert n == 8
  # A clear margin: most tasks won, and a difference a fair coin would give with p < 1 %.
  assert won >= 6, f"the micro teacher won {won}/{n} of its seen tasks"
  assert rnd_won <= 1
  assert _one_sided_fisher(won, rnd_won, n) < 0.01
  assert stats["parse_failures"] == 0


def test_fisher_helper_against_a_hand_count():
  # 8/8 against 0/8: the one table of 16 games with all 8 wins on one side, of C(16, 8).
  assert _one_sided_fisher(8, 0, 8) == pytest.approx(1 / 12870)
  # 1 win in all: it falls on the agent's side with probability 1/2.
  assert _one_sided_fisher(1, 0, 8) == pytest.approx(0.5)
