"""The prompt sets of the decode comparison, read from built datasets as token ids.

- arith_problems: the arith_sft test split, chat-rendered, with the reference answers;
- code_prompts: windows of the held-out code documents (python_stdlib), no reference.
Both take the run's config (its data section names the dataset, its options and data_dir)
and the tokenizer; the decoders then see plain ids, so a saved set runs anywhere.
"""

from __future__ import annotations

from cardjax.data import builders
from cardjax.data.prepare import builder_options, data_dir


def arith_problems(config, tokenizer, n: int) -> tuple[list[list[int]], list[str]]:
  """(prompt ids rendered with the chat template, answers) for the first n test problems."""
  source = builders.load_source(config.data.dataset, "test", data_dir(config),
                                **builder_options(config))
  prompts, answers = [], []
  for i in range(min(n, len(source))):
    example = builders.decode(source[i])
    user = [m for m in example["messages"] if m["role"] != "assistant"]
    prompts.append(tokenizer.encode(tokenizer.render_chat(user, add_generation_prompt=True)))
    answers.append(example["answer"])
  return prompts, answers


def code_prompts(config, tokenizer, n: int, length: int) -> list[list[int]]:
  """n prompts of `length` tokens from the held-out documents (data.eval_split): windows
  at offsets 0, 3 * length, 6 * length, ... of each document, so a continuation of
  2 * length tokens exists in the source, taken document by document."""
  source = builders.load_source(config.data.dataset, config.data.eval_split, data_dir(config),
                                **builder_options(config))
  docs = [tokenizer.encode(builders.decode(source[i])["text"]) for i in range(len(source))]
  prompts = []
  for offset in range(0, max(len(d) for d in docs), 3 * length):
    for ids in docs:
      if len(ids) >= offset + 3 * length and len(prompts) < n:
        prompts.append(ids[offset:offset + length])
  return prompts
