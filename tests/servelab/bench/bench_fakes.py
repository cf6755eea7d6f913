"""A completions server for the closed-loop tests that holds requests in batches: each request
waits until `hold_for` are in flight together (or every expected request has arrived), so a
client that keeps at most N in flight is seen with exactly N, whatever the machine's speed.

It logs when each prompt starts and ends (the end before the last event goes out, so before
the client can know it ended) and answers with tokens that depend on the prompt."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

VOCAB_SIZE = 64


class HoldingServer:
    """Serves /v1/models and streamed /v1/completions on a loopback port, on its own thread."""

    def __init__(self, hold_for: int, expected: int) -> None:
        self.hold_for = hold_for
        self.expected = expected  # once this many have arrived, nobody waits for more
        self.in_flight = 0
        self.max_in_flight = 0
        self.events: list[tuple[str, tuple[int, ...]]] = []  # ("start" | "end", prompt)
        self._arrived = 0
        self._batch: list[asyncio.Event] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def __enter__(self) -> HoldingServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30.0)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake", "vocab_size": VOCAB_SIZE}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = tuple(body["prompt"])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.events.append(("start", prompt))
        await self._wait_for_batch()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        count = body["max_tokens"]
        for i, token in enumerate(answer(prompt, count)):
            choice = {"text": "a", "token_ids": [token],
                      "finish_reason": "length" if i == count - 1 else None}
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        self.events.append(("end", prompt))
        self.in_flight -= 1
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _wait_for_batch(self) -> None:
        event = asyncio.Event()
        self._batch.append(event)
        self._arrived += 1
        if len(self._batch) >= self.hold_for or self._arrived >= self.expected:
            for waiting in self._batch:
                waiting.set()
            self._batch = []
        await event.wait()


def answer(prompt: tuple[int, ...], count: int) -> list[int]:
    """The tokens the server generates for a prompt: they differ between prompts."""
    return [3 + (sum(prompt) + 7 * i) % (VOCAB_SIZE - 3) for i in range(count)]
