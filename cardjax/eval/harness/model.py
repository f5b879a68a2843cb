"""CardjaxLM: a cardjax checkpoint as lm-eval-harness's model `cardjax`.

    lm_eval.simple_evaluate(model="cardjax", tasks=[...],
                            model_args="checkpoint=RUN,method=mars,tau=0.9")

after `import cardjax.eval.harness.model`, which registers it (`cardjax eval --harness`
does that). Scoring requests (loglikelihood, loglikelihood_rolling, multiple choice) are
answered in AR order by any causal checkpoint (AR, MARS and CARD training keep the causal
next-token head; loglik.py), whatever --method decodes, and by a Monte Carlo ELBO estimate
for MDLM checkpoints and, block by block, BD3LM ones (elbo.py). Generation
decodes with --method (generating.py).
Tokenization is lm-eval's hf model's: no special tokens added, a context/continuation pair
encoded whole and split where the context's own encoding ends, so a checkpoint and its
`cardjax export-hf` folder get the same requests.
"""

from __future__ import annotations

import collections
import dataclasses

import lm_eval.models  # noqa: F401 (lm-eval's own models, lazily: else its registry
# would hold `cardjax` alone and never load them)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from cardjax.errors import CardjaxError
from cardjax.eval.harness import generating, loglik, metrics, settings

ELBO = ("mdlm", "bd3lm")  # objectives scored by a Monte Carlo ELBO, not in AR order


@register_model("cardjax")
class CardjaxLM(LM):
  def __init__(self, **model_args):
    super().__init__()
    from cardjax import machine
    from cardjax.decoding.cli import options_from_args, resolve_block
    from cardjax.restore import load_run, run_objective

    self.settings = settings.parse(model_args)
    d = self.settings.decoding
    if d.temperature > 0:
      raise CardjaxError(f"temperature={d.temperature}: the cardjax harness model decodes "
                         "greedily only (lm-eval's sampled tasks need its seeds and "
                         "repeats); drop temperature")
    # A method the checkpoint cannot serve fails here, before the weights are read; but a
    # BD3LM checkpoint, which no decoder serves yet, still scores: generate_until says so.
    scoring_only = run_objective(self.settings.checkpoint, d.objective) == "bd3lm"
    self.run = load_run(self.settings.checkpoint, tokenizer=self.settings.tokenizer,
                        objective=d.objective, method="" if scoring_only else d.method)
    self.tokenizer = self.run.tokenizer
    block = resolve_block(d.method, d.block, self.run.run_config,
                          command="cardjax eval --harness")
    self.options = options_from_args(d, self.tokenizer.stop_ids, self.tokenizer.pad_id,
                                     block, self.run.shift)
    context = self.run.model.cfg.max_position_embeddings
    self.max_length = min(self.settings.max_length or context, context)
    self.batch_size = self.settings.batch_size
    self.ledger = metrics.Ledger()
    self._decoders: dict = {}
    self._warm: set = set()
    options = {k: v for k, v in dataclasses.asdict(self.options).items()
               if k not in ("stop_ids", "pad_id", "max_new_tokens")}
    self.description = {"checkpoint": str(self.settings.checkpoint), "step": self.run.step,
                        "objective": self.run.objective, "method": d.method,
                        "options": options, "batch_size": self.batch_size,
                        "max_length": self.max_length, "machine": machine.describe()}
    if self.run.objective in ELBO:
      self.description["elbo_draws"] = self.settings.elbo_draws

  # -- tokenization, as lm-eval's hf model ------------------------------------------------

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eos_id

  @property
  def prefix_token_id(self) -> int:
    """The context of a request with none: BOS when the tokenizer has one, else end of
    text (lm-eval's hf rule)."""
    bos = self.tokenizer.config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    found = self.tokenizer.tok.token_to_id(bos) if bos else None
    return self.eot_token_id if found is None else found

  def tok_encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text)

  def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids). Trailing spaces of the context go with the
    continuation (a BPE writes them as the next word's prefix); then the whole text is
    encoded and split where the context's own encoding ends, so the continuation's ids are
    the ones the model would see after the context."""
    if not context:
      ids = self.tok_encode(continuation)
      if ids and ids[0] == self.prefix_token_id:
        return ids[:1], ids[1:]
      return [self.prefix_token_id], ids
    stripped = context.rstrip()
    continuation = context[len(stripped):] + continuation
    whole = self.tok_encode(stripped + continuation)
    n = len(self.tok_encode(stripped))
    return whole[:n], whole[n:]

  # -- chat ---------------------------------------------------------------------------------

  @property
  def tokenizer_name(self) -> str:
    return str(self.tokenizer.source or self.settings.checkpoint).replace("/", "__")

  def chat_template(self, chat_template: bool | str = False) -> str | None:
    return self.tokenizer.chat_template if chat_template else None

  def apply_chat_template(self, chat_history: list[dict], add_generation_prompt=True) -> str:
    return self.tokenizer.render_chat(chat_history,
                                      add_generation_prompt=add_generation_prompt)

  # -- scoring ------------------------------------------------------------------------------

  def _check_scoring(self) -> None:
    """Scoring needs an AR-order likelihood (causal checkpoints) or an ELBO estimate
    (MDLM, BD3LM)."""
    from cardjax.decoding.methods import SERVES

    objective = self.run.objective
    if objective not in ELBO and "ar" not in SERVES.get(objective, ()):
      raise CardjaxError(
          f"{self.settings.checkpoint} was trained with objective {objective!r}, which has "
          "neither an AR-order likelihood nor an ELBO estimate in cardjax yet; "
          "loglikelihood tasks (multiple choice, perplexity) need an AR, MARS, CARD, "
          "MDLM or BD3LM checkpoint: run generate_until tasks only")

  def _score(self, task: str, pairs, progress=None) -> list[tuple[float, bool]]:
    """AR order for causal checkpoints (loglik.py), the ELBO estimate for MDLM ones
    and BD3LM ones (elbo.py)."""
    common = dict(max_length=self.max_length, batch_size=self.batch_size,
                  pad_id=self.tokenizer.pad_id, cost=self.ledger.scoring(task),
                  progress=progress)
    if self.run.objective in ("mdlm", "bd3lm"):
      from cardjax.eval.harness import elbo
      block = None
      if self.run.objective == "bd3lm":
        block = int(self.run.run_config["objective"].get("block_size") or 0)
      return elbo.score(self.run.frozen, pairs, mask_id=self.run.model.cfg.mask_token_id,
                        shift=self.options.shift, draws=self.settings.elbo_draws,
                        seed=self.settings.decoding.seed, block_size=block, **common)
    return loglik.score(self.run.frozen, pairs, **common)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    self._check_scoring()
    out: list = [None] * len(requests)
    with tqdm(total=len(requests), desc="loglikelihood", disable=disable_tqdm) as bar:
      for task, idx in _by_task(requests).items():
        pairs = [self.encode_pair(*requests[i].args) for i in idx]
        self.ledger.scoring(task).requests += len(idx)
        for i, result in zip(idx, self._score(task, pairs, bar)):
          out[i] = result
          self.cache_hook.add_partial("loglikelihood", requests[i].args, result)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    self._check_scoring()
    out: list = [None] * len(requests)
    # An AR window reads max_length tokens to score max_length (the last is only a target);
    # an ELBO window reads all it scores, plus its one context token.
    window = self.max_length - (self.run.objective in ELBO)
    for task, idx in tqdm(_by_task(requests).items(), desc="loglikelihood_rolling",
                          disable=disable_tqdm):
      windows, owner = [], []
      for i in idx:
        (text,) = requests[i].args
        got = loglik.rolling_windows(self.tok_encode(text), self.prefix_token_id, window)
        windows += got
        owner += [i] * len(got)
      self.ledger.scoring(task).requests += len(idx)
      totals = collections.defaultdict(float)
      for i, (ll, _) in zip(owner, self._score(task, windows)):
        totals[i] += ll
      for i in idx:
        out[i] = totals[i]
        self.cache_hook.add_partial("loglikelihood_rolling", requests[i].args, totals[i])
    return out

  # -- generation ---------------------------------------------------------------------------

  def _room(self, max_new: int) -> int:
    """Context positions a decode of max_new tokens may use after the prompt: the new
    tokens plus what the method writes past them (MARS drafts and verify windows, whole
    blocks)."""
    o = self.options
    if self.settings.decoding.method == "ar":
      return max_new
    block = max(o.block, o.cache_block)
    return -(-max_new // block) * block + 2 * block

  def _decoder(self, max_new: int):
    if max_new not in self._decoders:
      from cardjax.decoding.methods import make_decoder
      self._decoders[max_new] = make_decoder(
          self.settings.decoding.method, self.run.frozen, self.run.objective,
          generating.options_for(self.options, max_new))
    return self._decoders[max_new]

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    from cardjax.decoding.methods import check_method

    # A scoring-only checkpoint (BD3LM) was loaded without the method check: it fails here.
    check_method(self.settings.decoding.method, self.run.objective,
                 where=str(self.settings.checkpoint))
    out: list = [None] * len(requests)
    groups = collections.defaultdict(list)
    for i, r in enumerate(requests):
      context, kwargs = r.args
      groups[(r.task_name, repr(sorted(kwargs.items())))].append(i)
    with tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm) as bar:
      for (task, _), idx in groups.items():
        kwargs = dict(requests[idx[0]].args[1])
        generating.check_greedy(kwargs, task)
        until = generating.until_of(kwargs)
        max_new = int(kwargs.get("max_gen_toks") or self.settings.max_gen_toks)
        room = self._room(max_new)
        if room >= self.max_length:
          raise CardjaxError(f"task {task}: max_gen_toks={max_new} leaves no room for a "
                             f"prompt in the model's context of {self.max_length} tokens; "
                             "lower it with --gen-kwargs max_gen_toks=N")
        prompts = [self.tok_encode(requests[i].args[0])[-(self.max_length - room):]
                   for i in idx]
        rows = generating.decode_group(self._decoder(max_new), prompts, self.batch_size,
                                       self.ledger.generation(task), self._warm, max_new)
        for i, row in zip(idx, rows):
          text = generating.cut(self.tokenizer.decode(row, skip_special=True), until)
          out[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
        bar.update(len(idx))
    return out

  def report(self) -> dict[str, dict]:
    """{task: its `cardjax` block}: the settings and what each task cost."""
    return self.ledger.tasks(self.description)


def _by_task(requests) -> dict[str, list[int]]:
  groups = collections.defaultdict(list)
  for i, r in enumerate(requests):
    groups[r.task_name].append(i)
  return groups
