"""The tasks of `cardjax eval`: what each reads, how it prompts and how it is scored.

- nll: the AR-order NLL and perplexity on a built dataset split (eval/nll.py);
- arith: exact match of "The answer is N." on the arith_sft test split, chat-rendered;
- jsonl: a user's {"prompt", "answer"} file, chat-rendered when the tokenizer has a chat
  template, scored by exact match of the extracted answer (eval/answers.py).
Each task returns {'metrics': {...}} (and 'examples' for the decoding tasks).
"""

from __future__ import annotations

from cardjax.errors import CardjaxError

TASKS = ("nll", "arith", "jsonl")
DECODING = ("arith", "jsonl")
ARITH_N = 100  # arith problems when --n is 0


def has_chat_template(tokenizer) -> bool:
  """Whether the checkpoint's tokenizer names a chat template (cardjax's trained BPEs and
  instruct models do; a base model's may not, and ChatML would then be foreign to it)."""
  return bool(tokenizer.config.get("chat_template"))


def check_args(args) -> None:
  """Task and flag mismatches, before any checkpoint is read."""
  if args.task not in TASKS:
    raise CardjaxError(f"unknown task {args.task!r}; choose one of {', '.join(TASKS)}")
  if args.task == "jsonl" and not args.file:
    raise CardjaxError("--task jsonl needs --file FILE.jsonl (one {\"prompt\": ..., "
                       "\"answer\": ...} object a line)")
  if args.file and args.task != "jsonl":
    raise CardjaxError(f"--file is read by --task jsonl only, not --task {args.task}")
  if args.n < 0 or args.batch < 1:
    raise CardjaxError(f"--n {args.n} must be >= 0 and --batch {args.batch} >= 1")


def run_nll(args, run, mesh, progress: bool = True) -> dict:
  from cardjax.eval import nll

  options = {}
  for item in args.option:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise CardjaxError(f"--option {item!r} must be KEY=VALUE (e.g. --option test_size=50)")
    options[key] = value
  if options and not args.dataset:
    raise CardjaxError("--option applies to --dataset NAME; name the dataset too")
  config = nll.data_config(run, args.dataset, args.data_dir, args.tokenizer, options)
  split = args.split or nll.default_split(config)
  return {"metrics": nll.evaluate_nll(run, config, split, args.batches, mesh, progress)}


def run_arith(args, run, options, progress: bool = True) -> dict:
  from cardjax.data import arith
  from cardjax.eval import generation, inputs, nll

  if not has_chat_template(run.tokenizer):
    raise CardjaxError(f"{run.root} cannot serve --task arith: its tokenizer has no chat "
                       "template, and the problems are chat-rendered; pass --tokenizer with "
                       "an instruct model's tokenizer folder")
  config = nll.data_config(run, "arith_sft", args.data_dir)
  prompts, answers = inputs.arith_problems(config, run.tokenizer, args.n or ARITH_N)

  def grade(i, text):
    return {"correct": arith.grade(text, answers[i]), "answer": answers[i],
            "prompt": run.tokenizer.decode(prompts[i])}

  return generation.decode_and_grade(run, args.method, options, args.batch, prompts, grade,
                                     progress, desc="arith")


def run_jsonl(args, run, options, pattern, rows, progress: bool = True) -> dict:
  """`rows`: eval/jsonl.py's read_examples of --file, read before the checkpoint."""
  from cardjax.eval import answers, generation
  chat = not args.no_chat and has_chat_template(run.tokenizer)
  tok = run.tokenizer
  texts = [tok.render_chat([{"role": "user", "content": r["prompt"]}],
                           add_generation_prompt=True) if chat else r["prompt"] for r in rows]
  prompts = [tok.encode(t) for t in texts]

  def grade(i, text):
    ok, got = answers.correct(text, rows[i]["answer"], pattern, args.normalize)
    return {"correct": ok, "extracted": got, "reference": answers.reference(rows[i]["answer"]),
            "prompt": rows[i]["prompt"], "line": rows[i]["line"]}

  out = generation.decode_and_grade(run, args.method, options, args.batch, prompts, grade,
                                    progress, desc="jsonl")
  out["metrics"]["chat_template"] = chat
  return out
