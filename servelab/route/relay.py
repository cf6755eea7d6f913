"""The router's way back: an upstream's answer relayed to the client (server-sent events
event by event, anything else whole) with its status and its header bytes unchanged.

A stream that breaks off after its first event (or outlives the request's time budget) ends
as `servelab serve` ends its own failed streams: an error event, then `data: [DONE]`; it is
never replayed, since the client has tokens. Events are relayed whole, so a break never
leaves the client half an event in front of the error event.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from servelab.route.attempt import TRANSPORT_ERRORS, Answer, events_end
from servelab.route.retry import sleep_until
from servelab.route.upstreams import Upstream, request_failed
from servelab.serve.protocol import SSE_DONE, ApiError, error_body, sse

if TYPE_CHECKING:
    from servelab.route.state import RouteState

# Per-connection headers (RFC 9110 7.6.1) and those the HTTP libraries set themselves.
HOP_HEADERS = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
    "content-encoding", "accept-encoding", "date", "server"))
SSE_DONE_LINE = SSE_DONE.rstrip()  # b"data: [DONE]"


def relay(state: RouteState, upstream: Upstream, answer: Answer, until: float) -> Response:
    """The upstream's answer as the router's: streamed on if it is an event stream (until
    `until` on the state's clock, the request's total budget), else whole."""
    response = answer.response
    if answer.streaming or response.content_type == "text/event-stream":
        return with_upstream_headers(_EventRelay(state, upstream, answer, until), response)
    response.release()  # the body is all read: the connection goes back to the pool
    upstream.end(answer.ticket)
    return with_upstream_headers(Response(answer.head, response.status), response)


def discard(upstream: Upstream, answer: Answer) -> None:
    """Drop an answer that will not be relayed (the request goes elsewhere)."""
    close(answer.response, complete=not answer.streaming)
    upstream.end(answer.ticket)


class _EventRelay(StreamingResponse):
    """Server-sent events relayed as whole events arrive. However the relay ends (the
    stream finished, the client went away, the router is stopping), the upstream response
    is closed and the request stops counting as in flight."""

    def __init__(self, state: RouteState, upstream: Upstream, answer: Answer,
                 until: float) -> None:
        super().__init__(self._chunks(), answer.response.status)
        self._state, self._upstream, self._answer = state, upstream, answer
        self._until = until

    async def _chunks(self):
        answer, state = self._answer, self._state
        end = events_end(answer.head)
        yield answer.head[:end]  # at least one event: attempt() waited for it
        pending, done_sent = answer.head[end:], answer.head[:end].rstrip().endswith(SSE_DONE_LINE)
        content = answer.response.content
        # One timer for the stream, not one per read: a stream reads once per token.
        watchdog = asyncio.ensure_future(self._spend_budget(content))
        try:
            while data := await content.readany():
                pending += data
                end = events_end(pending)
                if end:
                    done_sent = pending[:end].rstrip().endswith(SSE_DONE_LINE)
                    yield pending[:end]
                    pending = pending[end:]
            if pending:  # ended cleanly inside an event: the upstream's own choice
                yield pending
        except (*TRANSPORT_ERRORS, BudgetSpent) as exc:  # the status is sent: say it in-stream
            if not done_sent:
                yield _stream_error(state, self._upstream, exc)
        finally:
            watchdog.cancel()

    async def _spend_budget(self, content: aiohttp.StreamReader) -> None:
        """At the end of the request's budget, fail the read under way (or the next)."""
        await sleep_until(self._state.clock, self._until, self._state.clock_step_s)
        content.set_exception(BudgetSpent("the request's time budget ran out mid-stream"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            response = self._answer.response
            close(response, complete=response.content.at_eof())
            self._upstream.end(self._answer.ticket)


class BudgetSpent(Exception):
    """The request's total budget ran out while its stream was being relayed."""


def _stream_error(state: RouteState, upstream: Upstream, exc: Exception) -> bytes:
    """The error event and [DONE] that end a stream broken off after its first event (such
    a stream is never replayed: the client has its first tokens)."""
    if isinstance(exc, BudgetSpent):
        message, code = str(exc), "gateway_timeout"
    else:
        request_failed(upstream, state.metrics, state.clock(), "transport",
                       str(exc) or type(exc).__name__)
        message, code = f"upstream {upstream.url} broke off the stream: {exc}", "bad_gateway"
    return sse(error_body(message, "server_error", code=code)) + SSE_DONE


def close(response: aiohttp.ClientResponse, complete: bool) -> None:
    """Keep the connection for reuse after a complete body; otherwise close it (the
    upstream sees the disconnect and aborts the request)."""
    if complete:
        response.release()
    else:
        response.close()


def with_upstream_headers(out: Response, response: aiohttp.ClientResponse) -> Response:
    """`out` with the upstream's end-to-end headers as the bytes it sent (a str round trip
    would re-encode non-ASCII values)."""
    out.raw_headers.extend((k, v) for k, v in response.raw_headers
                           if k.decode("latin-1").lower() not in HOP_HEADERS)
    return out


def client_gone() -> Response:
    """The answer to a client that has left: nobody reads it (nginx's 499)."""
    return Response(status_code=499)


def bad_gateway(message: str) -> ApiError:
    return ApiError(502, message, type_="server_error", code="bad_gateway")
