"""Reading back the markdown tables the benchmark scripts write (shared by their tests)."""


def tables(text, first_header):
  """Every markdown table whose header row starts with ``| first_header |``, each as a list of
  rows of cells (the separator row skipped)."""
  lines = text.splitlines()
  out = []
  for start, line in enumerate(lines):
    if line.startswith(f"| {first_header} |"):
      rows = []
      for row in lines[start + 2:]:
        if not row.startswith("|"):
          break
        rows.append([c.strip() for c in row.strip().strip("|").split("|")])
      out.append(rows)
  return out


def table(text, header):
  """The rows of the first markdown table whose header row starts with `header` (any prefix of
  the header line, e.g. "| model | params")."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in line.strip().strip("|").split("|")])
  return rows


def seconds(cell):
  """"12.5 ms" or "1.2 s" in seconds."""
  value, unit = cell.split()
  return float(value) * {"s": 1.0, "ms": 1e-3}[unit]
