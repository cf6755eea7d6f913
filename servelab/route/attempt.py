"""One try of a request at one upstream, up to the point where the client would first see a
byte: a non-streamed answer read whole, a stream's headers and first complete event.

Until then nothing has reached the client, so the try can be given up and the request sent
elsewhere. A try ends with the first of: the answer, a failure, its deadline, the upstream's
ejection, or the client leaving. Whatever it gives up, it closes the upstream connection,
which is how a vLLM-style server learns to abort the request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from fastapi import Request as HttpRequest
from multidict import CIMultiDict

from servelab.route.retry import sleep_until
from servelab.route.state import RouteState
from servelab.route.upstreams import CONNECT_ERRORS, Ticket, Upstream

TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass(frozen=True)
class Answer:
    """An upstream's answer, read up to what the client gets first."""

    response: aiohttp.ClientResponse
    head: bytes  # the whole body, or a stream's first complete events
    streaming: bool  # an event stream whose rest is still to be relayed
    ticket: Ticket  # the upstream still counts the request in flight until the answer ends


@dataclass(frozen=True)
class Failure:
    """Why a try got no answer fit to relay. `kind` names it for metrics and retries:
    connect, timeout, transport, invalid, ejected."""

    kind: str
    message: str


@dataclass(frozen=True)
class Try:
    """Where to send one try and what it carries."""

    upstream: Upstream
    url: str
    raw: bytes  # the body as the client sent it
    headers: CIMultiDict[str]
    streamed: bool  # the client asked for a stream
    kv_tokens: int  # the load estimate the upstream carries while the try is in flight
    deadline: float  # on the state's clock: the answer (or a stream's first event) by then
    limit_s: float  # the deadline, counted from the try's start (for messages)
    can_move: Callable[[], bool]  # whether another upstream could take the request now


async def attempt(state: RouteState, http: HttpRequest, t: Try) -> Answer | Failure | None:
    """Send one try and wait for the first of its outcomes; None if the client left."""
    upstream = t.upstream
    ticket = upstream.begin(t.kv_tokens)
    ejected = asyncio.Event()
    upstream.unanswered.add(ejected)
    exchange = asyncio.ensure_future(_exchange(state.session, t, ticket))
    gone = asyncio.ensure_future(_disconnected(http))
    others = [gone, asyncio.ensure_future(ejected.wait()),
              asyncio.ensure_future(sleep_until(state.clock, t.deadline, state.clock_step_s))]
    try:
        waiting = {exchange, *others}
        while True:
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            # An ejection with nowhere else to go: the try waits on (its deadline still holds).
            if done != {others[1]} or t.can_move():
                break
    except BaseException:  # the handler is cancelled (the router is stopping)
        if exchange.done() and not exchange.cancelled() and exchange.exception() is None:
            exchange.result().response.close()
        upstream.end(ticket)
        raise
    finally:
        upstream.unanswered.discard(ejected)
        for task in others:
            task.cancel()
        if not exchange.done():
            exchange.cancel()  # closes the upstream connection (see _exchange)
    outcome = _outcome(exchange, t) if exchange.done() and not exchange.cancelled() else None
    if outcome is None and not gone.done():
        outcome = Failure("timeout", f"upstream {upstream.url} sent no answer within "
                          f"{t.limit_s:.3g} s") if others[2].done() \
            else Failure("ejected", f"upstream {upstream.url} was ejected")
    if not isinstance(outcome, Answer):
        upstream.end(ticket)
    return outcome


def _outcome(exchange: asyncio.Future, t: Try) -> Answer | Failure:
    try:
        return exchange.result()
    except CONNECT_ERRORS as exc:
        return Failure("connect", f"{t.upstream.url}: {exc}")
    except TRANSPORT_ERRORS as exc:
        return Failure("transport", f"upstream {t.upstream.url} failed: "
                       f"{exc or type(exc).__name__}")
    except _Invalid as exc:
        return Failure("invalid", f"upstream {t.upstream.url} answered {exc}")


class _Invalid(Exception):
    """An answer that cannot be what the client asked for."""


async def _exchange(session: aiohttp.ClientSession, t: Try, ticket: Ticket) -> Answer:
    """POST the try and read its answer up to what the client gets first."""
    response = await session.post(t.url, data=t.raw, headers=t.headers)
    try:
        if t.streamed and response.status == 200 \
                and response.content_type == "text/event-stream":
            head = await _first_events(response.content)
            if not events_end(head):
                raise _Invalid("an event stream that ended before its first event")
            return Answer(response, head, not response.content.at_eof(), ticket)
        body = await response.read()
        if response.status == 200 and response.content_type == "application/json":
            _check_json(body)
    except BaseException:  # cancelled included: the upstream must see the request go
        response.close()
        raise
    return Answer(response, body, False, ticket)


async def _first_events(content: aiohttp.StreamReader) -> bytes:
    """Read until at least one whole event is in (or the body ends)."""
    head = b""
    while not events_end(head):
        data = await content.readany()
        if not data:
            break
        head += data
    return head


def _check_json(body: bytes) -> None:
    try:
        json.loads(body)
    except ValueError:
        raise _Invalid(f"200 with a body that is not JSON ({body[:40]!r})") from None


def events_end(data: bytes) -> int:
    """Where the last complete event of `data` ends (0: none is complete yet)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


async def _disconnected(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
