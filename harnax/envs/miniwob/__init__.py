"""MiniWoB++ task families compiled to finite MDPs under harnesses H0–H5.

`tasks` holds the task families (page states and clicks), `harnesses` the
harnesses H0–H5 and their compilation to `TabularHarness`, `features` the
text features a log-linear policy reads from any harness's observation, and
`browser` the bridge to the real task pages. Theory and the choice of each
harness: docs/harnesses.md; the browser bridge: docs/browser.md.
"""

from harnax.envs.miniwob import features
from harnax.envs.miniwob.harnesses import ADDITIONS
from harnax.envs.miniwob.harnesses import FIELD_GROUPS
from harnax.envs.miniwob.harnesses import HARNESSES
from harnax.envs.miniwob.harnesses import SWAPS
from harnax.envs.miniwob.harnesses import Action
from harnax.envs.miniwob.harnesses import CompiledHarness
from harnax.envs.miniwob.harnesses import HarnessSpec
from harnax.envs.miniwob.harnesses import candidate_outputs
from harnax.envs.miniwob.harnesses import compile_all
from harnax.envs.miniwob.harnesses import compile_harness
from harnax.envs.miniwob.harnesses import harness_spec
from harnax.envs.miniwob.tasks import FAMILIES
from harnax.envs.miniwob.tasks import CheckboxesTask
from harnax.envs.miniwob.tasks import Element
from harnax.envs.miniwob.tasks import OptionTask
from harnax.envs.miniwob.tasks import TabsTask
from harnax.envs.miniwob.tasks import Task
from harnax.envs.miniwob.tasks import sample_task
from harnax.envs.miniwob.tasks import task_split
from harnax.envs.miniwob.tasks import task_type

__all__ = [
    "ADDITIONS",
    "FIELD_GROUPS",
    "HARNESSES",
    "SWAPS",
    "Action",
    "CompiledHarness",
    "HarnessSpec",
    "candidate_outputs",
    "compile_all",
    "compile_harness",
    "harness_spec",
    "features",
    "FAMILIES",
    "CheckboxesTask",
    "Element",
    "OptionTask",
    "TabsTask",
    "Task",
    "sample_task",
    "task_split",
    "task_type",
]
