"""Spec of `harnax.envs.miniwob.gym_env`: the registered gymnasium environments."""

import warnings

import gymnasium
from gymnasium.utils.env_checker import check_env
import numpy as np
import pytest

import harnax.envs  # registers the environments
from harnax.envs.miniwob import gym_env
from harnax.envs.miniwob import harnesses
from harnax.envs.miniwob import tasks

FAMILIES = tasks.FAMILIES
HARNESSES = harnesses.HARNESSES


def test_every_family_and_harness_is_registered():
  assert len(harnax.envs.ENV_IDS) == 18
  for family in FAMILIES:
    for h in HARNESSES:
      name = gym_env.env_id(family, h)
      assert name == f"harnax/{family}-{h}-v0"
      spec = gymnasium.spec(name)
      assert spec.max_episode_steps == gym_env.MAX_EPISODE_STEPS == 20
      assert spec.kwargs == dict(family=family, harness=h)
  assert gym_env.register_envs() == harnax.envs.ENV_IDS  # idempotent


@pytest.mark.parametrize("name", gym_env.ENV_IDS)
def test_check_env_passes_without_warnings(name):
  env = gymnasium.make(name)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    check_env(env.unwrapped)
  assert not [str(w.message) for w in caught]


# Closed form from the task bounds: wait + one click per element, + batches (H1,
# H5), + verify (H3, H5). Checkboxes / options: <= 6 boxes + Submit, batches are
# the 57 subsets of >= 2 of 6 boxes / the 6 (option, Submit) pairs. Tabs: 3 tabs
# + up to 3 * 20 links, one (tab, link) batch per link.
_ELEMENTS = {"click-checkboxes": 7, "click-option": 7, "click-tab-2": 63}
_BATCHES = {"click-checkboxes": 2**6 - 6 - 1, "click-option": 6, "click-tab-2": 60}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("h", HARNESSES)
def test_action_count_is_the_family_maximum(family, h):
  spec = harnesses.harness_spec(h)
  expected = 1 + _ELEMENTS[family] + spec.batch * _BATCHES[family] + spec.verify
  assert gym_env.max_num_actions(family, h) == expected
  assert gymnasium.make(gym_env.env_id(family, h)).action_space.n == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_spaces_cover_sampled_pages(family):
  # The largest pages (6 boxes / options) are the expensive ones to compile
  # under H5: take one of them, and a few small ones.
  large = next(s for s in range(400) if len(tasks.sample_task(family, s).elements) >= 7)
  for h in ("H0", "H5"):  # H5's notes and actions contain every other harness's
    env = gym_env.MiniWoBEnv(family, h)
    for seed in (large, 0, 1, 2):
      compiled = harnesses.compile_harness(tasks.sample_task(family, seed), h)
      assert len(compiled.actions) <= env.action_space.n
      for s in range(compiled.done_state + 1):
        assert compiled.observation(s) in env.observation_space, (seed, s)


def test_observation_bound_is_attained_and_exact_for_checkboxes():
  # Pages with six 8-character labels, any number of them named (with equal
  # label lengths only the number matters), under the check harness (H2: no
  # batches, cheap): the longest observation equals the bound.
  labels = tuple(f"abcdefg{i}" for i in range(6))
  longest = 0
  for mask in (0, 1, 3, 7, 15, 31, 63):
    task = tasks.CheckboxesTask(labels=labels, targets=tuple(bool(mask >> i & 1) for i in range(6)))
    c = harnesses.compile_harness(task, "H2")
    longest = max(longest, max(len(c.observation(s)) for s in range(c.done_state + 1)))
  assert longest == gym_env.max_observation_length("click-checkboxes", "H2")


@pytest.mark.parametrize("family", FAMILIES)
def test_reset_seed_draws_sample_task(family):
  env = gymnasium.make(gym_env.env_id(family, "H1"))
  obs, info = env.reset(seed=11)
  task = tasks.sample_task(family, 11)
  compiled = harnesses.compile_harness(task, "H1")
  assert env.unwrapped.task == task and info["task"] == task
  assert obs == compiled.observation(task.initial_state)
  assert info["state"] == task.initial_state
  assert info["action_names"] == tuple(a.name for a in compiled.actions)
  n = env.action_space.n
  mask = np.zeros(n, np.int8)
  mask[:len(compiled.actions)] = np.asarray(compiled.harness.pi_ref)[task.initial_state] > 0
  assert info["action_mask"].dtype == np.int8 and info["action_mask"].shape == (n,)
  np.testing.assert_array_equal(info["action_mask"], mask)
  # Unseeded resets draw fresh pages from the seeded generator.
  pages = {env.reset()[1]["task"] for _ in range(5)}
  assert len(pages) > 1


@pytest.mark.parametrize("family,h", [("click-checkboxes", "H2"), ("click-option", "H1"),
                                      ("click-tab-2", "H5")])
def test_steps_follow_the_compiled_mdp(family, h):
  env = gym_env.MiniWoBEnv(family, h)
  rng = np.random.default_rng(0)
  for seed in range(3):
    obs, info = env.reset(seed=seed)
    compiled = env.compiled
    p = np.asarray(compiled.harness.mdp.transitions)
    r = np.asarray(compiled.harness.mdp.rewards)
    avail = np.asarray(compiled.harness.pi_ref) > 0
    s = info["state"]
    for _ in range(30):
      mask = info["action_mask"]
      # Half the time an available action, otherwise any id (mostly unavailable).
      a = int(rng.choice(np.flatnonzero(mask))) if rng.random() < 0.5 else int(
          rng.integers(env.action_space.n))
      valid = a < len(compiled.actions) and bool(avail[s, a])
      executed = a if valid else harnesses.WAIT
      obs, reward, terminated, truncated, info = env.step(a)
      assert info["valid"] == valid and info["executed_action"] == executed
      assert p[s, executed, info["state"]] == 1.0
      assert reward == info["raw_reward"] == pytest.approx(float(r[s, executed]))
      assert terminated == (info["state"] == compiled.done_state)
      assert not truncated
      assert obs == compiled.observation(info["state"])
      s = info["state"]
      if terminated:
        break


def test_solving_a_page_earns_the_raw_reward():
  task = tasks.CheckboxesTask(labels=("ab", "cd", "ef"), targets=(True, False, True))
  env = gymnasium.make("harnax/click-checkboxes-H0-v0", task=task)
  _, info = env.reset(seed=0)
  names = info["action_names"]
  for name in ("click [1]", "click [3]", "click [4]"):
    _, reward, terminated, _, info = env.step(names.index(name))
  assert (reward, terminated) == (1.0, True)
  # A batch click under H1 does the same in one step.
  env = gymnasium.make("harnax/click-checkboxes-H1-v0", task=task)
  _, info = env.reset()
  _, reward, terminated, _, info = env.step(info["action_names"].index("click [1] [3]"))
  assert info["valid"] and not terminated and info["page"] == 0b101


def test_wrong_submit_is_blocked_by_the_check_harness():
  task = tasks.OptionTask(labels=("ab", "cd"), answer=1)
  for h, blocked in (("H0", False), ("H2", True)):
    env = gym_env.MiniWoBEnv("click-option", h, task=task)
    _, info = env.reset()
    _, reward, terminated, _, info = env.step(info["action_names"].index("click [3]"))
    assert terminated != blocked
    assert reward == (0.0 if blocked else -1.0)


def test_episodes_truncate_after_max_episode_steps():
  env = gymnasium.make("harnax/click-tab-2-H0-v0")
  env.reset(seed=0)
  for t in range(1, 21):
    _, _, terminated, truncated, _ = env.step(0)
    assert not terminated and truncated == (t == 20)


def test_splits_give_held_out_pages():
  train, test = tasks.task_split("click-option", 4, 3, seed=5)
  kw = dict(num_train=4, num_test=3, split_seed=5)
  env_train = gymnasium.make("harnax/click-option-H0-v0", split="train", **kw)
  env_test = gymnasium.make("harnax/click-option-H0-v0", split="test", **kw)
  env_train.reset(seed=0)
  env_test.reset(seed=0)
  seen_train = {env_train.reset()[1]["task"] for _ in range(20)}
  seen_test = {env_test.reset()[1]["task"] for _ in range(20)}
  assert seen_train <= set(train) and seen_test <= set(test)
  assert not seen_train & seen_test
  assert env_test.reset(options={"task_index": 2})[1]["task"] == test[2]


def test_options_and_representation():
  env = gym_env.MiniWoBEnv("click-option", "H4", reverse_fields=True, discount=0.5)
  obs, info = env.reset(seed=3)
  plain = harnesses.compile_harness(tasks.sample_task("click-option", 3), "H4")
  assert obs.split("\n") == plain.observation(0).split("\n")[::-1]
  assert info["discount"] == 0.5 and float(env.compiled.harness.mdp.discount) == 0.5
  other = tasks.sample_task("click-option", 4)
  assert env.reset(options={"task": other})[1]["task"] == other
  assert gym_env.MiniWoBEnv("click-option", "H4", render_mode="ansi").render() is None


def test_a_fixed_page_beyond_the_family_bounds_widens_the_spaces():
  # A page read from a browser may have longer labels than the sampler draws.
  task = tasks.OptionTask(labels=tuple(f"{i}" * 40 for i in range(6)), answer=0)
  env = gym_env.MiniWoBEnv("click-option", "H0", task=task)
  obs, _ = env.reset()
  assert obs in env.observation_space
  assert env.observation_space.max_length > gym_env.max_observation_length("click-option", "H0")
  small = gym_env.MiniWoBEnv("click-option", "H0")
  with pytest.raises(ValueError, match="task"):
    small.reset(options={"task": task})


@pytest.mark.parametrize("kwargs,field", [
    (dict(family="click-button"), "family"),
    (dict(harness="H6"), "harness"),
    (dict(split="valid"), "split"),
    (dict(discount=1.0), "discount"),
    (dict(family="click-option", task=tasks.sample_task("click-tab-2", 0)), "task"),
    (dict(render_mode="human"), "render_mode"),
])
def test_bad_construction_names_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    gym_env.MiniWoBEnv(**kwargs)


def test_bad_names_through_the_helpers():
  with pytest.raises(ValueError, match="family"):
    gym_env.env_id("click-buton", "H0")
  with pytest.raises(ValueError, match="harness"):
    gym_env.max_num_actions("click-option", "h0")


@pytest.mark.parametrize("action", [-1, 8, 100, 2.0, True, "click [1]"])
def test_out_of_range_action_raises(action):
  env = gymnasium.make("harnax/click-option-H0-v0")
  env.reset(seed=0)
  with pytest.raises(ValueError, match=r"action: expected .*\[0, 8\)"):
    env.unwrapped.step(action)


def test_step_before_reset_and_bad_options_raise():
  env = gym_env.MiniWoBEnv("click-option", "H0")
  with pytest.raises(gymnasium.error.ResetNeeded):
    env.step(0)
  with pytest.raises(ValueError, match="options"):
    env.reset(options={"seed": 3})
  with pytest.raises(ValueError, match="task_index"):
    env.reset(options={"task_index": 0})  # no split
