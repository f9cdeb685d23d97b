"""The real task page: reading its task and state, and acting on it.

Reads go through the page's own JavaScript (the driver's `execute_script`),
because the observation lists only rendered elements and so misses a hidden
tab's links; actions go through the env (`CLICK_ELEMENT` on an element's
`ref`, or a no-op step). Which page elements the task's elements are:
docs/browser.md.
"""

from __future__ import annotations

import re

from harnax.envs.miniwob import tasks as tasks_lib
from harnax.envs.miniwob.browser import session as session_lib

# Page scripts. They read the whole page (hidden tabs included), unlike the
# observation, which lists only visible elements.
_JS_UTTERANCE = ("var u = core.getUtterance();"
                 "return typeof u === 'string' ? u : u.utterance;")
_JS_INPUTS = ("return Array.from(document.querySelectorAll('#boxes label')).map(function(l){"
              "var i = l.querySelector('input');"
              "return [l.textContent.trim(), i ? i.id : '', i ? i.type : '',"
              " i ? i.checked : false];"
              "});")
_JS_LINKS = ("return [1, 2, 3].map(function(j){"
             "return Array.from(document.querySelectorAll('#tabs-' + j + ' .alink'))"
             ".map(function(e){ return e.textContent.trim(); }); });")
_JS_TABS = ("return Array.from(document.querySelectorAll('#area > ul > li')).map(function(li){"
            "return [li.classList.contains('ui-tabs-active'),"
            "li.getAttribute('aria-selected') === 'true',"
            "li.getAttribute('aria-controls')]; });")
_INPUT_TYPE = {"click-checkboxes": "checkbox", "click-option": "radio"}


def _driver(source, family: str):
  """The Selenium driver behind a `BrowserSession`'s env of `family` or a miniwob env."""
  if isinstance(source, session_lib.BrowserSession):
    return source.env(family).unwrapped.instance.driver
  unwrapped = getattr(source, "unwrapped", source)
  if hasattr(unwrapped, "instance"):
    return unwrapped.instance.driver
  raise ValueError(f"source: expected a BrowserSession or a miniwob env, got "
                   f"{type(source).__name__}")


def _check_inputs(rows, family: str):
  for i, (_, dom_id, kind, _) in enumerate(rows):
    if dom_id != f"ch{i}" or kind != _INPUT_TYPE[family]:
      raise RuntimeError(f"{family}: unexpected page layout: input {i} is "
                         f"{kind!r} with id {dom_id!r}")
  return rows


def page_task(source, family: str) -> tasks_lib.Task:
  """The task instance the real page currently shows (read after a reset).

  Args:
    source: a `BrowserSession` or a `miniwob` gymnasium env of `family`.
    family: one of `tasks.FAMILIES`.

  Returns:
    The `Task`, built by the family's `from_page` from the utterance and the
    labels (boxes, options) or every tab's link texts.
  """
  tasks_lib.task_type(family)
  drv = _driver(source, family)
  utterance = drv.execute_script(_JS_UTTERANCE)
  if family == "click-tab-2":
    return tasks_lib.TabsTask.from_page(utterance, drv.execute_script(_JS_LINKS))
  labels = [row[0] for row in _check_inputs(drv.execute_script(_JS_INPUTS), family)]
  return tasks_lib.task_type(family).from_page(utterance, labels)


def read_page_state(source, family: str) -> int | None:
  """The real page's current page state, or None once the episode has ended.

  Page states as in `tasks`: the bitmask of checked boxes (click-checkboxes),
  0 for none or 1 + the selected option (click-option), the open tab
  (click-tab-2; from the tab's `ui-tabs-active` class, cross-checked with
  `aria-selected`).

  Raises:
    RuntimeError: the page is in a state the task model has no name for
      (e.g. two radios checked, no tab open).
  """
  tasks_lib.task_type(family)
  drv = _driver(source, family)
  # One round trip: the end flag and the family's page data.
  done, rows = drv.execute_script(
      "return [WOB_DONE_GLOBAL, (function(){"
      + (_JS_TABS if family == "click-tab-2" else _JS_INPUTS) + "})()];")
  if done:
    return None
  if family == "click-checkboxes":
    return sum(1 << i for i, row in enumerate(_check_inputs(rows, family)) if row[3])
  if family == "click-option":
    checked = [i for i, row in enumerate(_check_inputs(rows, family)) if row[3]]
    if len(checked) > 1:
      raise RuntimeError(f"click-option: several radios checked: {checked}")
    return checked[0] + 1 if checked else 0
  active = [j for j, (cls, _, _) in enumerate(rows) if cls]
  aria = [j for j, (_, sel, _) in enumerate(rows) if sel]
  if len(rows) != tasks_lib.NUM_TABS or len(active) != 1 or active != aria:
    raise RuntimeError(f"click-tab-2: expected one open tab of {tasks_lib.NUM_TABS}, got "
                       f"ui-tabs-active on {active}, aria-selected on {aria}")
  return active[0]


def visible_elements(task: tasks_lib.Task, obs: dict) -> dict[int, int]:
  """The task's elements listed in observation `obs`: `{element index: ref}`.

  The observation lists only rendered elements, so for click-tab-2 only the
  open tab's links appear. Links are matched by their tab panel and order
  (and must show the task's text); other elements by their `id`.
  """
  elements = task.elements
  by_id = {el.dom_id: e for e, el in enumerate(elements) if el.dom_id}
  dom = list(obs["dom_elements"])
  refs: dict[int, int] = {}
  panel_of = {}  # ref of a tab panel -> tab index
  parent = {}
  for d in dom:
    parent[int(d["ref"])] = int(d["parent"])
    m = re.fullmatch(r"tabs-(\d)", str(d["id"]))
    if m:
      panel_of[int(d["ref"])] = int(m.group(1)) - 1
  link_start = {}
  for e, el in enumerate(elements):
    if el.kind == "link":
      link_start.setdefault(el.group, e)
  seen_in_group: dict[int, int] = {}
  for d in dom:
    ref, dom_id, tag = int(d["ref"]), str(d["id"]), str(d["tag"])
    if dom_id in by_id and tag.lower() != "t":
      refs[by_id[dom_id]] = ref
    elif "alink" in str(d["classes"]).split():
      node, group = ref, None
      while node in parent and group is None:
        node = parent[node]
        group = panel_of.get(node)
      if group is None or group not in link_start:
        raise RuntimeError(f"link {d['text']!r} (ref {ref}) is in no known tab panel")
      k = seen_in_group.get(group, 0)
      seen_in_group[group] = k + 1
      e = link_start[group] + k
      if e >= len(elements) or elements[e].group != group:
        raise RuntimeError(f"tab {group}: more links on the page than in the task")
      if str(d["text"]) == elements[e].text:  # else left out: `compare` reports it
        refs[e] = ref
  return refs


def click_element(env, ref: int):
  """One `CLICK_ELEMENT` step on the element `ref` of the current observation.

  Returns:
    The env's `(obs, reward, terminated, truncated, info)`.
  """
  from miniwob.action import ActionTypes  # the optional `browser` extra
  return env.step(env.unwrapped.create_action(ActionTypes.CLICK_ELEMENT, ref=ref))


def no_op(env):
  """One step that does nothing on the page (the harness's `wait`).

  Returns:
    The env's `(obs, reward, terminated, truncated, info)`.
  """
  from miniwob.action import ActionTypes  # the optional `browser` extra
  return env.step(env.unwrapped.create_action(ActionTypes.NONE))
