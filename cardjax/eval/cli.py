"""`cardjax eval --checkpoint RUN --task nll|arith|jsonl [--compare RUN2] [--out FILE]`, or
`cardjax eval --checkpoint RUN --harness TASKS [...]`: lm-eval-harness (eval/harness/).

The decoding flags (--method, --tau, --block, ...) are `cardjax generate`'s, defined once
(decoding/cli.py: add_decoding_arguments) and parsed once (options_from_args).
"""

from __future__ import annotations

import argparse
import sys

from cardjax.errors import CardjaxError, CheckpointError


def add_arguments(p: argparse.ArgumentParser) -> None:
  """The flags of `cardjax eval`: its own, then the decoding ones."""
  from cardjax.decoding.cli import add_decoding_arguments
  from cardjax.eval.tasks import TASKS

  p.add_argument("--checkpoint", required=True,
                 help="a run folder or its checkpoints/ (local, gs:// or s3://)")
  which = p.add_mutually_exclusive_group(required=True)
  which.add_argument("--task", help=" | ".join(TASKS))
  which.add_argument("--harness", default="", metavar="TASKS",
                     help="lm-eval-harness tasks, comma-separated (shipped: arith_sft, "
                          "arith_mc); needs the eval extra")
  p.add_argument("--compare", default="",
                 help="a second checkpoint, evaluated with the same settings; the table and "
                      "report show both and their difference")
  p.add_argument("--out", "--output", dest="out", default="",
                 help="write the JSON report here (--harness: lm-eval's results JSON)")
  p.add_argument("--tokenizer", default="", help="HF tokenizer folder (default: the run's)")
  p.add_argument("--batch", "--batch-size", dest="batch", type=int, default=8,
                 help="arith / jsonl / --harness: prompts decoded (or scored) together")
  p.add_argument("--n", type=int, default=0,
                 help="arith: problems (0: 100); jsonl: the first N lines (0: all)")
  g = p.add_argument_group("nll")
  g.add_argument("--dataset", default="", help="a built dataset (default: the run's)")
  g.add_argument("--split", default="",
                 help="its split (default: the run's data.eval_split, else validation / test)")
  g.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                 help="a dataset builder option of --dataset (as `cardjax data build` takes "
                      "them), repeated for more; default: its default build")
  g.add_argument("--batches", type=int, default=0,
                 help="batches scored (0: the run's train.eval_steps, as the trainer)")
  g.add_argument("--data-dir", default="", help="arith / nll: the datasets' folder "
                                               "(default: the run's data.data_dir)")
  g = p.add_argument_group("jsonl")
  g.add_argument("--file", default="", help="one JSON object a line")
  g.add_argument("--prompt-field", default="prompt", help="the prompt's key (GSM8K: question)")
  g.add_argument("--answer-field", default="answer", help="the reference answer's key")
  g.add_argument("--extract", default="",
                 help="regex whose last match (group 1 if it has groups) is the generation's "
                      "answer (default: the text after '####', else the last number)")
  g.add_argument("--normalize", action="store_true",
                 help="compare answers ignoring case, spaces, ',' '$' and a final '.'")
  g.add_argument("--no-chat", action="store_true",
                 help="feed prompts as written, not in the checkpoint's chat template")
  g = p.add_argument_group("harness (lm-eval-harness)")
  g.add_argument("--include-path", default="",
                 help="a folder of your own lm-eval task YAML files")
  g.add_argument("--num-fewshot", type=int, default=None, help="examples in each prompt")
  g.add_argument("--limit", type=float, default=None,
                 help="documents per task (a fraction of each when below 1)")
  g.add_argument("--apply-chat-template", action="store_true",
                 help="render prompts with the checkpoint's chat template (as lm_eval's flag)")
  g.add_argument("--gen-kwargs", default="",
                 help="override the tasks' generation settings, e.g. max_gen_toks=256")
  g.add_argument("--confirm-run-unsafe-code", action="store_true",
                 help="let tasks that run the generated code (humaneval, mbpp) run it")
  g.add_argument("--log-samples", action="store_true",
                 help="keep every request and response in the JSON")
  g.add_argument("--max-length", type=int, default=0,
                 help="tokens a scored sequence or rolling window holds (0: the model's "
                      "context); lower it to bound memory on long documents")
  g.add_argument("--elbo-draws", type=int, default=32,
                 help="MDLM / BD3LM checkpoints: Monte Carlo mask draws per scored "
                      "request")
  g.add_argument("--bootstrap-iters", type=int, default=100000,
                 help="bootstrap resamples of the standard errors (0: none)")
  add_decoding_arguments(p)


def run(args) -> int:
  """Evaluate --checkpoint (and --compare) on --task or --harness; print the table, write
  --out."""
  import contextlib

  import jax

  from cardjax.parallel import make_mesh

  from cardjax.eval import answers, tasks
  from cardjax.restore import checkpoints_dir

  if getattr(args, "harness", ""):
    return _harness(args)
  tasks.check_args(args)
  if args.out:  # a bucket that cannot take the report fails now, not after the evaluation
    from cardjax.storage import check
    check(args.out)
  pattern, rows = None, None
  if args.task == "jsonl":  # every line checked before minutes go into loading
    from cardjax.eval import jsonl
    pattern = answers.compile_pattern(args.extract)
    rows = jsonl.read_examples(args.file, args.prompt_field, args.answer_field, args.n)
  paths = [args.checkpoint] + ([args.compare] if args.compare else [])
  for path in paths:  # both, before minutes go into the first
    if not checkpoints_dir(path).is_dir():
      raise CheckpointError(f"checkpoint {path} does not exist; give a run folder (with "
                            "checkpoints/) or a checkpoint folder")
  mesh = make_mesh(1, -1, 1) if jax.device_count() > 1 else None
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    report = _evaluate(args, paths, mesh, pattern, rows)
  from cardjax.eval import report as reporting
  print(reporting.table(report))
  if args.out:
    print(f"report: {reporting.write(report, args.out)}")
  return 0


def _evaluate(args, paths, mesh, pattern, rows) -> dict:
  import dataclasses

  from cardjax import machine
  from cardjax.decoding.cli import options_from_args, resolve_block
  from cardjax.eval import report, tasks
  from cardjax.restore import load_run

  decoding = args.task in tasks.DECODING
  runs, settings, block = [], {}, None
  for path in paths:
    run = load_run(path, mesh=mesh, tokenizer=args.tokenizer, objective=args.objective,
                   method=args.method if decoding else "")
    entry = {"checkpoint": str(path), "step": run.step, "objective": run.objective}
    if decoding:
      if block is None:  # --block 0 resolves on the first checkpoint; both decode with it
        block = resolve_block(args.method, args.block, run.run_config,
                              log=lambda line: print(line, file=sys.stderr),
                              command="cardjax eval")
      options = options_from_args(args, run.tokenizer.stop_ids, run.tokenizer.pad_id, block,
                                  run.shift)
      if not settings:
        settings = {"method": args.method, "batch": args.batch,
                    "options": {k: v for k, v in dataclasses.asdict(options).items()
                                if k not in ("stop_ids", "pad_id", "shift")}}
      entry["shift"] = run.shift
      out = (tasks.run_arith(args, run, options) if args.task == "arith"
             else tasks.run_jsonl(args, run, options, pattern, rows))
    else:
      out = tasks.run_nll(args, run, mesh)
      settings = settings or {k: out["metrics"][k] for k in ("dataset", "split", "batches")}
    entry.update(out)
    runs.append(entry)
    del run  # the second checkpoint is restored after the first is released
  task = {"name": args.task}
  if args.task == "jsonl":
    task.update(file=args.file, prompt_field=args.prompt_field, answer_field=args.answer_field,
                extract=args.extract or "default (after '####', else the last number)",
                normalize=args.normalize, chat=not args.no_chat)
  elif args.task == "arith":
    task.update(dataset="arith_sft", split="test", n=runs[0]["metrics"]["n"])
  return report.build(machine.describe(), task, settings, runs)


def _harness(args) -> int:
  """lm-eval-harness on one checkpoint (eval/harness/runner.py), on one device."""
  from cardjax.eval.harness import runner
  from cardjax.restore import checkpoints_dir

  if args.compare:
    raise CardjaxError("--compare works with --task only; run --harness once per checkpoint")
  runner.check_installed()
  if args.out:  # a bucket that cannot take the results fails now, not after the evaluation
    from cardjax.storage import check
    check(args.out)
  if not checkpoints_dir(args.checkpoint).is_dir():
    raise CheckpointError(f"checkpoint {args.checkpoint} does not exist; give a run folder "
                          "(with checkpoints/) or a checkpoint folder")
  out = runner.evaluate(args)
  if args.out:
    print(f"results: {runner.write(out, args.out)}")
  return 0
