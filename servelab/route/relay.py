"""The router's way back: an upstream's answer relayed to the client (server-sent events
event by event, anything else whole) with its status and its header bytes unchanged.

A stream the upstream breaks off ends as `servelab serve` ends its own failed streams: an
error event, then `data: [DONE]`. Events are relayed whole, so a break never leaves the
client half an event in front of the error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

import aiohttp
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from servelab.route.upstreams import Ticket, Upstream, request_failed
from servelab.serve.protocol import SSE_DONE, ApiError, error_body, sse

if TYPE_CHECKING:
    from servelab.route.proxy import RouteState

# Per-connection headers (RFC 9110 7.6.1) and those the HTTP libraries set themselves.
HOP_HEADERS = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
    "content-encoding", "accept-encoding", "date", "server"))
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
T = TypeVar("T")


async def relay(state: RouteState, http: HttpRequest, upstream: Upstream, ticket: Ticket,
                response: aiohttp.ClientResponse) -> Response:
    """The upstream's answer as the router's: streamed if it is an event stream."""
    if response.status == 200 and response.content_type == "text/event-stream":
        return with_upstream_headers(_EventRelay(state, upstream, ticket, response), response)
    body: bytes | None = None
    try:
        body = await unless_disconnected(http, response.read())
    except TRANSPORT_ERRORS as exc:
        request_failed(upstream, state.metrics, state.clock(), "transport", str(exc))
        raise bad_gateway(f"upstream {upstream.url} broke off its response: {exc}") from None
    finally:
        _close(response, complete=body is not None)
        upstream.end(ticket)
    if body is None:
        return client_gone()
    return with_upstream_headers(Response(body, response.status), response)


async def unless_disconnected(http: HttpRequest, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None as soon as the client disconnects (`work` is cancelled,
    which closes its upstream connection)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        gone = not task.done()
        if gone:
            task.cancel()
    return None if gone else task.result()


async def _disconnected(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


class _EventRelay(StreamingResponse):
    """Server-sent events relayed as whole events arrive. However the relay ends (the
    stream finished, the client went away, the router is stopping), the upstream response
    is closed and the request stops counting as in flight."""

    def __init__(self, state: RouteState, upstream: Upstream, ticket: Ticket,
                 response: aiohttp.ClientResponse) -> None:
        super().__init__(self._chunks(), 200)
        self._state, self._upstream, self._ticket = state, upstream, ticket
        self._response = response

    async def _chunks(self):
        pending, done_sent = b"", False
        try:
            async for data in self._response.content.iter_any():
                pending += data
                end = _events_end(pending)
                if end:
                    done_sent = pending[:end].rstrip().endswith(b"data: [DONE]")
                    yield pending[:end]
                    pending = pending[end:]
            if pending:  # ended cleanly inside an event: the upstream's own choice
                yield pending
        except TRANSPORT_ERRORS as exc:  # the status is sent: report it in-stream
            upstream = self._upstream
            request_failed(upstream, self._state.metrics, self._state.clock(), "transport",
                           str(exc) or type(exc).__name__)
            if not done_sent:
                message = f"upstream {upstream.url} broke off the stream: {exc}"
                yield sse(error_body(message, "server_error", code="bad_gateway")) + SSE_DONE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _close(self._response, complete=self._response.content.at_eof())
            self._upstream.end(self._ticket)


def _events_end(data: bytes) -> int:
    """Where the last complete event of `data` ends (0: none is complete yet)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _close(response: aiohttp.ClientResponse, complete: bool) -> None:
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
