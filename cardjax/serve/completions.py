"""/v1/completions and /v1/chat/completions as a plain ASGI app in front of the FastAPI one.

Every request of a closed-loop client passes through the one event loop between its
answer and its next request, and under load the answers of a whole step go out together:
the event loop's time per request, times the clients answered in the same step, is how
long their rows stand empty. Routed through FastAPI a request cost the loop about 1.5 ms
on a 2-core EPYC: its middleware stack (an error wrapper, a telemetry check that reads the
environment, a body-size guard, an exit stack), routing and dependency solving, and a
disconnect check (`Request.is_disconnected`, an anyio cancel scope) before every event.
Here the two endpoints take the ASGI messages themselves: one task per request waits for
the client's disconnect message (no polling), and a response is two `send`s of bytes.
Everything else (/health, /metrics, /v1/models, the lifespan) stays with FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import traceback

from cardjax.serve import protocol, scoring
from cardjax.serve.protocol import APIError
from cardjax.serve.scheduler import Job
from cardjax.serve.text import TextStream

PATHS = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat


async def send_json(send, status: int, body, headers: dict | None = None) -> None:
  """A whole JSON response, rendered as Starlette's JSONResponse renders it (the bytes the
  FastAPI routes sent)."""
  data = json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None,
                    separators=(",", ":")).encode("utf-8")
  fields = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
  fields += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
  await send({"type": "http.response.start", "status": status, "headers": fields})
  await send({"type": "http.response.body", "body": data})


async def _wait_disconnect(receive) -> None:
  """Returns when the client has gone (the server's http.disconnect message)."""
  while (await receive())["type"] != "http.disconnect":
    pass


class CompletionsApp:
  """The ASGI app: the two completion paths served here, every other scope by `app`."""

  def __init__(self, app, engine, scheduler, handoff, limits, metrics):
    self.app, self.engine, self.scheduler = app, engine, scheduler
    self.handoff, self.limits, self.metrics = handoff, limits, metrics

  async def __call__(self, scope, receive, send):
    chat = PATHS.get(scope.get("path")) if scope["type"] == "http" else None
    if chat is None:
      return await self.app(scope, receive, send)
    try:
      if scope["method"] != "POST":
        raise APIError(405, f"{scope['path']} takes POST, not {scope['method']}")
      await self._serve(scope, receive, send, chat)
    except APIError as e:
      self.metrics.requests.labels(e.outcome).inc()
      await send_json(send, e.status, e.body(), e.headers)

  async def _serve(self, scope, receive, send, chat: bool) -> None:
    engine, scheduler, handoff = self.engine, self.scheduler, self.handoff
    authorization = next((v.decode("latin-1") for k, v in scope["headers"]
                          if k == b"authorization"), None)
    self.limits.check_key(authorization)
    raw = await self.limits.read_body(scope, receive)
    if raw is None:
      return  # the client left before its body was read: nobody to answer
    try:
      body = json.loads(raw, parse_constant=protocol.reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise APIError(400, f"the request body is not valid JSON ({e}); send a JSON object")
    parsed = protocol.parse(body, engine, chat)
    if parsed.max_tokens == 0:  # echo alone (parse allows 0 only then): nothing to decode
      return await self._scored(send, protocol.new_id(chat), parsed,
                                [[] for _ in parsed.prompts],
                                [scoring.echo_done(p, parsed.settings) for p in parsed.prompts])
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    stream = parsed.stream
    jobs = []
    for i, prompt in enumerate(parsed.prompts):
      def sink(event, i=i):  # on the decode thread: handed over with its round's events
        # A whole response is built from its "done" event alone (its text is the job's
        # whole text): a text delta per step would only cost the event loop a queue item
        # and a wake-up each.
        if stream or event["type"] != "delta":
          handoff.put(loop, events, (i, event))
      jobs.append(Job(prompt, parsed.settings, parsed.max_tokens,
                      TextStream(engine.tokenizer, parsed.stop), sink))
    self.limits.check_queue(scheduler.waiting(), len(jobs))  # no await since: nothing slips in
    for job in jobs:
      scheduler.submit(job)
    rid = protocol.new_id(chat)
    gone = asyncio.ensure_future(_wait_disconnect(receive))
    dones: dict[int, dict] = {}  # choice -> its last event ("done" or "error")
    try:
      if stream:
        await self._stream(send, rid, parsed, jobs, events, gone, dones)
      else:
        await self._whole(send, rid, parsed, jobs, events, gone, dones)
    finally:  # the client left or a choice failed: free the rows of the unfinished ones
      gone.cancel()
      for i, job in enumerate(jobs):
        if i not in dones:
          scheduler.cancel(job)

  async def _events(self, events: asyncio.Queue, gone: asyncio.Future):
    """The jobs' events as they come, ending as soon as the client has gone."""
    while True:
      if events.empty():
        getter = asyncio.ensure_future(events.get())
        await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
          getter.cancel()
          return
        event = getter.result()
      elif gone.done():
        return
      else:
        event = events.get_nowait()
      yield event

  async def _whole(self, send, rid: str, parsed, jobs: list, events, gone,
                   dones: dict) -> None:
    async with contextlib.aclosing(self._events(events, gone)) as stream:
      async for i, event in stream:
        if event["type"] == "error":
          return await send_json(send, 500, APIError(500, event["message"],
                                                     kind="server_error").body())
        if event["type"] == "done":
          dones[i] = event
        if len(dones) == len(jobs):
          break
      else:
        return  # the client left: nobody reads an answer
    done = [dones[i] for i in range(len(jobs))]
    if parsed.logprobs is not None or parsed.echo:  # the decode thread is done with jobs
      return await self._scored(send, rid, parsed, [job.tokens for job in jobs], done)
    await send_json(send, 200, protocol.response(rid, self.engine.name, parsed.chat, done))

  async def _scored(self, send, rid: str, parsed, completions: list, dones: list) -> None:
    """The response with logprobs and echo (scoring.py): the scoring forward runs on a
    worker thread, so the loop serves other requests meanwhile."""
    try:
      dones = await asyncio.to_thread(scoring.annotate, self.engine, parsed, completions,
                                      dones)
    except Exception as e:  # a device failure: this request fails, the server serves on
      traceback.print_exc()
      return await send_json(send, 500, APIError(500, f"scoring failed: {e}",
                                                 kind="server_error").body())
    await send_json(send, 200, protocol.response(rid, self.engine.name, parsed.chat, dones))

  async def _stream(self, send, rid: str, parsed, jobs: list, events, gone,
                    dones: dict) -> None:
    """Server-sent events: a delta per chunk of new text, each choice's end with its
    usage, optionally a usage-only event, then [DONE]."""
    chat, name = parsed.chat, self.engine.name
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache")]})

    async def sse(body: dict) -> None:
      await send({"type": "http.response.body", "more_body": True,
                  "body": f"data: {json.dumps(body)}\n\n".encode("utf-8")})
    if chat:
      for i in range(len(jobs)):
        await sse(protocol.chunk(rid, name, chat, i, role=True))
    async with contextlib.aclosing(self._events(events, gone)) as stream:
      async for i, event in stream:
        if event["type"] == "delta":
          await sse(protocol.chunk(rid, name, chat, i, text=event["text"]))
        elif event["type"] == "done":
          dones[i] = event
          await sse(protocol.chunk(rid, name, chat, i, finish=event["finish_reason"],
                                   done=event))
        else:
          dones[i] = event
          await sse(APIError(500, event["message"], kind="server_error").body())
        if len(dones) == len(jobs):
          break
      else:
        return  # the client left
    if parsed.include_usage:
      await sse(protocol.usage_chunk(rid, name, chat,
                                     [d for d in dones.values() if d["type"] == "done"]))
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
