"""The router's request path: pick an upstream with sim.router, forward the body unchanged,
relay the answer (server-sent events chunk by chunk, anything else whole) with its status.

A refused connection (the request never reached the upstream) is retried once on the next
best upstream; a failure after the request was sent is a 502, never a retry, since the
upstream may already be generating. Closing a relayed response early closes the upstream
connection, which is how a vLLM-style server learns to abort the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from serve.api import check_bearer, parse_body
from serve.completions import read_body
from serve.protocol import ApiError, error_body, sse
from serve.route_prefix import PrefixIndex, PromptBlocks, kv_tokens_estimate, prompt_blocks
from serve.route_upstreams import CONNECT_ERRORS, RouteMetrics, Ticket, Upstream
from sim.router import Router, RouterConfig

# Per-connection headers (RFC 9110 7.6.1) and those the HTTP libraries set themselves.
_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
                  "content-length", "content-encoding", "accept-encoding", "date", "server"))
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
T = TypeVar("T")


@dataclass(frozen=True)
class RouteConfig:
    """The upstreams, the routing policy and the limits of `servelab route`."""

    upstreams: tuple[str, ...]  # base URLs, e.g. http://127.0.0.1:8001
    router: RouterConfig = field(default_factory=RouterConfig)
    metrics_interval_s: float = 0.5  # how often each upstream's /metrics is read
    api_key: str | None = None  # required from clients as `Authorization: Bearer KEY`
    prefix_block_tokens: int = 16  # prefix index block, in tokens (text: x BYTES_PER_TOKEN)
    prefix_max_keys: int = 1 << 20  # prefix index entries kept (LRU)
    max_body_bytes: int = 1 << 24  # larger request bodies get 413 without being forwarded
    connect_timeout_s: float = 5.0  # a connection not made by then counts as refused
    read_timeout_s: float = 600.0  # longest silence of an upstream mid-response

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("route: give at least one upstream URL")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")) or url != url.rstrip("/"):
                raise ValueError(f"route: upstream {url!r} must be an http(s):// base URL "
                                 "without a trailing slash")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"route: upstreams repeat: {', '.join(self.upstreams)}")
        for key in ("metrics_interval_s", "connect_timeout_s", "read_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"route: {key} must be > 0, got {getattr(self, key)}")
        for key in ("prefix_block_tokens", "prefix_max_keys", "max_body_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"route: {key} must be >= 1, got {getattr(self, key)}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("route: api_key must not be empty (omit it to disable auth)")


@dataclass
class RouteState:
    """What the handlers share; only the router's event loop touches it."""

    config: RouteConfig
    router: Router
    upstreams: list[Upstream]
    index: PrefixIndex
    metrics: RouteMetrics
    session: aiohttp.ClientSession | None = None  # opened on the event loop, at startup

    @classmethod
    def create(cls, config: RouteConfig) -> RouteState:
        """A fresh state: every upstream unread, the prefix index empty."""
        upstreams = [Upstream(url, i) for i, url in enumerate(config.upstreams)]
        return cls(config, Router(config.router), upstreams, PrefixIndex(config.prefix_max_keys),
                   RouteMetrics())


def authorize(state: RouteState, http: HttpRequest) -> None:
    """401 unless the client sent the router's key (when it has one)."""
    key = state.config.api_key
    check_bearer(http.headers.get("authorization", ""), key.encode("utf-8") if key else None)


def pick_upstream(state: RouteState, blocks: PromptBlocks | None,
                  exclude: Upstream | None = None) -> Upstream | None:
    """The router's choice among the reachable upstreams (all of them if none is), less
    `exclude`; None if nothing is left."""
    others = [u for u in state.upstreams if u is not exclude]
    candidates = [u for u in others if u.reachable] or others
    if not candidates:
        return None
    router = state.router
    prompt_len = max(blocks.prompt_len, 1) if blocks is not None else 1
    if not router.needs_loads:
        return candidates[router.choose(prompt_len, len(candidates))]
    runs = [0] * len(state.upstreams)
    if blocks is not None:
        runs = state.index.matched_blocks(blocks.keys, len(state.upstreams))
    block_len = blocks.block_len if blocks is not None else 0
    loads = [u.load(runs[u.index] * block_len) for u in candidates]
    return candidates[router.choose(prompt_len, loads)]


async def forward(state: RouteState, http: HttpRequest, path: str) -> Response:
    """POST `path` to the chosen upstream (retried once elsewhere if refused) and relay it."""
    authorize(state, http)
    raw = await read_body(http, state.config.max_body_bytes)
    body = parse_body(path, raw)  # refused here as the upstream would; forwarded as sent
    blocks = None
    if state.router.needs_prefix:
        blocks = prompt_blocks(body, state.config.prefix_block_tokens)
    kv_tokens = kv_tokens_estimate(body) if state.router.needs_loads else 0
    headers = {k: v for k, v in http.headers.items() if k not in _HOP}
    refused: list[str] = []
    upstream = pick_upstream(state, blocks)
    while upstream is not None:
        ticket = upstream.begin(kv_tokens)
        sending = state.session.post(f"{upstream.url}{path}", data=raw, headers=headers)
        try:
            # A non-streamed answer's headers come only when it is complete: watch the
            # client meanwhile, so one that leaves aborts the request upstream too.
            response = await _unless_disconnected(http, sending)
        except CONNECT_ERRORS as exc:
            upstream.end(ticket)
            _count_error(state, upstream, "connect")
            upstream.set_reachable(False, str(exc))
            refused.append(f"{upstream.url}: {exc}")
            upstream = pick_upstream(state, blocks, upstream) if len(refused) < 2 else None
            continue
        except _TRANSPORT_ERRORS as exc:
            upstream.end(ticket)
            _count_error(state, upstream, "transport")
            raise _bad_gateway(f"upstream {upstream.url} failed: {exc}") from None
        state.metrics.requests.labels(upstream.url).inc()
        if response is None:
            upstream.end(ticket)
            return _client_gone()
        upstream.set_reachable(True)
        if blocks is not None and response.status == 200:
            state.index.record(blocks.keys, upstream.index)
        return await _relay(state, http, upstream, ticket, response)
    raise _bad_gateway("no upstream accepted the connection: " + "; ".join(refused))


async def fetch_models(state: RouteState, http: HttpRequest) -> Response:
    """GET /v1/models from the first upstream that answers (reachable ones first)."""
    authorize(state, http)
    headers = {k: v for k, v in http.headers.items() if k not in _HOP}
    timeout = aiohttp.ClientTimeout(total=state.config.connect_timeout_s + 5.0)
    for upstream in sorted(state.upstreams, key=lambda u: not u.reachable):
        try:
            async with state.session.get(f"{upstream.url}/v1/models", headers=headers,
                                         timeout=timeout) as response:
                if response.status < 500:
                    return Response(await response.read(), response.status,
                                    _response_headers(response))
        except CONNECT_ERRORS as exc:
            upstream.set_reachable(False, str(exc))
        except _TRANSPORT_ERRORS:
            continue
    raise _bad_gateway("no upstream answered GET /v1/models")


async def _relay(state: RouteState, http: HttpRequest, upstream: Upstream, ticket: Ticket,
                 response: aiohttp.ClientResponse) -> Response:
    """The upstream's answer as the router's: streamed if it is an event stream."""
    if response.status >= 500:
        _count_error(state, upstream, "http_5xx")
    if response.status == 200 and response.content_type == "text/event-stream":
        return _EventRelay(state, upstream, ticket, response)
    body: bytes | None = None
    try:
        body = await _unless_disconnected(http, response.read())
    except _TRANSPORT_ERRORS as exc:
        _count_error(state, upstream, "transport")
        raise _bad_gateway(f"upstream {upstream.url} broke off its response: {exc}") from None
    finally:
        _close(response, complete=body is not None)
        upstream.end(ticket)
    if body is None:
        return _client_gone()
    return Response(body, response.status, _response_headers(response))


async def _unless_disconnected(http: HttpRequest, work: Awaitable[T]) -> T | None:
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
    """Server-sent events relayed as each network read arrives. However the relay ends (the
    stream finished, the client went away, the router is stopping), the upstream response
    is closed and the request stops counting as in flight."""

    def __init__(self, state: RouteState, upstream: Upstream, ticket: Ticket,
                 response: aiohttp.ClientResponse) -> None:
        super().__init__(self._chunks(), 200, _response_headers(response))
        self._state, self._upstream, self._ticket = state, upstream, ticket
        self._response = response

    async def _chunks(self):
        try:
            async for data in self._response.content.iter_any():
                yield data
        except _TRANSPORT_ERRORS as exc:  # the status is sent: report it in-stream
            _count_error(self._state, self._upstream, "transport")
            message = f"upstream {self._upstream.url} broke off the stream: {exc}"
            yield sse(error_body(message, "server_error", code="bad_gateway"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _close(self._response, complete=self._response.content.at_eof())
            self._upstream.end(self._ticket)


def _close(response: aiohttp.ClientResponse, complete: bool) -> None:
    """Keep the connection for reuse after a complete body; otherwise close it (the
    upstream sees the disconnect and aborts the request)."""
    if complete:
        response.release()
    else:
        response.close()


def _response_headers(response: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _HOP}


def _client_gone() -> Response:
    """The answer to a client that has left: nobody reads it (nginx's 499)."""
    return Response(status_code=499)


def _count_error(state: RouteState, upstream: Upstream, kind: str) -> None:
    state.metrics.errors.labels(upstream.url, kind).inc()


def _bad_gateway(message: str) -> ApiError:
    return ApiError(502, message, type_="server_error", code="bad_gateway")
