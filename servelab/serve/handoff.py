"""Thread-safe hand-off between the engine thread and the asyncio side of the server.

asyncio queues are not thread-safe: only the thread running their event loop may touch them.
So each request creates its queue inside the running loop (TokenSink), and the engine thread
hands events over with loop.call_soon_threadsafe, whose callback does queue.put_nowait on the
loop's own thread. One call carries all of a step's events for one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass

from sim.engine.core import FinishReason


class Overloaded(Exception):
    """The waiting queue is full: answer 503 and ask the client to retry."""


class Draining(Exception):
    """The server is shutting down and admits nothing new."""


class Clock:
    """Seconds since server start on the monotonic clock, and the wall clock at start."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.start_unix = time.time()

    def now(self) -> float:
        return time.monotonic() - self._t0


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """New tokens of one request and, on its last event, why it ended."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    detail: str = ""  # why a request failed or was rejected


class TokenSink:
    """The asyncio side of one request; create it inside the loop that will read it."""

    def __init__(self, wait_durable: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        # Resolved once the request's log row is committed; None when nothing is logged.
        self.durable: asyncio.Future[None] | None = (
            self.loop.create_future() if wait_durable else None
        )

    def mark_durable(self) -> None:
        """Thread-safe: resolve `durable` on the loop (a closed loop has nobody waiting)."""
        if self.durable is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(_resolve, self.durable)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _put_all(items: list[tuple[asyncio.Queue[StreamEvent], StreamEvent]]) -> None:
    for queue, event in items:  # runs on the event loop's thread
        queue.put_nowait(event)


def post_events(events: list[tuple[TokenSink, StreamEvent]]) -> None:
    """From any thread: deliver events to their sinks, one loop callback per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
    for sink, event in events:
        by_loop[sink.loop].append((sink.queue, event))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: its clients are gone
            loop.call_soon_threadsafe(_put_all, items)
