"""The HTTP routes: OpenAI's /v1/models, /v1/completions, /v1/chat/completions, plus
/metrics (Prometheus) and /health.

Handlers run on the event loop; decoding runs on the scheduler's thread, which hands each
job's events back through the loop (serve/handoff.py: once a round) into a queue per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import traceback

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cardjax.serve import protocol, scoring
from cardjax.serve.engine import COMPILE_THREAD, Engine
from cardjax.serve.limits import Limits
from cardjax.serve.metrics import Metrics
from cardjax.serve.protocol import APIError
from cardjax.serve.scheduler import ADMIT_WAIT, Job, Scheduler
from cardjax.serve.tau import TauControl
from cardjax.serve.handoff import Handoff
from cardjax.serve.text import TextStream

# A non-streamed request checks this often whether its client is still there.
DISCONNECT_POLL_S = 0.5


def create_app(engine: Engine, tau: TauControl | None = None,
               admit_wait: float = ADMIT_WAIT, limits: Limits | None = None,
               overlap: bool = True) -> FastAPI:
  limits = limits or Limits()
  metrics = Metrics()
  metrics.watch_compilations(COMPILE_THREAD)
  scheduler = Scheduler(engine, metrics, tau or TauControl(engine.tau), admit_wait, overlap)
  handoff = Handoff()
  scheduler.handoffs.append(handoff.flush)

  @contextlib.asynccontextmanager
  async def lifespan(app):
    scheduler.start()
    yield
    # uvicorn has stopped accepting and waited for in-flight responses; whatever is left
    # in the pool (none, normally) is finished before the process exits.
    await asyncio.to_thread(scheduler.stop)
    metrics.unwatch_compilations()

  app = FastAPI(title="cardjax serve", lifespan=lifespan)
  app.state.engine, app.state.scheduler, app.state.metrics = engine, scheduler, metrics

  @app.exception_handler(APIError)
  async def api_error(request, e: APIError):
    status = {401: "unauthorized", 429: "rejected"}.get(e.status, "bad_request")
    metrics.requests.labels(status).inc()
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

  @app.get("/health")
  async def health():
    return {"status": "ok"}

  @app.get("/metrics")
  async def prometheus():
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

  @app.get("/v1/models")
  async def models(request: Request):
    limits.check_key(request.headers.get("authorization"))
    return {"object": "list", "data": [{"id": engine.name, "object": "model", "created": 0,
                                        "owned_by": "cardjax"}]}

  @app.post("/v1/completions")
  async def completions(request: Request):
    return await _serve(request, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(request: Request):
    return await _serve(request, chat=True)

  async def _serve(request: Request, chat: bool):
    limits.check_key(request.headers.get("authorization"))
    raw = await limits.read_body(request)
    try:
      body = json.loads(raw, parse_constant=protocol.reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise APIError(400, f"the request body is not valid JSON ({e}); send a JSON object")
    parsed = protocol.parse(body, engine, chat)
    if parsed.max_tokens == 0:  # echo alone (parse allows 0 only then): nothing to decode
      return await _scored(protocol.new_id(chat), parsed, [[] for _ in parsed.prompts],
                           [scoring.echo_done(p, parsed.settings) for p in parsed.prompts])
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    jobs = []
    stream = parsed.stream
    for i, prompt in enumerate(parsed.prompts):
      def sink(event, i=i):  # on the decode thread: handed over with its round's events
        # A whole response is built from its "done" event alone (its text is the job's
        # whole text): a text delta per step would only cost the event loop a queue item
        # and a pass of _events each.
        if stream or event["type"] != "delta":
          handoff.put(loop, events, (i, event))
      jobs.append(Job(prompt, parsed.settings, parsed.max_tokens,
                      TextStream(engine.tokenizer, parsed.stop), sink))
    limits.check_queue(scheduler.waiting(), len(jobs))  # no await since: nothing slips in
    for job in jobs:
      scheduler.submit(job)
    rid = protocol.new_id(chat)
    if parsed.stream:
      return StreamingResponse(_stream(request, rid, parsed, jobs, events),
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
    dones: dict[int, dict] = {}
    try:
      async with contextlib.aclosing(_events(request, events)) as stream:
        async for i, event in stream:
          if event["type"] == "error":
            return JSONResponse(APIError(500, event["message"], kind="server_error").body(),
                                status_code=500)
          if event["type"] == "done":
            dones[i] = event
          if len(dones) == len(jobs):
            break
        else:
          return Response(status_code=499)  # the client left: nobody reads this
    finally:  # the client left or a choice failed: free the other rows
      for i, job in enumerate(jobs):
        if i not in dones:
          scheduler.cancel(job)
    done = [dones[i] for i in range(len(jobs))]
    if parsed.logprobs is not None or parsed.echo:  # the decode thread is done with jobs
      return await _scored(rid, parsed, [job.tokens for job in jobs], done)
    return protocol.response(rid, engine.name, chat, done)

  async def _scored(rid: str, parsed, completions: list, dones: list[dict]):
    """The response with logprobs and echo (scoring.py): the scoring forward runs on a
    worker thread, so the loop serves other requests meanwhile."""
    try:
      dones = await asyncio.to_thread(scoring.annotate, engine, parsed, completions, dones)
    except Exception as e:  # a device failure: this request fails, the server serves on
      traceback.print_exc()
      return JSONResponse(APIError(500, f"scoring failed: {e}", kind="server_error").body(),
                          status_code=500)
    return protocol.response(rid, engine.name, parsed.chat, dones)

  async def _events(request: Request, events: asyncio.Queue):
    """The jobs' events as they come, ending early when the client has gone: checked
    every DISCONNECT_POLL_S and before each event is handed on, so an abandoned request
    is cancelled within a poll, not when the next write to its socket fails."""
    getter = asyncio.ensure_future(events.get())
    try:
      while True:
        await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
        if await request.is_disconnected():
          return
        if getter.done():
          yield getter.result()
          getter = asyncio.ensure_future(events.get())
    finally:
      getter.cancel()

  async def _stream(request: Request, rid: str, parsed, jobs: list, events: asyncio.Queue):
    """Server-sent events: a delta per chunk of new text, each choice's end with its
    usage, optionally a usage-only event, then [DONE]. A client that leaves (seen by
    _events) has its unfinished rows freed."""
    chat, dones = parsed.chat, {}

    def sse(body: dict) -> str:
      return f"data: {json.dumps(body)}\n\n"
    try:
      if chat:
        for i in range(len(jobs)):
          yield sse(protocol.chunk(rid, engine.name, chat, i, role=True))
      async with contextlib.aclosing(_events(request, events)) as stream:
        async for i, event in stream:
          if event["type"] == "delta":
            yield sse(protocol.chunk(rid, engine.name, chat, i, text=event["text"]))
          elif event["type"] == "done":
            dones[i] = event
            yield sse(protocol.chunk(rid, engine.name, chat, i,
                                     finish=event["finish_reason"], done=event))
          else:
            dones[i] = event
            yield sse(APIError(500, event["message"], kind="server_error").body())
          if len(dones) == len(jobs):
            break
        else:
          return  # the client left
      if parsed.include_usage:
        yield sse(protocol.usage_chunk(rid, engine.name, chat,
                                       [d for d in dones.values() if d["type"] == "done"]))
      yield "data: [DONE]\n\n"
    finally:
      for i, job in enumerate(jobs):
        if i not in dones:
          scheduler.cancel(job)

  app.state.started = time.time()
  return app
