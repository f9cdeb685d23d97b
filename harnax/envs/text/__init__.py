"""Text games behind a harness: ALFWorld (on its own engine) and ScienceWorld.

`base` fixes the interface every game implements (:class:`TextGame`, :class:`GameTask`).
Docs: docs/text_games.md.
"""

from harnax.envs.text.base import INFO_KEYS
from harnax.envs.text.base import SPLITS
from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask
from harnax.envs.text.base import TextGame
from harnax.envs.text.harness import Harness
from harnax.envs.text.harness import HarnessConfig
from harnax.envs.text.harness import HarnessedGame
from harnax.envs.text.harness import LoopStatus
from harnax.envs.text.harness import Turn
from harnax.envs.text.harness import Verdict
from harnax.envs.text.harness import render_context
from harnax.envs.text.record import Record

__all__ = ["INFO_KEYS", "SPLITS", "GameLoadError", "GameTask", "TextGame"]
__all__ += ["Harness", "HarnessConfig", "HarnessedGame", "LoopStatus", "Record", "Turn",
            "Verdict", "render_context"]
