"""Text games behind a harness: ALFWorld (on its own engine) and ScienceWorld.

`base` fixes the interface every game implements (:class:`TextGame`, :class:`GameTask`).
Docs: docs/text_games.md.
"""

from harnax.envs.text.base import INFO_KEYS
from harnax.envs.text.base import SPLITS
from harnax.envs.text.base import GameLoadError
from harnax.envs.text.base import GameTask
from harnax.envs.text.base import TextGame

__all__ = ["INFO_KEYS", "SPLITS", "GameLoadError", "GameTask", "TextGame"]
