"""A fake OpenAI-compatible upstream for the router tests: streams a few chunks and serves
/metrics with whatever load a test sets."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from serve.server import bind


class FakeUpstream:
    """An OpenAI-style server on a thread: answers with its name, streams max_tokens chunks
    (the last one only once `gate` is set), and reports the loads set on it in /metrics."""

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
        """Idle, with metrics, nothing received, the gate open."""
        self.running, self.kv_usage, self.metrics = 0, 0.1, True
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        self.aborted = 0  # requests whose reader left before the end
        self.gate.set()

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            self.auth.append(request.headers.get("authorization"))
            if "prompt" not in body:
                return JSONResponse({"error": {"message": "prompt missing"}}, status_code=400)
            if body.get("stream"):
                return StreamingResponse(self._chunks(body.get("max_tokens", 3)),
                                         media_type="text/event-stream")
            while not self.gate.is_set():
                if await request.is_disconnected():
                    self.aborted += 1
                    return JSONResponse({}, status_code=499)
                await asyncio.sleep(0.005)
            return {"model": self.name, "choices": [{"text": "x", "finish_reason": "length"}]}

        @app.get("/metrics")
        async def metrics():
            if not self.metrics:
                return PlainTextResponse("no metrics here", status_code=404)
            return PlainTextResponse(
                f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 0\n"
                f"vllm:kv_cache_usage_perc {self.kv_usage}\n"  # a pool of 1000 tokens:
                'vllm:cache_config_info{block_size="10",num_gpu_blocks="100"} 1\n')

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

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        while not self._server.started:
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self._server.should_exit = True
        self._thread.join(10)


def dead_url() -> str:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
