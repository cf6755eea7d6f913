"""Points run one at a time, several searches side by side: each worker starts its next
point as soon as it is free, chosen from every row so far (servelab.sweeps.runners' runners, or
any plain runner of points -> rows, one point per call)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol


class Stream(Protocol):
    """Points one at a time: submit starts one (a handle), wait returns, in the order given,
    each handle of those given that has finished (at least one) with its row; slots: how
    many points in flight keep it busy."""

    slots: int

    def submit(self, point: Any) -> Any: ...

    def wait(self, handles: Sequence[Any]) -> list[tuple[Any, dict]]: ...


class InlineStream:
    """A plain runner (points -> rows in order) as a Stream: a point runs when submitted."""

    slots = 1  # (nothing gained by more in flight)

    def __init__(self, runner: Callable[[Sequence[Any]], list[dict]]) -> None:
        self.runner = runner

    def submit(self, point: Any) -> Future:
        future: Future = Future()
        future.set_result(self.runner([point])[0])
        return future

    def wait(self, handles: Sequence[Future]) -> list[tuple[Future, dict]]:
        return [(handle, handle.result()) for handle in handles]


# A search as a generator: it yields the points it needs next (all at once, or none) and is
# sent their rows in the same order; what it returns is its answer.
Search = Generator[list[Any], list[dict], Any]


def drive(stream: Stream, searches: Sequence[Search], slots: int) -> list[Any]:
    """Run searches side by side with up to `slots` points in flight: each starts as
    another ends, the earliest search's first. Returns each search's answer, in order."""
    answers: list[Any] = [None] * len(searches)
    asked: dict[int, list[dict | None]] = {}  # search -> rows of its last request so far
    queue: deque[tuple[int, int, Any]] = deque()  # (search, place in its request, point)
    in_flight: dict[Any, tuple[int, int]] = {}

    def advance(i: int, rows: list[dict] | None) -> None:
        while True:
            try:
                points = searches[i].send(rows)
            except StopIteration as stop:
                answers[i] = stop.value
                return
            if points:
                asked[i] = [None] * len(points)
                queue.extend((i, j, point) for j, point in enumerate(points))
                return
            rows = []  # (it needs nothing run: resume it at once)

    for i in range(len(searches)):
        advance(i, None)
    while queue or in_flight:
        while queue and len(in_flight) < slots:
            i, j, point = queue.popleft()
            in_flight[stream.submit(point)] = (i, j)
        for handle, row in stream.wait(list(in_flight)):
            i, j = in_flight.pop(handle)
            asked[i][j] = row
            if all(r is not None for r in asked[i]):
                advance(i, asked.pop(i))
    return answers


def as_stream(runner: Any) -> Stream:
    """The runner itself if it takes points one at a time, else InlineStream of it."""
    return runner if hasattr(runner, "submit") else InlineStream(runner)
