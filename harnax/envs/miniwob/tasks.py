"""Three MiniWoB++ task families as finite page-state machines.

Each *task instance* (one page as `reset(seed=s)` draws it) is a small frozen
dataclass that knows its elements, its finite set of page states, which
elements are visible in each, and what a click does: the next page state, or
the end of the episode with MiniWoB++'s *raw* reward (the reward before its
time decay; docs/harnesses.md §2 says how the decay is expressed through the
discount instead).

Families (faithful to the task pages of the `miniwob` package):

* `click-checkboxes`: 2–6 checkboxes with random labels, each asked for with
  probability 1/2; "Select A, B and click Submit." Page state = bitmask of the
  checked boxes. Submit ends the episode with reward
  `(#boxes right - #boxes wrong) / n` (1 only when every box is right).
* `click-option`: 2–6 radio buttons, one asked for; "Select X and click
  Submit." Page state = the selected option (0 = none yet). Submit ends with
  +1 when the asked option is selected, else -1.
* `click-tab-2`: three jQuery tabs of 20 words each, about one word in five a
  link; 'Switch between the tabs to find and click on the link "X".' Page
  state = the open tab; only its links are visible. Clicking a link ends with
  +1 when its text is X (every link with that text counts), else -1.

Elements are indexed `0..E-1` in page order; their ids in text observations
are `[e + 1]`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from typing import ClassVar

import numpy as np

FAMILIES = ("click-checkboxes", "click-option", "click-tab-2")
"""The task families, by their MiniWoB++ names."""

SUCCESS_REWARD = 1.0
_ALNUM = string.ascii_letters + string.digits
# A short lorem vocabulary for the tab pages' words (the real page draws from a
# longer list; only the link texts and their tabs matter to the MDP).
_WORDS = ("lorem", "ipsum", "dolor", "amet", "sed", "nunc", "urna", "enim", "odio", "eget",
          "nibh", "arcu", "vitae", "donec", "morbi", "proin", "risus", "magna", "dui", "felis",
          "justo", "ante", "purus", "velit", "massa", "cras", "erat", "nisl", "mauris", "orci")


@dataclasses.dataclass(frozen=True)
class Element:
  """A clickable page element.

  Attributes:
    kind: `"checkbox"`, `"radio"`, `"button"`, `"tab"` or `"link"`.
    text: its visible text (a checkbox's or radio's label).
    dom_id: its `id` attribute in the real page (`""` where it has none).
    group: the tab whose panel holds it (links only; -1 otherwise).
  """

  kind: str
  text: str
  dom_id: str = ""
  group: int = -1


@dataclasses.dataclass(frozen=True)
class Task:
  """A task instance: its page states and what a click does.

  Page states are `0..num_page_states - 1`, starting at `initial_state`; `None`
  stands for the end of the episode.
  """

  family: ClassVar[str] = ""
  initial_state: ClassVar[int] = 0

  @property
  def utterance(self) -> str:
    raise NotImplementedError

  @property
  def elements(self) -> tuple[Element, ...]:
    raise NotImplementedError

  @property
  def num_page_states(self) -> int:
    raise NotImplementedError

  def visible(self, state: int) -> tuple[int, ...]:
    """Indices of the elements visible (clickable) in page state `state`."""
    return tuple(range(len(self.elements)))

  def click(self, state: int, element: int) -> tuple[int | None, float]:
    """`(next page state or None when the episode ends, raw reward)`."""
    raise NotImplementedError

  def status(self, state: int, element: int) -> str:
    """The element's state as shown to a model (`""` when it has none)."""
    del state, element
    return ""

  def check(self, state: int) -> tuple[bool, str]:
    """A harness's automatic check of the page against the instruction.

    Returns `(ready, message)`: `ready` is True when finishing now (the
    family's terminating click) would succeed.
    """
    raise NotImplementedError

  @property
  def instructions(self) -> str:
    """Additional instructions a harness may show (H4)."""
    raise NotImplementedError

  def batches(self) -> tuple[tuple[int, ...], ...]:
    """Element sequences one batch click executes (H1), in click order."""
    raise NotImplementedError

  def _check_state(self, state: int):
    if not 0 <= state < self.num_page_states:
      raise ValueError(f"state: expected a page state in [0, {self.num_page_states}), "
                       f"got {state}")

  def _check_element(self, state: int, element: int):
    self._check_state(state)
    if element not in self.visible(state):
      raise ValueError(f"element: {element} is not a visible element of page state {state} "
                       f"(visible: {self.visible(state)})")


def _check_labels(field: str, labels) -> tuple[str, ...]:
  labels = tuple(str(x) for x in labels)
  if not 2 <= len(labels) <= 6:
    raise ValueError(f"{field}: expected 2 to 6 labels, got {len(labels)}")
  if any(not x or x != x.strip() for x in labels):
    raise ValueError(f"{field}: expected non-empty labels without surrounding spaces, "
                     f"got {labels}")
  if len(set(labels)) != len(labels):
    raise ValueError(f"{field}: expected distinct labels (the instruction names them), "
                     f"got {labels}")
  return labels


def _random_label(rng: np.random.Generator, taken) -> str:
  while True:
    label = "".join(rng.choice(list(_ALNUM), size=int(rng.integers(2, 9))))
    if label not in taken and label != "nothing":
      return label


# ---------------------------------------------------------------------------
# click-checkboxes
# ---------------------------------------------------------------------------

def _form(kind: str, labels) -> tuple[Element, ...]:
  """A form's elements: one `kind` input per label (ids `ch0`, `ch1`, ...), then Submit."""
  inputs = tuple(Element(kind, x, f"ch{i}") for i, x in enumerate(labels))
  return inputs + (Element("button", "Submit", "subbtn"),)


@dataclasses.dataclass(frozen=True)
class CheckboxesTask(Task):
  """`click-checkboxes`: check exactly the named boxes, then Submit.

  Attributes:
    labels: the n box labels in page order (2 <= n <= 6, distinct).
    targets: n booleans, True for a box the instruction names.
  """

  family: ClassVar[str] = "click-checkboxes"
  labels: tuple[str, ...]
  targets: tuple[bool, ...]

  def __post_init__(self):
    labels = _check_labels("labels", self.labels)
    targets = tuple(bool(t) for t in self.targets)
    if len(targets) != len(labels):
      raise ValueError(f"targets: expected {len(labels)} booleans (one per label), got "
                       f"{len(targets)}")
    object.__setattr__(self, "labels", labels)
    object.__setattr__(self, "targets", targets)

  @property
  def target_mask(self) -> int:
    return sum(1 << i for i, t in enumerate(self.targets) if t)

  @property
  def utterance(self) -> str:
    named = [x for x, t in zip(self.labels, self.targets) if t]
    return f"Select {', '.join(named) if named else 'nothing'} and click Submit."

  @functools.cached_property
  def elements(self) -> tuple[Element, ...]:
    return _form("checkbox", self.labels)

  @property
  def num_page_states(self) -> int:
    return 2 ** len(self.labels)

  def click(self, state, element):
    self._check_element(state, element)
    n = len(self.labels)
    if element < n:
      return state ^ (1 << element), 0.0
    right = sum(((state >> i) & 1) == t for i, t in enumerate(self.targets))
    return None, (right - (n - right)) / n

  def status(self, state, element):
    if element < len(self.labels):
      return "checked" if (state >> element) & 1 else "unchecked"
    return ""

  def check(self, state):
    self._check_state(state)
    wrong = bin(state ^ self.target_mask).count("1")
    if wrong == 0:
      return True, "every box matches the task"
    return False, f"{wrong} box{'es' if wrong > 1 else ''} differ from the task"

  @property
  def instructions(self) -> str:
    return ("Check exactly the boxes the task names and leave the others unchecked; clicking "
            "a box toggles it. Click Submit once at the end.")

  def batches(self):
    n = len(self.labels)
    subsets = [tuple(i for i in range(n) if m >> i & 1) for m in range(1, 2 ** n)]
    return tuple(sorted((s for s in subsets if len(s) >= 2), key=lambda s: (len(s), s)))

  @classmethod
  def sample(cls, rng: np.random.Generator) -> "CheckboxesTask":
    n = int(rng.integers(2, 7))
    labels: list[str] = []
    for _ in range(n):
      labels.append(_random_label(rng, labels))
    return cls(labels=tuple(labels), targets=tuple(bool(x) for x in rng.random(n) < 0.5))

  @classmethod
  def from_page(cls, utterance: str, labels) -> "CheckboxesTask":
    """The instance a real page shows: its instruction and box labels in order."""
    labels = _check_labels("labels", labels)
    m = re.fullmatch(r"Select (.*) and click Submit\.", utterance.strip())
    if m is None:
      raise ValueError(f"utterance: expected 'Select ... and click Submit.', got {utterance!r}")
    named = [] if m.group(1) == "nothing" and "nothing" not in labels else m.group(1).split(", ")
    unknown = [x for x in named if x not in labels]
    if unknown:
      raise ValueError(f"utterance: names {unknown}, which are not among the labels {labels}")
    return cls(labels=labels, targets=tuple(x in named for x in labels))


# ---------------------------------------------------------------------------
# click-option
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OptionTask(Task):
  """`click-option`: select the named radio button, then Submit.

  Page state 0 is "nothing selected", state `i + 1` is "option i selected".

  Attributes:
    labels: the n option labels in page order (2 <= n <= 6, distinct).
    answer: index of the option the instruction names.
  """

  family: ClassVar[str] = "click-option"
  labels: tuple[str, ...]
  answer: int

  def __post_init__(self):
    labels = _check_labels("labels", self.labels)
    if not isinstance(self.answer, (int, np.integer)) or not 0 <= self.answer < len(labels):
      raise ValueError(f"answer: expected an option index in [0, {len(labels)}), got "
                       f"{self.answer!r}")
    object.__setattr__(self, "labels", labels)
    object.__setattr__(self, "answer", int(self.answer))

  @property
  def utterance(self) -> str:
    return f"Select {self.labels[self.answer]} and click Submit."

  @functools.cached_property
  def elements(self) -> tuple[Element, ...]:
    return _form("radio", self.labels)

  @property
  def num_page_states(self) -> int:
    return len(self.labels) + 1

  def click(self, state, element):
    self._check_element(state, element)
    if element < len(self.labels):
      return element + 1, 0.0
    return None, SUCCESS_REWARD if state == self.answer + 1 else -1.0

  def status(self, state, element):
    if element < len(self.labels):
      return "selected" if state == element + 1 else "unselected"
    return ""

  def check(self, state):
    self._check_state(state)
    if state == self.answer + 1:
      return True, "the selected option is the one the task names"
    if state == 0:
      return False, "no option is selected"
    return False, "the selected option is not the one the task names"

  @property
  def instructions(self) -> str:
    return ("Select the option the task names (selecting another option replaces it), then "
            "click Submit once.")

  def batches(self):
    submit = len(self.labels)
    return tuple((i, submit) for i in range(len(self.labels)))

  @classmethod
  def sample(cls, rng: np.random.Generator) -> "OptionTask":
    n = int(rng.integers(2, 7))
    labels: list[str] = []
    for _ in range(n):
      labels.append(_random_label(rng, labels))
    return cls(labels=tuple(labels), answer=int(rng.integers(0, n)))

  @classmethod
  def from_page(cls, utterance: str, labels) -> "OptionTask":
    """The instance a real page shows: its instruction and option labels in order."""
    labels = _check_labels("labels", labels)
    m = re.fullmatch(r"Select (.*) and click Submit\.", utterance.strip())
    if m is None or m.group(1) not in labels:
      raise ValueError(f"utterance: expected 'Select X and click Submit.' with X one of "
                       f"{labels}, got {utterance!r}")
    return cls(labels=labels, answer=labels.index(m.group(1)))


# ---------------------------------------------------------------------------
# click-tab-2
# ---------------------------------------------------------------------------

NUM_TABS = 3


@dataclasses.dataclass(frozen=True)
class TabsTask(Task):
  """`click-tab-2`: find the named link behind one of three tabs and click it.

  Page state `j` is "tab j open" (tab 0 is open at the start). Elements: the
  three tab headers, then the links of tab 0, 1, 2 in page order.

  Attributes:
    links: per tab, the texts of its links in page order (at least one link in
      all; texts may repeat, as on the real page).
    target: the link text the instruction names (one of the links).
  """

  family: ClassVar[str] = "click-tab-2"
  links: tuple[tuple[str, ...], ...]
  target: str

  def __post_init__(self):
    links = tuple(tuple(str(x) for x in tab) for tab in self.links)
    if len(links) != NUM_TABS:
      raise ValueError(f"links: expected {NUM_TABS} tabs of link texts, got {len(links)}")
    if not any(links):
      raise ValueError("links: expected at least one link in some tab, got none")
    if any(not x or x != x.strip() for tab in links for x in tab):
      raise ValueError(f"links: expected non-empty texts without surrounding spaces, got "
                       f"{links}")
    if not any(self.target == x for tab in links for x in tab):
      raise ValueError(f"target: expected the text of one of the links, got {self.target!r}")
    object.__setattr__(self, "links", links)

  @property
  def utterance(self) -> str:
    return f'Switch between the tabs to find and click on the link "{self.target}".'

  @functools.cached_property
  def elements(self) -> tuple[Element, ...]:
    tabs = tuple(Element("tab", f"Tab #{j + 1}", f"ui-id-{j + 1}") for j in range(NUM_TABS))
    return tabs + tuple(Element("link", x, "", j) for j, tab in enumerate(self.links)
                        for x in tab)

  @property
  def num_page_states(self) -> int:
    return NUM_TABS

  def visible(self, state):
    self._check_state(state)
    return tuple(range(NUM_TABS)) + tuple(
        e for e, el in enumerate(self.elements) if el.kind == "link" and el.group == state)

  def click(self, state, element):
    self._check_element(state, element)
    if element < NUM_TABS:
      return element, 0.0
    return None, SUCCESS_REWARD if self.elements[element].text == self.target else -1.0

  def status(self, state, element):
    if element < NUM_TABS:
      return "open" if element == state else "closed"
    return ""

  def check(self, state):
    self._check_state(state)
    if any(x == self.target for x in self.links[state]):
      return True, f'the link "{self.target}" is in this tab'
    return False, f'the link "{self.target}" is not in this tab'

  @property
  def instructions(self) -> str:
    return ("Only the open tab's links are visible. Open the tabs one by one until the named "
            "link appears, then click it; clicking any other link ends the task.")

  def batches(self):
    return tuple((el.group, e) for e, el in enumerate(self.elements) if el.kind == "link")

  @classmethod
  def sample(cls, rng: np.random.Generator) -> "TabsTask":
    while True:  # as the page does: redraw until some tab has a link
      links = tuple(tuple(str(w) for w in rng.choice(_WORDS, size=20)[rng.random(20) < 0.2])
                    for _ in range(NUM_TABS))
      if any(links):
        break
    flat = [x for tab in links for x in tab]
    return cls(links=links, target=flat[int(rng.integers(0, len(flat)))])

  @classmethod
  def from_page(cls, utterance: str, links) -> "TabsTask":
    """The instance a real page shows: its instruction and each tab's link texts."""
    m = re.fullmatch(r'Switch between the tabs to find and click on the link "(.*)"\.',
                     utterance.strip())
    if m is None:
      raise ValueError("utterance: expected 'Switch between the tabs to find and click on the "
                       f"link \"X\".', got {utterance!r}")
    return cls(links=tuple(tuple(tab) for tab in links), target=m.group(1))


TASK_TYPES: dict[str, type[Task]] = {
    "click-checkboxes": CheckboxesTask,
    "click-option": OptionTask,
    "click-tab-2": TabsTask,
}


def task_type(family: str) -> type[Task]:
  """The task class of a family name (see `FAMILIES`)."""
  if family not in TASK_TYPES:
    raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
  return TASK_TYPES[family]


def sample_task(family: str, seed: int) -> Task:
  """The task instance of `family` drawn from integer `seed` (deterministic)."""
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
  return task_type(family).sample(np.random.default_rng([int(seed), FAMILIES.index(family)]))


def task_split(family: str, num_train: int, num_test: int, *, seed: int = 0
               ) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
  """Disjoint train / held-out task instances (the harness-transfer study evaluates held-out tasks).

  Instances are drawn from seeds `seed, seed + 1, ...`; one equal to an earlier
  instance (same page) is skipped, so no held-out page appears in training.

  Returns:
    `(train, test)` tuples of `num_train` and `num_test` instances.
  """
  for field, n in (("num_train", num_train), ("num_test", num_test)):
    if not isinstance(n, (int, np.integer)) or n < 0:
      raise ValueError(f"{field}: expected a non-negative int, got {n!r}")
  tasks: list[Task] = []
  s = int(seed)
  while len(tasks) < num_train + num_test:
    t = sample_task(family, s)
    s += 1
    if t not in tasks:
      tasks.append(t)
  return tuple(tasks[:num_train]), tuple(tasks[num_train:])
