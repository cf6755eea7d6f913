"""`servelab route`: an HTTP router in front of OpenAI-compatible servers, choosing with the
simulator's sim.cluster.router. The request path is servelab/route/proxy.py (each try
servelab/route/attempt.py, retries servelab/route/retry.py) and servelab/route/relay.py,
the upstreams' loads servelab/route/upstreams.py, their health servelab/route/health.py, the
router's metrics servelab/route/metrics.py, the prefix index servelab/route/prefix.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from servelab.route.proxy import fetch_models, forward
from servelab.route.state import RouteConfig, RouteState
from servelab.route.upstreams import Upstream, check_forever, poll, poll_forever
from servelab.serve.api import add_error_handlers
from servelab.serve.metrics import CONTENT_TYPE
from servelab.serve.server import ServerConfig, bind


def build_route_app(state: RouteState) -> FastAPI:
    """The router's app; its lifespan opens the upstream session and runs the poller."""
    app = FastAPI(title="servelab route", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lambda _: _lifespan(state))
    app.state.route = state

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(state, request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await forward(state, request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await fetch_models(state, request)

    @app.get("/health")
    async def health() -> JSONResponse:
        now = state.clock()
        upstreams = [_upstream_health(u, now) for u in state.upstreams]
        ok = any(u.routable(now) for u in state.upstreams)
        return JSONResponse({"status": "ok" if ok else "no_upstream", "upstreams": upstreams},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = state.metrics.render(state.upstreams, len(state.index), state.clock())
        return Response(text, media_type=CONTENT_TYPE)

    add_error_handlers(app)
    return app


def _upstream_health(u: Upstream, now: float) -> dict[str, object]:
    """One upstream in the router's /health; `ejected_until` is Unix time, null in rotation."""
    h = u.health
    until = None if h.ejected_until is None else time.time() + (h.ejected_until - now)
    return {"url": u.url, "reachable": u.reachable, "in_flight": u.in_flight,
            "metrics_error": u.metrics_error, "state": h.state(now), "ejected_until": until,
            "consecutive_failures": h.request_failures,
            "consecutive_check_failures": h.check_failures, "ejections": h.ejections,
            "last_failure": h.last_failure, "tpot_s": u.tpot_s}


@contextlib.asynccontextmanager
async def _lifespan(state: RouteState) -> AsyncIterator[None]:
    cfg = state.config
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s,
                                    sock_read=cfg.read_timeout_s)
    # No cap on connections: the router must not queue requests the upstreams would take.
    state.session = aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                          connector=aiohttp.TCPConnector(limit=0))
    first_s = max(cfg.metrics_interval_s, 1.0)
    await asyncio.gather(*(poll(state.session, u, first_s) for u in state.upstreams))
    tasks = [asyncio.create_task(poll_forever(state.session, state.upstreams,
                                              cfg.metrics_interval_s))]
    if cfg.health.checks_on:
        tasks += [asyncio.create_task(check_forever(state.session, u, state.metrics, state.clock))
                  for u in state.upstreams]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await state.session.close()


def _uvicorn_config(state: RouteState, server: ServerConfig) -> uvicorn.Config:
    # drain_timeout_s bounds how long open responses may run on after SIGTERM.
    return uvicorn.Config(build_route_app(state), lifespan="on", access_log=False, http="h11",
                          ws="none", loop="asyncio", log_level=server.log_level,
                          timeout_graceful_shutdown=max(int(server.drain_timeout_s), 1))


def serve_routes(config: RouteConfig, server: ServerConfig,
                 on_listening: Callable[[str], None] | None = None) -> None:
    """Route until SIGTERM/SIGINT (main thread)."""
    sock = bind(server.host, server.port)
    uv = uvicorn.Server(_uvicorn_config(RouteState.create(config), server))
    if on_listening is not None:
        host, port = sock.getsockname()[:2]
        on_listening(f"http://{host}:{port}")
    uv.run(sockets=[sock])


class RouterThread:
    """A router on a background thread (tests, benchmarks); use as a context manager."""

    def __init__(self, config: RouteConfig, host: str = "127.0.0.1", port: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 clock_step_s: float = math.inf) -> None:
        self.state = RouteState.create(config, clock, clock_step_s)
        self._sock = bind(host, port)
        host, port = self._sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        server = ServerConfig(host, port, drain_timeout_s=5.0)
        self._server = uvicorn.Server(_uvicorn_config(self.state, server))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="router", daemon=True)

    def __enter__(self) -> RouterThread:
        self._thread.start()
        deadline = time.monotonic() + 30.0
        while not self._server.started:  # the first poll of every upstream, then serving
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"router at {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(15.0)
