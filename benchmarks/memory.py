"""Resident memory of the running process, for the benchmarks' memory columns (Linux)."""

import resource


def _status_mb(field: str) -> float | None:
  """A `/proc/self/status` memory field (kB there) in MB, or None where it is not readable."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return None


def peak_rss_mb() -> float:
  """Peak resident memory of this process (`VmHWM`: reset at exec, unlike `ru_maxrss`, which
  a child inherits from its parent's fork; the fallback off Linux)."""
  peak = _status_mb("VmHWM")
  return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mb() -> float:
  """Current resident memory of this process (MB; NaN where it is not readable)."""
  now = _status_mb("VmRSS")
  return now if now is not None else float("nan")
