"""The import arrows of cardjax/ point one way: no package imports one that imports it back,
counting imports inside functions too (a deferred import hides a circle, it does not remove
it). Low packages (model, data, hf, storage) hold no command modules that reach up to
configs and checkpoints: those live in cardjax/commands/."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "cardjax"


def _modules() -> dict[str, Path]:
  out = {}
  for f in ROOT.rglob("*.py"):
    parts = f.relative_to(ROOT.parent).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
  return out


def _target(name: str, modules) -> str | None:
  """The cardjax module `name` (a module, or a name inside one) refers to."""
  while name not in modules:
    if "." not in name:
      return None
    name = name.rsplit(".", 1)[0]
  return name


def _imports(modules) -> dict[str, set[str]]:
  graph = {}
  for name, f in modules.items():
    seen = set()
    for node in ast.walk(ast.parse(f.read_text())):
      if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        seen |= {_target(f"{node.module}.{a.name}", modules) for a in node.names}
      elif isinstance(node, ast.Import):
        seen |= {_target(a.name, modules) for a in node.names}
    graph[name] = {t for t in seen if t and t != name}
  return graph


def _package(module: str) -> str:
  return ".".join(module.split(".")[:2])


def test_packages_import_one_way():
  modules = _modules()
  graph: dict[str, set[str]] = {}
  for module, targets in _imports(modules).items():
    for target in targets:
      a, b = _package(module), _package(target)
      if a != b and b != "cardjax":  # the top package's __init__ is the version only
        graph.setdefault(a, set()).add(b)
  try:
    list(graphlib.TopologicalSorter(graph).static_order())
  except graphlib.CycleError as e:
    pytest.fail(f"packages import each other: {' -> '.join(e.args[1])}")


def test_modules_import_one_way():
  try:
    list(graphlib.TopologicalSorter(_imports(_modules())).static_order())
  except graphlib.CycleError as e:
    pytest.fail(f"modules import each other: {' -> '.join(e.args[1])}")


def test_the_graph_sees_deferred_imports():
  """The check counts an import inside a function (the way circles used to hide)."""
  graph = _imports(_modules())
  assert "cardjax.config" in graph["cardjax.commands.init"]  # imported inside run()
