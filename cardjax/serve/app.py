"""The HTTP app: OpenAI's /v1/models, /v1/completions, /v1/chat/completions, plus /metrics
(Prometheus) and /health.

Handlers run on the event loop; decoding runs on the scheduler's thread, which hands each
job's events back through the loop (serve/handoff.py: once a round) into a queue per request.
The two completion endpoints are a plain ASGI app in front of FastAPI (serve/completions.py);
FastAPI serves the rest and runs the lifespan that starts and drains the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cardjax.serve.completions import CompletionsApp
from cardjax.serve.engine import COMPILE_THREAD, Engine
from cardjax.serve.limits import Limits
from cardjax.serve.metrics import Metrics
from cardjax.serve.protocol import APIError
from cardjax.serve.scheduler import ADMIT_WAIT, Scheduler
from cardjax.serve.tau import TauControl
from cardjax.serve.handoff import Handoff


def create_app(engine: Engine, tau: TauControl | None = None,
               admit_wait: float = ADMIT_WAIT, limits: Limits | None = None,
               overlap: bool = True, refill_step: int = 0) -> CompletionsApp:
  limits = limits or Limits()
  metrics = Metrics()
  metrics.watch_compilations(COMPILE_THREAD)
  scheduler = Scheduler(engine, metrics, tau or TauControl(engine.tau), admit_wait, overlap,
                        refill_step)
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
    metrics.requests.labels(e.outcome).inc()
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

  app.state.started = time.time()
  # The two completion paths skip FastAPI's stack (serve/completions.py says why).
  return CompletionsApp(app, engine, scheduler, handoff, limits, metrics)
