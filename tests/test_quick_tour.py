"""README.md's quick tour runs as written, in order, in a fresh folder.

The tour is the text between `<!-- quick-tour -->` and `<!-- /quick-tour -->` in README.md:
a bash block of commands (one a line, `\\` continues a line) and a python block. The fast
test reads it and checks that every run, checkpoint or HF folder a step reads was written
by an earlier step. The second runs it as a new user would: each command in bash, in a copy
of the repository in a new folder (run by the copy's code), with an empty HOME,
XDG_CACHE_HOME and CARDJAX_DATA_DIR (tests/fresh_machine.py), the venv's `cardjax` first on
the PATH and the environment each command leaves (its `export`s) passed on to the next;
every command must exit 0, then the python block runs, then the artefacts of each step must
exist. About 2 minutes on 2 CPU cores (1 min 55 s with a cold compilation cache,
2026-12-06); `make docs` runs it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fresh_machine import ROOT, copy_repository, fresh_environment
BEGIN, END = "<!-- quick-tour -->", "<!-- /quick-tour -->"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def tour_blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of each fenced block between the markers."""
  assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md: quick-tour markers"
  inner = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
  return [(m.group(1), m.group(2)) for m in BLOCK.finditer(inner)]


def shell_commands(body: str) -> list[str]:
  """The block's commands, continuation lines joined; blank and comment lines dropped."""
  commands, pending = [], ""
  for line in body.splitlines():
    if line.rstrip().endswith("\\"):
      pending += line.rstrip()[:-1] + " "
      continue
    line = pending + line
    pending = ""
    if line.strip() and not line.lstrip().startswith("#"):
      commands.append(line.strip())
  assert not pending, "a command ends with a continuation"
  return commands


def tour() -> tuple[list[str], list[str]]:
  """(bash commands, python sources) of README.md's quick tour."""
  blocks = tour_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
  bash = [c for lang, body in blocks if lang in ("bash", "sh", "") for c in shell_commands(body)]
  python = [body for lang, body in blocks if lang == "python"]
  return bash, python


def _norm(path: str) -> str:
  return path.rstrip("/").removesuffix("/checkpoints")


def reads_and_writes(command: str) -> tuple[list[str], list[str]]:
  """The runs / folders a cardjax command reads and writes (its outputs as written)."""
  words = shlex.split(command, comments=True)
  if not words or words[0] != "cardjax":
    return [], []
  reads, writes = [], []
  flags: dict = {}
  positional = []
  args, i = words[2:], 0
  while i < len(args):
    word = args[i]
    if word.startswith("--") and "=" in word:
      key, value = word.split("=", 1)
      flags[key] = value
    elif word.startswith("--"):  # a flag and its value, or a switch (--chat, --verify)
      has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
      flags[word] = args[i + 1] if has_value else ""
      i += has_value
    else:
      positional.append(word)
    i += 1
  reads += [flags[f] for f in ("--config.train.init_from", "--checkpoint", "--compare")
            if flags.get(f)]
  writes += [flags[f] for f in ("--workdir",) if f in flags]
  if words[1] in ("export-hf", "import-hf", "import-gguf") and len(positional) >= 2:
    reads.append(positional[0])
    writes.append(positional[1])
  return [_norm(p) for p in reads], [_norm(p) for p in writes]


def test_tour_reads_only_what_it_wrote():
  """Each step's inputs come from an earlier step: no run the tour did not create."""
  bash, python = tour()
  assert len(bash) >= 8 and python, "README.md's quick tour lost its commands"
  written: list[str] = []
  for command in bash:
    reads, writes = reads_and_writes(command)
    for path in reads:
      assert any(path == w or path.startswith(w + "/") for w in written), (
          f"README quick tour: `{command}` reads {path}, which no earlier step writes")
    written += writes
  for source in python:
    for path in re.findall(r"from_pretrained\(\"([^\"]+)\"", source):
      assert any(_norm(path) == w or path.startswith(w + "/") for w in written), path


def _environment(tmp: Path, clone: Path) -> dict:
  """A new user's: empty HOME, XDG_CACHE_HOME and CARDJAX_DATA_DIR (the tour sets the
  last), one CPU device, the venv's `cardjax` first on the PATH running the clone's code."""
  env = fresh_environment(tmp)
  env["PYTHONPATH"] = str(clone)  # before the editable install's finder
  return env


def _run(command: str, cwd: Path, env: dict, log: list) -> tuple[dict, str]:
  """Runs one command in bash; returns the environment it leaves and its output."""
  env_file = cwd / ".tour_env"
  script = f"{command}\n__rc=$?\nenv -0 > {shlex.quote(str(env_file))}\nexit $__rc\n"
  start = time.time()
  proc = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=900)
  log.append((command, round(time.time() - start, 1)))
  output = proc.stdout + proc.stderr
  assert proc.returncode == 0, (f"README quick tour: `{command}` exited {proc.returncode}:\n"
                                f"{output[-4000:]}")
  new_env = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
  return new_env, output


@pytest.mark.docs  # about 100 s: run by `make docs`, beside the site build
def test_quick_tour_runs(tmp_path: Path):
  bash, python = tour()
  clone = copy_repository(tmp_path / "clone")
  env = _environment(tmp_path, clone)
  log: list = []
  outputs = {}
  for command in bash:
    env, outputs[command] = _run(command, clone, env, log)
  for i, source in enumerate(python):
    script = clone / f"tour_{i}.py"
    script.write_text(source)
    _, outputs[f"python block {i}"] = _run(f"{shlex.quote(sys.executable)} {script.name}",
                                           clone, env, log)
  print("\n".join(f"{seconds:7.1f}s  {command[:90]}" for command, seconds in log))

  runs = clone / "runs"
  assert env.get("CARDJAX_DATA_DIR") == str(runs / "data")
  assert list((runs / "data" / "arith_sft").glob("*/1.0.0/dataset_info.json"))
  assert list((runs / "data" / "tokenizers").glob("arith_sft-*"))
  for run in ("sft", "mars"):
    assert (runs / run / "checkpoints" / "100").is_dir(), run
    assert (runs / run / "metrics.jsonl").is_file(), run
  eval_out = next(v for k, v in outputs.items() if k.startswith("cardjax eval"))
  assert "exact_match" in eval_out and "tokens_per_forward" in eval_out
  generate_out = next(v for k, v in outputs.items() if k.startswith("cardjax generate"))
  assert "tokens per forward" in generate_out
  for folder in (runs / "mars" / "hf", runs / "mars" / "hf_copy"):
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert (folder / "tokenizer.json").is_file(), folder
  assert (runs / "mars_hf" / "checkpoints" / "0").is_dir()
  assert not (tmp_path / "home" / "tensorflow_datasets").exists()
  assert not any((tmp_path / "data").iterdir())  # the tour's own CARDJAX_DATA_DIR was used
