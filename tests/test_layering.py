"""The import graph runs only downward (docs: README "Layout").

core <- harness, estimate <- envs <- policies <- train <- studies, with models and parallel
beside: each package may import only the packages listed for it below (train runs agents in
environments, so it may import envs; policies may not). Read from the source with `ast`, so a
violation is caught without importing anything.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "harnax"

ALLOWED = {
    "parallel": {"parallel"},
    "core": {"core", "parallel"},
    "harness": {"core", "harness"},
    "estimate": {"core", "estimate"},
    "models": {"models", "parallel"},
    "envs": {"core", "harness", "estimate", "envs"},
    "policies": {"core", "harness", "models", "policies"},
    "train": {"core", "harness", "models", "parallel", "envs", "policies", "train"},
    "studies": {"core", "harness", "estimate", "models", "parallel", "envs", "policies", "train",
                "studies"},
}


def _harnax_imports(path: pathlib.Path):
  """(line, subpackage) for every `harnax.<subpackage>` a module imports (`harnax` alone: "")."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = [node.module + "." + a.name for a in node.names] if node.module == "harnax" else [
          node.module]
    else:
      continue
    for name in names:
      parts = name.split(".")
      if parts[0] == "harnax":
        yield node.lineno, parts[1] if len(parts) > 1 else ""


def _modules():
  return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_lower_layers(path):
  layer = path.relative_to(PACKAGE).parts[0]
  assert layer in ALLOWED, f"{layer}: a new subpackage needs its place in ALLOWED"
  # `import harnax` is the core API (harnax/__init__ re-exports harnax.core only);
  # `harnax.pytree` (the container mechanism) sits below every layer.
  allowed = ALLOWED[layer] | {"pytree"} | (
      {""} if layer != "core" and "core" in ALLOWED[layer] else set())
  bad = [(line, sub) for line, sub in _harnax_imports(path)
         if not sub.startswith("_") and sub not in allowed]
  assert not bad, (f"{path.relative_to(PACKAGE)} ({layer}) imports "
                   + ", ".join(f"harnax.{s or '<top>'} (line {n})" for n, s in bad))


def test_the_check_sees_imports():
  # The parser must find the imports this very layout relies on, or the test above is empty.
  found = {sub for line, sub in _harnax_imports(PACKAGE / "studies" / "families.py")}
  assert {"core", "envs", "policies", "train"} <= found
