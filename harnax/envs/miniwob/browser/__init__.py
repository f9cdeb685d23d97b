"""Real-browser bridge: replays compiled harness actions on the MiniWoB++ pages.

The finite MDPs of `harnesses` are a model of the real task pages. This package
checks that model against the pages themselves, driven in headless Chromium by
the `miniwob` package (gymnasium ids `miniwob/<family>-v1`):

* `session`: finding Chromium and its driver, starting one env per family
  (`BrowserSession`), the one `BrowserUnavailableError` of a failing start;
* `page`: the page scripts: the task instance a page shows after
  `reset(seed=s)` (`page_task`), its current page state (`read_page_state`),
  the elements an observation lists (`visible_elements`), clicks and no-ops;
* `episodes`: executing semantic actions of a `CompiledHarness` on the page
  and recording, per step, what the page did next to what the MDP predicts
  (`replay`, or `start_episode` then `play_episode`);
* `disagreements`: the comparison of a replay with its MDP (`compare`);
* `policies`: random and soft-optimal action choices;
* `validation`: `validate` replays random and optimal action sequences under
  H0–H5 and returns every disagreement.

Rewards are compared as MiniWoB++'s *raw* reward (`info["raw_reward"]`); the
environment's reward is the raw one scaled down by elapsed time when positive,
so only its sign is compared. Setup and the mapping of actions:
docs/browser.md.
"""

from harnax.envs.miniwob.browser.disagreements import Disagreement
from harnax.envs.miniwob.browser.disagreements import compare
from harnax.envs.miniwob.browser.disagreements import reachable_states
from harnax.envs.miniwob.browser.episodes import Policy
from harnax.envs.miniwob.browser.episodes import Replay
from harnax.envs.miniwob.browser.episodes import Step
from harnax.envs.miniwob.browser.episodes import replay
from harnax.envs.miniwob.browser.page import page_task
from harnax.envs.miniwob.browser.page import read_page_state
from harnax.envs.miniwob.browser.page import visible_elements
from harnax.envs.miniwob.browser.policies import optimal_policy
from harnax.envs.miniwob.browser.policies import random_policy
from harnax.envs.miniwob.browser.policies import soft_optimal_policy
from harnax.envs.miniwob.browser.session import COMMAND_TIMEOUT
from harnax.envs.miniwob.browser.session import SETUP_HINT
from harnax.envs.miniwob.browser.session import START_TIMEOUT
from harnax.envs.miniwob.browser.session import BrowserSession
from harnax.envs.miniwob.browser.session import BrowserUnavailableError
from harnax.envs.miniwob.browser.session import find_browser
from harnax.envs.miniwob.browser.validation import Validation
from harnax.envs.miniwob.browser.validation import validate

__all__ = [
    "Disagreement",
    "compare",
    "reachable_states",
    "Policy",
    "Replay",
    "Step",
    "replay",
    "page_task",
    "read_page_state",
    "visible_elements",
    "optimal_policy",
    "random_policy",
    "soft_optimal_policy",
    "COMMAND_TIMEOUT",
    "SETUP_HINT",
    "START_TIMEOUT",
    "BrowserSession",
    "BrowserUnavailableError",
    "find_browser",
    "Validation",
    "validate",
]
