"""`cardjax eval --harness TASKS`: lm-eval-harness's simple_evaluate on the cardjax model,
its table on the terminal, and its results JSON with a `cardjax` block per task (the
decoding settings and what the task cost: tokens, forwards, tokens per forward, seconds,
tokens/s, the machine).

The shipped tasks (tasks/) are always on lm-eval's include path. When every task asked
for is a shipped or --include-path one, lm-eval's own ~15k task configs are not indexed
(seconds on a small machine); otherwise they are, and an unknown name is one error listing
the closest known ones, before any weights are read.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from cardjax.errors import CardjaxError

SHIPPED = Path(__file__).parent / "tasks"
INSTALL = "pip install 'cardjax[eval]'"


def check_installed() -> None:
  try:
    import lm_eval  # noqa: F401
  except ImportError:
    raise CardjaxError("--harness needs lm-eval-harness, which is not installed: "
                       f"{INSTALL}") from None


def task_manager(names: list[str], include: str = ""):
  """A TaskManager that knows every name in `names` (see the module docstring)."""
  from lm_eval.tasks import TaskManager

  paths = [str(SHIPPED)] + ([include] if include else [])
  if include and not Path(include).is_dir():
    raise CardjaxError(f"--include-path {include} is not a folder; give the folder that "
                       "holds your task YAML files")
  local = TaskManager(include_path=paths, include_defaults=False)
  if all(n in local.all_tasks for n in names):
    return local
  full = TaskManager(include_path=paths)
  unknown = [n for n in names if n not in full.all_tasks]
  if unknown:
    close = {n: ", ".join(difflib.get_close_matches(n, full.all_tasks, 5)) or "none"
             for n in unknown}
    hints = [f"{n!r} (close: {c})" for n, c in close.items()]
    raise CardjaxError(f"unknown lm-eval task {'; '.join(hints)}; see `lm_eval ls tasks`, "
                       "or give --include-path DIR with your own task YAML")
  return full


def split_tasks(text: str) -> list[str]:
  names = [t.strip() for t in text.split(",") if t.strip()]
  if not names:
    raise CardjaxError("--harness needs task names, comma-separated (e.g. arith_sft,arith_mc)")
  return names


def model_args(args) -> dict:
  """The cardjax model's arguments from `cardjax eval` flags: the checkpoint and every
  decoding flag (decoding/cli.py), under the names model_args use."""
  from cardjax.eval.harness.settings import decoding_parser

  out = {k: getattr(args, k) for k in vars(decoding_parser().parse_args([]))}
  out.update(checkpoint=args.checkpoint, tokenizer=args.tokenizer, batch_size=args.batch,
             elbo_draws=args.elbo_draws, max_length=args.max_length)
  return out


def evaluate(args) -> dict:
  """Run the harness as `cardjax eval --harness` asks; returns lm-eval's results dict with
  out['results'][task]['cardjax'] added (after the table is printed)."""
  check_installed()
  names = split_tasks(args.harness)
  tasks = task_manager(names, args.include_path)
  import lm_eval
  from lm_eval.utils import make_table

  from cardjax.eval.harness.model import CardjaxLM

  lm = CardjaxLM(**model_args(args))
  out = lm_eval.simple_evaluate(
      model=lm, tasks=names, task_manager=tasks, num_fewshot=args.num_fewshot,
      limit=_limit(args.limit), apply_chat_template=args.apply_chat_template,
      fewshot_as_multiturn=args.apply_chat_template, gen_kwargs=args.gen_kwargs or None,
      log_samples=args.log_samples, bootstrap_iters=args.bootstrap_iters,
      confirm_run_unsafe_code=args.confirm_run_unsafe_code)
  print(make_table(out))
  if out.get("groups"):
    print(make_table(out, "groups"))
  for task, block in lm.report().items():
    out["results"].setdefault(task, {})["cardjax"] = block
  return out


def _limit(limit: float | None):
  """lm-eval's --limit: a count from 1 up, a fraction of each task below 1."""
  if limit is None:
    return None
  if limit <= 0:
    raise CardjaxError(f"--limit {limit} must be > 0: a count of documents per task, or a "
                       "fraction below 1")
  return int(limit) if limit >= 1 else limit


def write(out: dict, path: str):
  """The results JSON at `path` (local, gs:// or s3://)."""
  from lm_eval.utils import handle_non_serializable

  from cardjax.storage import checked_path

  target = checked_path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_text(json.dumps(out, indent=2, default=handle_non_serializable,
                               ensure_ascii=False) + "\n")
  return target
