"""Environments: MiniWoB++ task families as exact finite MDPs under harnesses.

`harnax.envs.miniwob` compiles task instances under harnesses H0–H5 to
`TabularHarness`. Docs: docs/harnesses.md.
"""

from harnax.envs import miniwob
