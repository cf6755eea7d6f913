"""Fake upstreams for the router tests: an OpenAI-style server that streams a few chunks and
serves /metrics with whatever load a test sets (and, until it is started, hangs as a stopped
process does), and one that dies mid-stream when the test says so."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from servelab.serve.server import bind


class FakeUpstream:
    """An OpenAI-style server on a thread: answers with its name, streams max_tokens chunks
    (the last one only once `gate` is set), and reports the loads set on it in /metrics.

    Its socket listens from construction on, but nothing answers until it is started: like
    a process under SIGSTOP, connections are made and requests sent, and no byte comes back
    until `start()` (SIGCONT), when the queued connections are served."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = threading.Event()
        self.reset()
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self._app(), lifespan="off", log_level="warning", http="h11")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)

    def reset(self) -> None:
        """Idle, healthy, with metrics, nothing received, the gate open."""
        self.running, self.kv_usage, self.metrics = 0, 0.1, True
        self.healthy = True  # False: /health answers 503
        self.status = 200  # another: completions answer it (with an error object)
        self.garbage = False  # True: non-streamed completions answer 200 with a non-JSON body
        self.itl: tuple[float, int] | None = None  # (sum_s, count) of an ITL histogram
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        self.raw_headers: list[list[tuple[bytes, bytes]]] = []  # as received, per request
        self.aborted = 0  # requests whose reader left before the end
        self.gate.set()

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            self.auth.append(request.headers.get("authorization"))
            self.raw_headers.append(list(request.scope["headers"]))
            if "prompt" not in body:
                return JSONResponse({"error": {"message": "prompt missing"}}, status_code=400)
            if self.status != 200:
                return JSONResponse({"error": {"message": f"{self.name} is sick"}},
                                    status_code=self.status)
            if body.get("stream"):
                return StreamingResponse(self._chunks(body.get("max_tokens", 3)),
                                         media_type="text/event-stream")
            while not self.gate.is_set():
                if await request.is_disconnected():
                    self.aborted += 1
                    return JSONResponse({}, status_code=499)
                await asyncio.sleep(0.005)
            if self.garbage:
                return PlainTextResponse("<html>oops", media_type="application/json")
            answer = JSONResponse({"model": self.name,
                                   "choices": [{"text": "x", "finish_reason": "length"}]})
            # The client's X-Tenant bytes come back as X-Echo-Tenant, unchanged.
            answer.raw_headers += [(b"x-echo-tenant", v) for k, v in request.scope["headers"]
                                   if k == b"x-tenant"]
            return answer

        @app.get("/health")
        async def health():
            return JSONResponse({"status": "ok" if self.healthy else "sick"},
                                status_code=200 if self.healthy else 503)

        @app.get("/metrics")
        async def metrics():
            if not self.metrics:
                return PlainTextResponse("no metrics here", status_code=404)
            itl = "" if self.itl is None else (
                f"vllm:inter_token_latency_seconds_sum {self.itl[0]}\n"
                f"vllm:inter_token_latency_seconds_count {self.itl[1]}\n")
            return PlainTextResponse(
                f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 0\n"
                f"vllm:kv_cache_usage_perc {self.kv_usage}\n"  # a pool of 1000 tokens:
                'vllm:cache_config_info{block_size="10",num_gpu_blocks="100"} 1\n' + itl)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.name}]}

        return app

    async def _wait_gate(self) -> None:
        while not self.gate.is_set():
            await asyncio.sleep(0.005)

    async def _chunks(self, count: int):
        done = False
        try:
            for i in range(count):
                if i == count - 1:
                    await self._wait_gate()
                yield f'data: {{"model": "{self.name}", "chunk": {i}}}\n\n'
            yield "data: [DONE]\n\n"
            done = True
        finally:
            self.aborted += not done

    def start(self) -> None:
        """Serve (the connections queued meanwhile first)."""
        self._thread.start()
        while not self._server.started:
            time.sleep(0.005)

    def __enter__(self) -> FakeUpstream:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)


class DyingUpstream:
    """A server that answers every completion with a stream: one event, then half of a
    second, and then nothing until `kill()`, which resets every connection and closes the
    port (new connections are refused), as a killed process does. GET answers {} (so
    /health passes and /metrics has no readings)."""

    def __init__(self) -> None:
        self._sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.streams = 0  # streams that got their first event
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._died = asyncio.Event()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, sock=self._sock))
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):
            return await self._handle_get(writer)
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n"
                     + _chunk(b'data: {"chunk": 0}\n\n') + _chunk(b'data: {"chu'))
        await writer.drain()
        self.streams += 1
        await self._died.wait()
        writer.transport.abort()  # a reset, no end of the chunked body

    async def _handle_get(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        writer.close()

    def kill(self) -> None:
        """Stop listening and reset every open connection."""
        def die() -> None:
            self._server.close()
            self._died.set()
        self._loop.call_soon_threadsafe(die)

    def __enter__(self) -> DyingUpstream:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class ResettingUpstream(DyingUpstream):
    """A server that resets every completion's connection once the request is in, before
    any byte of an answer (GETs are answered {}, so /health passes)."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):
            return await super()._handle_get(writer)
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)
        self.streams += 1
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # an RST: the connection reset by peer


def _chunk(data: bytes) -> bytes:
    """One chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class FakeClock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def dead_url() -> str:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
