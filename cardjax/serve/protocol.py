"""The OpenAI wire format: request bodies checked and read, response bodies and errors.

A bad request gets one `APIError` (HTTP 4xx, OpenAI's error shape) naming the field and
the fix. cardjax's own settings come as extra top-level keys (the openai client's
`extra_body`): method, tau, block, verify, rule, ignore_eos; see docs/serving.md.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from cardjax.errors import CardjaxError
from cardjax.serve.scoring import TOP as TOP_LOGPROBS  # OpenAI's limit on logprobs too

EXTENSION = ("method", "tau", "block", "verify", "rule", "ignore_eos")
ROLES = ("system", "user", "assistant")  # the turns a chat template renders
# Accepted and ignored: they change nothing cardjax computes.
IGNORED = ("user", "frequency_penalty", "presence_penalty", "logit_bias", "stream_options",
           "response_format", "metadata", "store", "service_tier", "parallel_tool_calls")


class APIError(Exception):
  def __init__(self, status: int, message: str, param: str | None = None,
               kind: str = "invalid_request_error", code: str | None = None,
               headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.param, self.kind, self.code = (status, message, param,
                                                                   kind, code)
    self.headers = headers  # e.g. Retry-After on a 429

  @property
  def outcome(self) -> str:
    """Its label in the server's request counter (cardjax_requests_total)."""
    return {401: "unauthorized", 429: "rejected"}.get(self.status, "bad_request")

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


@dataclasses.dataclass
class Parsed:
  """A checked request: one token-id prompt per choice and what to do with them."""
  prompts: list[list[int]]
  settings: object  # engine.Settings
  max_tokens: int
  stop: list[str]
  stream: bool
  include_usage: bool
  chat: bool
  # /v1/completions' legacy `logprobs` (top alternatives per token, 0..5; None: no
  # logprobs) and `echo`; `sources`: each prompt as sent (text or ids), echoed back.
  logprobs: int | None = None
  echo: bool = False
  sources: list = dataclasses.field(default_factory=list)


def reject_constant(name: str):
  """json.loads' hook for NaN, Infinity and -Infinity (Python's json reads them; JSON
  has no such numbers, and a NaN would pass every range check)."""
  raise APIError(400, f"the request body holds {name}: every number must be finite")


def _number(body: dict, key: str, default, kind=float, low=None, high=None, low_open=False):
  value = body.get(key, default)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
    raise APIError(400, f"{key}={value!r} must be {'a number' if kind is float else 'an integer'}",
                   key)
  if (low is not None and (value <= low if low_open else value < low)) or \
     (high is not None and value > high):
    bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
    raise APIError(400, f"{key}={value} must lie in {bounds}", key)
  return kind(value)


def parse(body, engine, chat: bool) -> Parsed:
  """Check a /v1/completions (chat False) or /v1/chat/completions body against `engine`."""
  if not isinstance(body, dict):
    raise APIError(400, "the request body must be a JSON object")
  model = body.get("model")
  if model != engine.name:
    raise APIError(404, f"model {model!r} does not exist: this server serves "
                        f"{engine.name!r} (GET /v1/models)", "model", code="model_not_found")
  if body.get("n", 1) != 1:
    raise APIError(400, f"n={body['n']!r}: cardjax serves one choice per prompt (n=1)", "n")
  for key in ("tools", "functions", "suffix"):
    if body.get(key) not in (None, False, 0):
      raise APIError(400, f"{key} is not supported by cardjax serve; drop it", key)
  logprobs, echo = _logprobs_echo(body, chat)
  if body.get("best_of", 1) not in (1, None):
    raise APIError(400, "best_of is not supported by cardjax serve; drop it", "best_of")
  temperature = _number(body, "temperature", 0.0, low=0.0, high=2.0)
  top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True)
  seed = _number(body, "seed", None, kind=int)
  max_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
  max_tokens = _number(body, max_key, engine.max_tokens, kind=int)
  if max_tokens < 0 or (max_tokens == 0 and not echo):  # 0 with echo: score the prompt
    raise APIError(400, f"{max_key}={max_tokens} must be >= 1" +
                   ("" if chat else " (or 0 with echo: true, to score the prompt alone)"),
                   max_key)
  stop = body.get("stop") or []
  stop = [stop] if isinstance(stop, str) else stop
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
    raise APIError(400, "stop must be a string or a list of at most 4 strings", "stop")
  ext = {}
  for key, kind in (("method", str), ("tau", float), ("block", int), ("verify", bool),
                    ("rule", str), ("ignore_eos", bool)):
    if body.get(key) is None:
      continue
    value = body[key]
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
          else isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
    if not ok:
      raise APIError(400, f"{key}={value!r} must be of type {kind.__name__}", key)
    ext[key] = value
  if "tau" in ext and not 0.0 <= ext["tau"] <= 1.0 and ext.get("rule") != "entropy_nats":
    raise APIError(400, f"tau={ext['tau']} must lie in [0, 1] (1 = plain greedy AR)", "tau")
  try:
    settings = engine.settings(ext, temperature=temperature, top_p=top_p, seed=seed)
  except CardjaxError as e:
    raise APIError(400, str(e)) from None
  texts = _chat_prompt(body, engine) if chat else _completion_prompts(body, engine)
  prompts = [t if isinstance(t, list) else engine.tokenizer.encode(t) for t in texts]
  limit = engine.prompt_limit(settings)
  for p in prompts:
    if not p:
      raise APIError(400, "the prompt is empty: give at least one token of text", "prompt")
    if len(p) > limit:
      raise APIError(400, f"the prompt has {len(p)} tokens, more than the {limit} this "
                          f"model's context ({engine.context(settings)} positions, "
                          f"less {engine.room(settings)} for the decoder's window) allows: "
                          "shorten it", "messages" if chat else "prompt",
                     code="context_length_exceeded")
  # prompt + max_tokens must fit the context, as OpenAI's API and vLLM require, rather than
  # a completion silently cut short; a request that names no max_tokens gets the default
  # or what the context leaves, whichever is less.
  longest = max(len(p) for p in prompts)
  fits = limit + 1 - longest  # the tokens every prompt has room for
  if max_key not in body:
    max_tokens = min(max_tokens, fits)
  elif max_tokens > fits:
    raise APIError(400, f"the prompt has {longest} tokens and {max_key} is {max_tokens}: "
                        f"together {longest + max_tokens}, more than the {limit + 1} this "
                        f"model's context ({engine.context(settings)} positions, less "
                        f"{engine.room(settings) - 1} for the decoder's window) holds: set "
                        f"{max_key} to at most {fits} or shorten the prompt", max_key,
                   code="context_length_exceeded")
  options = body.get("stream_options") or {}
  return Parsed(prompts, settings, max_tokens, stop, bool(body.get("stream", False)),
                bool(isinstance(options, dict) and options.get("include_usage")), chat,
                logprobs=logprobs, echo=echo, sources=list(texts))


def _logprobs_echo(body: dict, chat: bool) -> tuple[int | None, bool]:
  """(logprobs, echo): /v1/completions' legacy fields, checked. They are scored after the
  completion ends (scoring.py), so they are not streamed."""
  if chat:
    for key in ("logprobs", "top_logprobs", "echo"):
      if body.get(key) not in (None, False, 0):
        raise APIError(400, f"{key} is not supported on /v1/chat/completions; use "
                            "/v1/completions with logprobs=N (0..5) and echo", key)
    return None, False
  if body.get("top_logprobs") is not None:
    raise APIError(400, "top_logprobs is a chat field; /v1/completions takes logprobs=N, "
                        "the number of top alternatives per token (0..5)", "top_logprobs")
  logprobs, echo = body.get("logprobs"), body.get("echo")
  if logprobs is False:  # some clients send false for "none"
    logprobs = None
  if logprobs is not None:
    if isinstance(logprobs, bool) or not isinstance(logprobs, int):
      raise APIError(400, f"logprobs={logprobs!r} must be an integer: the number of top "
                          "alternatives per token, 0..5", "logprobs")
    if not 0 <= logprobs <= TOP_LOGPROBS:
      raise APIError(400, f"logprobs={logprobs}: at most {TOP_LOGPROBS} top alternatives per "
                          f"token (OpenAI's limit); ask for 0..{TOP_LOGPROBS}", "logprobs")
  if echo is not None and not isinstance(echo, bool):
    raise APIError(400, f"echo={echo!r} must be true or false", "echo")
  if (logprobs is not None or echo) and body.get("stream"):
    raise APIError(400, "logprobs and echo are not streamed (the tokens are scored once the "
                        "completion ends): set stream false", "stream")
  return logprobs, bool(echo)


def _completion_prompts(body: dict, engine) -> list:
  prompt = body.get("prompt")
  vocab = engine.cfg.vocab_size

  def ids(p):
    return isinstance(p, list) and all(isinstance(i, int) and 0 <= i < vocab for i in p)
  if isinstance(prompt, str) or ids(prompt):
    return [prompt]
  if isinstance(prompt, list) and prompt and all(isinstance(p, str) or ids(p) for p in prompt):
    return prompt
  raise APIError(400, "prompt must be a string, a list of strings, or token ids in "
                      f"[0, {vocab})", "prompt")


def _chat_prompt(body: dict, engine) -> list[str]:
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise APIError(400, "messages must be a non-empty list of {role, content}", "messages")
  clean = []
  for m in messages:
    content = m.get("content") if isinstance(m, dict) else None
    if isinstance(content, list):  # content parts: text only
      if not all(isinstance(c, dict) and c.get("type") == "text" for c in content):
        raise APIError(400, "message content parts must all be {type: text}", "messages")
      content = "".join(c.get("text", "") for c in content)
    if not isinstance(content, str) or not isinstance(m.get("role"), str):
      raise APIError(400, "each message needs a string role and string content", "messages")
    if m["role"] not in ROLES:
      raise APIError(400, f"message role {m['role']!r} is not one of {', '.join(ROLES)}: "
                          "fold other turns (tool, function) into a user message", "messages")
    clean.append({"role": m["role"], "content": content})
  try:
    return [engine.tokenizer.render_chat(clean, add_generation_prompt=True)]
  except CardjaxError as e:
    raise APIError(400, str(e), "messages") from None


def new_id(chat: bool) -> str:
  return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(dones: list[dict]) -> dict:
  """OpenAI's usage plus cardjax's forwards and tokens per forward (all choices)."""
  prompt = sum(d["prompt_tokens"] for d in dones)
  completion = sum(d["completion_tokens"] for d in dones)
  forwards = sum(d["cardjax"]["forwards"] for d in dones)
  return {"prompt_tokens": prompt, "completion_tokens": completion,
          "total_tokens": prompt + completion, "forwards": forwards,
          "tokens_per_forward": round(completion / max(forwards, 1), 4)}


def response(rid: str, model: str, chat: bool, dones: list[dict]) -> dict:
  """The whole (non-streamed) response for the done events of each choice, in order."""
  if chat:
    choices = [{"index": i, "message": {"role": "assistant", "content": d["text"]},
                "finish_reason": d["finish_reason"], "logprobs": None}
               for i, d in enumerate(dones)]
  else:
    choices = [{"index": i, "text": d["text"], "finish_reason": d["finish_reason"],
                "logprobs": d.get("logprobs")} for i, d in enumerate(dones)]
  return {"id": rid, "object": "chat.completion" if chat else "text_completion",
          "created": int(time.time()), "model": model, "choices": choices,
          "usage": usage(dones), "cardjax": [d["cardjax"] for d in dones]}


def chunk(rid: str, model: str, chat: bool, index: int, text: str | None = None,
          finish: str | None = None, role: bool = False, done: dict | None = None) -> dict:
  """One streamed event: a text delta of choice `index`, or its end."""
  if chat:
    delta = {"role": "assistant", "content": ""} if role else (
        {"content": text} if text is not None else {})
    choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
  else:
    choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
  body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
          "created": int(time.time()), "model": model, "choices": [choice]}
  if done is not None:
    body["usage"] = usage([done])
    body["cardjax"] = done["cardjax"]
  return body


def usage_chunk(rid: str, model: str, chat: bool, dones: list[dict]) -> dict:
  """stream_options.include_usage: the last event, no choices, the request's usage."""
  return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
          "created": int(time.time()), "model": model, "choices": [], "usage": usage(dones)}
