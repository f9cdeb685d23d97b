"""Headless Chromium for the MiniWoB++ pages: finding it and starting it.

A `BrowserSession` starts one `miniwob` gymnasium env (`miniwob/<family>-v1`)
per task family on first use and reuses it across episodes. Every way a start
can fail (no `miniwob` package, a missing binary, a driver whose major version
differs from the browser's, a crash, a hang) is raised as one
`BrowserUnavailableError` that names the setup; a hang is cut off after
`start_timeout` seconds. Setup: docs/browser.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from typing import Any

import numpy as np

from harnax.envs.miniwob import tasks as tasks_lib

SETUP_HINT = ("Real-browser validation needs Debian's chromium and chromium-driver "
              "(`apt-get install -y chromium chromium-driver`, as root), the `miniwob` "
              "package (`pip install -e '.[browser]'`), and, when the binaries are not on "
              "PATH, MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER set together "
              "(docs/browser.md).")
START_TIMEOUT = 60.0
"""Seconds a browser start may take before it is reported as failed."""
COMMAND_TIMEOUT = 30.0
"""Seconds one page script may run (a hung page raises instead of hanging)."""


class BrowserUnavailableError(RuntimeError):
  """No usable browser: missing, mismatched versions, or a failed start."""


def _env_id(family: str) -> str:
  tasks_lib.task_type(family)  # ValueError naming `family` for an unknown one
  return f"miniwob/{family}-v1"


def _major(version_output: str, what: str) -> int:
  m = re.search(r"(\d+)\.\d+\.\d+", version_output)
  if m is None:
    raise BrowserUnavailableError(f"{what}: could not read a version from "
                                  f"{version_output.strip()!r}. {SETUP_HINT}")
  return int(m.group(1))


def _version(path: str, what: str) -> str:
  try:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                         check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise BrowserUnavailableError(f"{what}: {path} --version failed ({e}). {SETUP_HINT}") from e
  return out.stdout


def find_browser() -> tuple[str, str]:
  """The Chromium binary and matching ChromeDriver to use.

  `MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER` when set (together), else
  `chromium` and `chromedriver` on PATH.

  Returns:
    `(chrome_binary, chromedriver)` paths.

  Raises:
    BrowserUnavailableError: `miniwob` is not installed, a binary is missing,
      only one of the two variables is set, or the major versions differ (a
      stale driver cannot start the browser).
  """
  try:
    import miniwob  # noqa: F401
  except ImportError as e:
    raise BrowserUnavailableError(f"the `miniwob` package is not installed. {SETUP_HINT}") from e
  chrome, driver = os.environ.get("MINIWOB_CHROME_BINARY"), os.environ.get("MINIWOB_CHROMEDRIVER")
  if bool(chrome) != bool(driver):
    raise BrowserUnavailableError(
        "MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER: expected both set or both unset, got "
        f"{'only MINIWOB_CHROME_BINARY' if chrome else 'only MINIWOB_CHROMEDRIVER'}. "
        f"{SETUP_HINT}")
  chrome = chrome or shutil.which("chromium") or shutil.which("chromium-browser")
  driver = driver or shutil.which("chromedriver")
  for what, path in (("chromium", chrome), ("chromedriver", driver)):
    if not path or not os.access(path, os.X_OK):
      raise BrowserUnavailableError(f"{what}: not found{f' at {path}' if path else ''}. "
                                    f"{SETUP_HINT}")
  browser_major = _major(_version(chrome, "chromium"), "chromium")
  driver_major = _major(_version(driver, "chromedriver"), "chromedriver")
  if browser_major != driver_major:
    raise BrowserUnavailableError(
        f"chromedriver: version {driver_major} does not match chromium {browser_major} "
        f"({driver} vs {chrome}); install both from the same distribution. {SETUP_HINT}")
  return chrome, driver


class BrowserSession:
  """Headless Chromium running the task pages; one gymnasium env per family.

  A context manager. It checks the setup and starts each family's env on first
  use; a failed start is raised once as `BrowserUnavailableError` (and raised
  again, without a new attempt, on later use), never a hang: the start runs
  under `start_timeout`. Envs are reused across episodes (`reset` per seed).

  Starting sets `SE_OFFLINE=true` and, when both are unset,
  `MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER` in `os.environ`, so
  Selenium does not look drivers up over the network.
  """

  def __init__(self, *, start_timeout: float = START_TIMEOUT):
    if not start_timeout > 0:
      raise ValueError(f"start_timeout: expected seconds > 0, got {start_timeout!r}")
    self.start_timeout = float(start_timeout)
    self._envs: dict[str, Any] = {}
    self._resets: dict[str, int] = {}
    self._error: BrowserUnavailableError | None = None
    self._closed = False

  def __enter__(self) -> "BrowserSession":
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    """Closes every browser this session started."""
    envs, self._envs = self._envs, {}
    for env in envs.values():
      try:
        env.close()
      except Exception:  # pylint: disable=broad-except
        pass  # a browser that already died has nothing left to close
    self._closed = True

  def env(self, family: str):
    """The gymnasium env of `family`, started on first use."""
    env_id = _env_id(family)
    if self._closed:
      raise RuntimeError("BrowserSession: used after close()")
    if family not in self._envs:
      self._envs[family] = self._start(env_id)
    return self._envs[family]

  def _start(self, env_id: str):
    if self._error is not None:
      raise self._error
    try:
      chrome, driver = find_browser()
      os.environ["SE_OFFLINE"] = "true"
      if not os.environ.get("MINIWOB_CHROME_BINARY"):
        os.environ["MINIWOB_CHROME_BINARY"] = chrome
        os.environ["MINIWOB_CHROMEDRIVER"] = driver
      import gymnasium as gym
      import miniwob
      gym.register_envs(miniwob)
      if gym.spec(env_id).nondeterministic:
        # Seeded replays would not be reproducible, so the comparison is void.
        raise BrowserUnavailableError(f"{env_id}: registered as nondeterministic; seeded "
                                      "replays cannot be compared with the MDP")
      result: dict[str, Any] = {}

      def start():
        try:
          result["env"] = gym.make(env_id)
        except BaseException as e:  # pylint: disable=broad-except
          result["error"] = e

      thread = threading.Thread(target=start, daemon=True, name=f"start {env_id}")
      thread.start()
      thread.join(self.start_timeout)
      if thread.is_alive():
        def reap():  # a start that completes late must not leave a browser behind
          thread.join()
          if "env" in result:
            result["env"].close()
        threading.Thread(target=reap, daemon=True, name=f"reap {env_id}").start()
        raise BrowserUnavailableError(
            f"{env_id}: the browser did not start within {self.start_timeout:.0f} s "
            f"({chrome}, {driver}). {SETUP_HINT}")
      if "error" in result:
        e = result["error"]
        raise BrowserUnavailableError(
            f"{env_id}: the browser failed to start ({chrome}, {driver}): "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}. "
            f"{SETUP_HINT}") from e
      env = result["env"]
      drv = env.unwrapped.instance.driver
      drv.set_script_timeout(COMMAND_TIMEOUT)
      drv.set_page_load_timeout(COMMAND_TIMEOUT)
      return env
    except BrowserUnavailableError as e:
      self._error = e
      raise

  def reset(self, family: str, seed: int) -> dict:
    """Starts the episode of `seed` on `family`'s page; returns the observation."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    # Screenshots are not compared and cost most of a step's time.
    obs, _ = self.env(family).reset(seed=int(seed), options={"record_screenshots": False})
    self._resets[family] = self._resets.get(family, 0) + 1
    return obs

  def resets(self, family: str) -> int:
    """How many episodes `reset` has started on `family`'s page so far."""
    tasks_lib.task_type(family)
    return self._resets.get(family, 0)
