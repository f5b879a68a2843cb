"""The answer a generation gives, and the normalisation both sides get before comparing.

The default is GSM8K's convention (lm-eval-harness' gsm8k "strict" and "flexible" rules in
one): the text after the last '####' when the generation writes one, else the last number
in it. A user's --extract regex replaces it: its last match, group 1 when it has groups.
"""

from __future__ import annotations

import re

from cardjax.errors import CardjaxError

HASHES = re.compile(r"####\s*([^\n]*)")
NUMBER = re.compile(r"-?[$]?\d[\d,]*(?:\.\d+)?")


def compile_pattern(pattern: str | None) -> re.Pattern | None:
  """The compiled --extract regex (None: the default rule), or one clear error."""
  if not pattern:
    return None
  try:
    return re.compile(pattern)
  except re.error as e:
    raise CardjaxError(f"--extract {pattern!r} is not a valid regular expression ({e}); "
                       "write a Python regex, e.g. 'answer is (\\S+)'") from None


def extract(text: str, pattern: re.Pattern | None = None) -> str | None:
  """The answer in `text`, or None when there is none."""
  if pattern is not None:
    found = list(pattern.finditer(text))
    if not found:
      return None
    last = found[-1]
    return last.group(1) if pattern.groups else last.group(0)
  hashes = HASHES.findall(text)
  if hashes:
    return hashes[-1].strip()
  numbers = NUMBER.findall(text)
  return numbers[-1] if numbers else None


def reference(answer: str) -> str:
  """The reference of a dataset answer: a GSM8K solution ('... #### 72') keeps what
  follows the last '####'; any other answer is used as written."""
  hashes = HASHES.findall(answer)
  return hashes[-1].strip() if hashes else answer.strip()


def normalize(text: str) -> str:
  """Case, surrounding space, thousands separators, '$' and a final '.' do not count: the
  GSM8K-style comparison, where '$1,000.' and '1000' are the same answer."""
  text = " ".join(text.strip().lower().split())
  text = text.replace(",", "").replace("$", "")
  return text[:-1].rstrip() if text.endswith(".") else text


def correct(generated: str, answer: str, pattern: re.Pattern | None = None,
            normalise: bool = False) -> tuple[bool, str | None]:
  """(whether the generation's answer equals the reference, the extracted answer)."""
  got = extract(generated, pattern)
  if got is None:
    return False, None
  want = reference(answer)
  if normalise:
    return normalize(got) == normalize(want), got
  return got.strip() == want, got
