"""No cardjax module assigns another module's globals: a setting crosses a package
boundary as a parameter (the prompt width bucket is `bucket=`, not prompts.BUCKET set by
the server), so importing one package never changes how another behaves."""

import ast
from pathlib import Path

import cardjax

PACKAGE = Path(cardjax.__file__).parent


def foreign_assignments(path: Path) -> list[str]:
  """Every `name.attr = ...` (or +=, or annotated) in `path` whose `name` an import bound:
  an assignment to another module's global, or to a class attribute of an imported class."""
  tree = ast.parse(path.read_text(), str(path))
  imported = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      imported |= {a.asname or a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      imported |= {a.asname or a.name for a in node.names}
  found = []
  for node in ast.walk(tree):
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
    for target in targets:
      for t in target.elts if isinstance(target, ast.Tuple) else [target]:
        root = t
        while isinstance(root, ast.Attribute):
          root = root.value
        if t is not root and isinstance(root, ast.Name) and root.id in imported:
          found.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
  return found


def test_no_module_assigns_another_modules_global():
  files = sorted(PACKAGE.rglob("*.py"))
  assert len(files) > 50  # the whole package is there to check
  assert [hit for f in files for hit in foreign_assignments(f)] == []


def test_the_check_sees_an_assignment_to_an_imported_module(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("from cardjax.decoding import prompts\nimport cardjax.decoding.prompts as p\n"
                 "def f(x):\n  prompts.BUCKET = x\n  p.BUCKET += 1\n  local = object()\n"
                 "  local.attr = 1\n")
  hits = foreign_assignments(bad)
  assert len(hits) == 2 and "prompts.BUCKET" in hits[0] and "p.BUCKET" in hits[1]
