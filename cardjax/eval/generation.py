"""Decode a prompt set with one method and grade it: the `arith` and `jsonl` tasks.

Speed is measured as the decode benchmark measures it (eval/measure.py): every compiled
shape is decoded once first, so tokens/s counts no compile, and tokens per forward counts a
batched forward once per row in it. The graded examples go into the report, so a wrong
answer can be read next to its prompt.
"""

from __future__ import annotations

from typing import Callable, Sequence

from cardjax.errors import CardjaxError


def decode_and_grade(run, method: str, options, batch: int, prompts: Sequence[Sequence[int]],
                     grade: Callable[[int, str], dict], progress: bool = True,
                     desc: str = "decode") -> dict:
  """{'metrics': {...}, 'examples': [...]} of decoding `prompts` (token ids) with `method`;
  grade(i, generated_text) -> {'correct': bool, ...} scores example i."""
  import time

  from tqdm import tqdm

  from cardjax.decoding.methods import make_decoder
  from cardjax.eval import measure

  if batch < 1:
    raise CardjaxError(f"--batch {batch} must be >= 1")
  decode = make_decoder(method, run.frozen, run.objective, options)
  start = time.perf_counter()
  chunks = measure.warm_up(decode, prompts, batch)
  compile_seconds = time.perf_counter() - start
  with tqdm(total=len(prompts), desc=desc, unit="prompt", disable=not progress,
            dynamic_ncols=True) as bar:
    start = time.perf_counter()
    rows, forwards, row_forwards, batch_row_forwards = measure.one_pass(decode, chunks,
                                                                        progress=bar)
    seconds = time.perf_counter() - start
  timed = measure.Run(rows, forwards, [seconds], batch, row_forwards, batch_row_forwards)
  examples = []
  for i, row in enumerate(rows):
    text = run.tokenizer.decode(row, skip_special=True)
    examples.append({"index": i, "generation": text, "tokens": len(row), **grade(i, text)})
  correct = sum(bool(e["correct"]) for e in examples)
  metrics = {"exact_match": correct / max(len(examples), 1), "correct": correct,
             "n": len(examples), "tokens": timed.tokens, "forwards": forwards,
             "row_forwards": row_forwards, "tokens_per_forward": timed.tokens_per_forward,
             "batch_fill": timed.batch_fill,
             "tokens_per_second": timed.tokens_per_second, "seconds": seconds,
             "warmup_seconds": compile_seconds}
  return {"metrics": metrics, "examples": examples}
