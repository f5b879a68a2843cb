"""The package layering: cardjax/decoding/ holds samplers on token arrays, so none of its
modules imports the datasets, the checkpoints, the evaluation or the server (its
continuous-batching pool is cardjax/serve/pool/) built on top of it."""

import ast
from pathlib import Path

import cardjax

DECODING = Path(cardjax.__file__).parent / "decoding"
FORBIDDEN = ("cardjax.data", "cardjax.eval", "cardjax.checkpoint", "cardjax.restore",
             "cardjax.train", "cardjax.hf", "cardjax.serve")


def imported_modules(path: Path) -> list[str]:
  """Every module an import statement of `path` names, at any depth (lazy imports too)."""
  names = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.append(node.module)
      names += [f"{node.module}.{a.name}" for a in node.names]  # from cardjax import data
  return names


def test_decoding_imports_no_data_checkpoint_eval_or_serve():
  files = sorted(DECODING.glob("*.py"))
  assert len(files) > 10  # the samplers are there to check
  offending = [f"{f.name}: {name}" for f in files for name in imported_modules(f)
               if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)]
  assert offending == []


def test_the_check_sees_an_offending_import(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from cardjax import checkpoint\n  import cardjax.data.arith\n")
  assert "cardjax.checkpoint" in imported_modules(bad)
  assert "cardjax.data.arith" in imported_modules(bad)


def test_the_old_evaluation_modules_are_gone():
  assert not (DECODING / "evaluate.py").exists() and not (DECODING / "suite.py").exists()
