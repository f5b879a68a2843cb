"""A user's evaluation file: one JSON object a line with a prompt and its answer.

Field names are configurable (--prompt-field, --answer-field: GSM8K's are 'question' and
'answer'). Every line must hold both as strings; the first bad line is one error naming
its number, so a 10,000-line file is fixed in one pass instead of failing mid-run.
"""

from __future__ import annotations

import json
from pathlib import Path

from cardjax.errors import CardjaxError
from cardjax.storage import checked_path


def read_examples(path: str | Path, prompt_field: str = "prompt",
                  answer_field: str = "answer", limit: int = 0) -> list[dict]:
  """[{'prompt': str, 'answer': str, 'line': n}] of the first `limit` lines (0: all)."""
  path = checked_path(path)  # local, gs:// or s3://
  if not path.is_file():
    raise CardjaxError(f"--file {path} does not exist; give a .jsonl file with one "
                       f'{{"{prompt_field}": ..., "{answer_field}": ...}} object a line')
  examples = []
  for number, line in enumerate(path.read_text().splitlines(), start=1):
    where = f"{path}:{number}"
    if not line.strip():
      raise CardjaxError(f"{where} is empty; every line needs a JSON object (delete the "
                         "blank line)")
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise CardjaxError(f"{where} is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
      raise CardjaxError(f"{where} holds a JSON {type(row).__name__}, not an object with "
                         f"{prompt_field!r} and {answer_field!r}")
    for field in (prompt_field, answer_field):
      if field not in row:
        raise CardjaxError(f"{where} has no field {field!r} (it has {sorted(row)}); name the "
                           "fields with --prompt-field / --answer-field")
      value = row[field]
      if isinstance(value, (int, float)) and not isinstance(value, bool) \
          and field == answer_field:
        row[field] = str(value)  # a numeric answer is compared as its text
      elif not isinstance(value, str) or not value.strip():
        raise CardjaxError(f"{where}: field {field!r} must be a non-empty string, got "
                           f"{value!r}")
    examples.append({"prompt": row[prompt_field], "answer": row[answer_field],
                     "line": number})
    if limit and len(examples) == limit:
      break
  if not examples:
    raise CardjaxError(f"{path} holds no examples; write one JSON object a line")
  return examples
