"""Assemble the server and run it under uvicorn, with a graceful drain on SIGTERM/SIGINT.

On the first signal the server keeps accepting connections but answers new completions
with 503, lets in-flight requests finish for up to drain_timeout_s, aborts the rest, then
lets uvicorn close. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

import uvicorn

from servelab.serve.api import build_app
from servelab.serve.engine_thread import EngineThread, EngineThreadConfig
from servelab.serve.handoff import Clock
from servelab.serve.metrics import ServerMetrics
from servelab.serve.request_log import RequestLog
from servelab.serve.state import ApiConfig, ServeState
from servelab.serve.tokenize_api import add_tokenize_routes
from servelab.serve.tokenizer import Tokenizer
from sim.engine.core import Backend, row_knots
from sim.engine.scheduler import Scheduler

BACKLOG = 2048  # uvicorn's default
T = TypeVar("T")


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and how to shut down."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port
    drain_timeout_s: float = 30.0  # in-flight requests get this long after SIGTERM
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")


def assemble(scheduler: Scheduler, backend: Backend, tokenizer: Tokenizer, vocab_size: int,
             api: ApiConfig, engine: EngineThreadConfig | None = None,
             request_log: str | Path | None = None) -> ServeState:
    """The server's parts around a scheduler and its backend (the engine thread not started)."""
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} ids, the "
                         f"model's vocab only {vocab_size}")
    clock = Clock()
    metrics = ServerMetrics(api.model_name)
    metrics.describe_cache(scheduler.config)
    metrics.describe_kernels(row_knots(backend))
    if scheduler.config.speculative is not None:
        metrics.describe_speculation(scheduler.config.speculative.num_speculative_tokens)
    log = RequestLog(request_log) if request_log is not None else None
    thread = EngineThread(scheduler, backend, clock, engine, metrics, log)
    return ServeState(api, thread, tokenizer, metrics, vocab_size, log)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one); clients queue in its backlog until uvicorn runs."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # The protocol named, not 0: asyncio sets TCP_NODELAY on accepted connections only when
    # the listening socket says it is TCP; without it a keep-alive client's next request
    # within ~20 ms of a response stalls ~40 ms (Nagle against delayed ACKs).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _uvicorn_config(state: ServeState, log_level: str) -> uvicorn.Config:
    app = add_tokenize_routes(build_app(state), state)  # vLLM's /tokenize and /detokenize
    return uvicorn.Config(app, lifespan="off", access_log=False, http="h11",
                          ws="none", loop="asyncio", log_level=log_level,
                          timeout_graceful_shutdown=5)


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains the engine before the server closes."""

    def __init__(self, config: uvicorn.Config, state: ServeState, drain_timeout_s: float):
        super().__init__(config)
        self._state = state
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled or self._loop is None:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        """Refuse new requests, wait for the in-flight ones (bounded), then exit."""
        engine = self._state.engine
        engine.begin_drain()
        if not await asyncio.to_thread(engine.wait_drained, self._drain_timeout_s):
            engine.abort_all(f"server shutting down (drain timeout {self._drain_timeout_s} s)")
            await asyncio.to_thread(engine.wait_drained, 5.0)
        self.should_exit = True


def call_on_thread(fn: Callable[[], T]) -> T:
    """Run fn on a short-lived thread; return its result or raise its exception.

    Build the model and its backend this way. OpenMP gives each thread that runs a parallel
    torch op its own pool of workers, alive as long as that thread. Built on the main thread
    (which then runs the event loop forever), the build's pool would outlive it next to the
    engine thread's: more OpenMP threads than cores make libgomp throttle its spin-wait, so
    workers sleep between parallel regions and a 2-core step ran at half speed. The pool of
    a thread that has exited is gone.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="build")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def serve_forever(state: ServeState, config: ServerConfig,
                  on_listening: Callable[[str], None] | None = None,
                  http_cpus: set[int] | None = None) -> None:
    """Run until SIGTERM/SIGINT (main thread); stops the engine and flushes the log after.

    Pinned torch threads (executor/loading.py) bind this thread to one core when torch
    loads; the engine thread inherits that binding as the OpenMP master. `http_cpus` (the
    process's cores before torch loaded) then frees the event loop to run on any core, so
    it does not queue behind the master on its core.
    """
    sock = bind(config.host, config.port)
    server = DrainingServer(_uvicorn_config(state, config.log_level), state,
                            config.drain_timeout_s)
    state.engine.start()
    if http_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, http_cpus)  # 0: this thread only
    try:
        if on_listening is not None:
            host, port = sock.getsockname()[:2]
            on_listening(f"http://{host}:{port}")
        server.run(sockets=[sock])
    finally:
        state.engine.stop()
        if state.request_log is not None:
            state.request_log.close()


class ServerThread:
    """A server on a background thread (tests, benchmarks); use as a context manager."""

    def __init__(self, state: ServeState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        self._sock = bind(host, port)
        host, port = self._sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(_uvicorn_config(state, "warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="uvicorn", daemon=True)

    def __enter__(self) -> ServerThread:
        self.state.engine.start()
        self._thread.start()
        deadline = time.monotonic() + 30.0
        while not self._server.started:  # startup takes milliseconds; a bounded wait
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(15.0)
        self.state.engine.stop()
        if self.state.request_log is not None:
            self.state.request_log.close()
