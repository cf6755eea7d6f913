"""The router's request path: pick an upstream in rotation with sim.cluster.router, forward the body
and headers unchanged, and hand the answer to servelab/route/relay.py.

A request that never reached an upstream (connection refused or not made in time) goes on to
the next best upstream, each tried once; a failure after the request was sent (no response
headers within the first-byte timeout, a broken connection) is a 504 or 502, never a retry,
since the upstream may already be generating. Every outcome feeds the upstream's health
(servelab/route/health.py). Closing a relayed response early closes the upstream connection,
which is how a vLLM-style server learns to abort the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from multidict import CIMultiDict

from servelab.route.health import Health, HealthConfig
from servelab.route.metrics import RouteMetrics
from servelab.route.prefix import PrefixIndex, PromptBlocks, kv_tokens_estimate, prompt_blocks
from servelab.route.relay import (
    HOP_HEADERS,
    TRANSPORT_ERRORS,
    bad_gateway,
    client_gone,
    relay,
    unless_disconnected,
    with_upstream_headers,
)
from servelab.route.upstreams import (
    CONNECT_ERRORS,
    Upstream,
    request_failed,
    request_succeeded,
)
from servelab.serve.api import check_bearer, parse_body
from servelab.serve.completions import read_body
from servelab.serve.protocol import ApiError
from sim.cluster.router import Router, RouterConfig


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
    # From the start of a streamed request to the upstream's response headers, connecting
    # included. A non-streamed answer's headers come only with the whole answer, so those
    # are bounded by read_timeout_s alone: a long generation is not a sick upstream.
    first_byte_timeout_s: float = 60.0
    health: HealthConfig = field(default_factory=HealthConfig)  # checks and ejection

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("route: give at least one upstream URL")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")) or url != url.rstrip("/"):
                raise ValueError(f"route: upstream {url!r} must be an http(s):// base URL "
                                 "without a trailing slash")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"route: upstreams repeat: {', '.join(self.upstreams)}")
        for key in ("metrics_interval_s", "connect_timeout_s", "read_timeout_s",
                    "first_byte_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"route: {key} must be > 0, got {getattr(self, key)}")
        for key in ("prefix_block_tokens", "prefix_max_keys", "max_body_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"route: {key} must be >= 1, got {getattr(self, key)}")
        if not self.first_byte_timeout_s > self.connect_timeout_s:
            raise ValueError(f"route: first_byte_timeout_s ({self.first_byte_timeout_s}) must "
                             f"be > connect_timeout_s ({self.connect_timeout_s}), which it "
                             "includes")
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
    clock: Callable[[], float] = time.monotonic  # seconds; health and back-offs read it

    @classmethod
    def create(cls, config: RouteConfig,
               clock: Callable[[], float] = time.monotonic) -> RouteState:
        """A fresh state: every upstream unread and in rotation, the prefix index empty."""
        upstreams = [Upstream(url, i, health=Health(config.health))
                     for i, url in enumerate(config.upstreams)]
        return cls(config, Router(config.router), upstreams, PrefixIndex(config.prefix_max_keys),
                   RouteMetrics(), clock=clock)


def authorize(state: RouteState, http: HttpRequest) -> None:
    """401 unless the client sent the router's key (when it has one)."""
    key = state.config.api_key
    check_bearer(http.headers.get("authorization", ""), key.encode("utf-8") if key else None)


def forwarded_headers(http: HttpRequest) -> CIMultiDict[str]:
    """The client's end-to-end headers, repeats kept, each UTF-8 value as the bytes sent.

    Starlette decodes header bytes as latin-1 and aiohttp encodes str values as UTF-8, so a
    value is decoded as UTF-8 here to reach the upstream unchanged. A value that is not
    UTF-8 cannot pass through aiohttp unchanged; it goes as its latin-1 reading (so the
    upstream answers it as it would a direct request, only with those bytes re-encoded)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for raw_name, raw_value in http.scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name in HOP_HEADERS:
            continue
        try:
            headers.add(name, raw_value.decode("utf-8"))
        except UnicodeDecodeError:
            headers.add(name, raw_value.decode("latin-1"))
    return headers


def pick_upstream(state: RouteState, blocks: PromptBlocks | None,
                  tried: tuple[Upstream, ...] = ()) -> Upstream | None:
    """The router's choice among the upstreams in rotation (all of them if none is: a
    panic, as Envoy routes to every host when too few are healthy), less those already
    `tried`; None if nothing is left."""
    now = state.clock()
    others = [u for u in state.upstreams if u not in tried]
    candidates = [u for u in others if u.routable(now)] or others
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
    """POST `path` to the chosen upstream (elsewhere while none is reached) and relay it."""
    authorize(state, http)
    raw = await read_body(http, state.config.max_body_bytes)
    body = parse_body(path, raw)  # refused here as the upstream would; forwarded as sent
    blocks = None
    if state.router.needs_prefix:
        blocks = prompt_blocks(body, state.config.prefix_block_tokens)
    kv_tokens = kv_tokens_estimate(body) if state.router.needs_loads else 0
    headers = forwarded_headers(http)
    cfg = state.config
    headers_within_s = cfg.first_byte_timeout_s if body.get("stream") is True else None
    return await _send(state, http, path, raw, headers, blocks, kv_tokens, headers_within_s)


async def _send(state: RouteState, http: HttpRequest, path: str, raw: bytes,
                headers: CIMultiDict[str], blocks: PromptBlocks | None,
                kv_tokens: int, headers_within_s: float | None) -> Response:
    """Try upstreams until one is reached, then relay its answer."""
    tried: tuple[Upstream, ...] = ()
    refused: list[str] = []
    upstream = pick_upstream(state, blocks)
    while upstream is not None:
        tried += (upstream,)
        ticket = upstream.begin(kv_tokens)
        try:
            response = await _post(state, http, f"{upstream.url}{path}", raw, headers,
                                   headers_within_s)
        except CONNECT_ERRORS as exc:  # the request never left the router: try another
            upstream.end(ticket)
            upstream.set_reachable(False, str(exc))
            request_failed(upstream, state.metrics, state.clock(), "connect", str(exc))
            refused.append(f"{upstream.url}: {exc}")
            upstream = pick_upstream(state, blocks, tried)
            if upstream is not None:
                state.metrics.retries.labels(tried[-1].url).inc()
            continue
        except TRANSPORT_ERRORS as exc:
            upstream.end(ticket)
            raise _failed_after_sending(state, upstream, exc, headers_within_s) from None
        state.metrics.requests.labels(upstream.url).inc()
        if response is None:
            upstream.end(ticket)
            return client_gone()
        _count_answer(state, upstream, response.status)
        if blocks is not None and response.status == 200:
            state.index.record(blocks.keys, upstream.index)
        return await relay(state, http, upstream, ticket, response)
    raise bad_gateway("no upstream accepted the connection: " + "; ".join(refused))


async def _post(state: RouteState, http: HttpRequest, url: str, raw: bytes,
                headers: CIMultiDict[str], within_s: float | None
                ) -> aiohttp.ClientResponse | None:
    """The upstream's response, once its headers are in (None if the client left first).
    A non-streamed answer's headers come only when it is complete: the client is watched
    meanwhile, so one that leaves aborts the request upstream too."""
    sending = state.session.post(url, data=raw, headers=headers)
    return await asyncio.wait_for(unless_disconnected(http, sending), within_s)


def _failed_after_sending(state: RouteState, upstream: Upstream, exc: Exception,
                          limit_s: float | None) -> ApiError:
    """Count a request that may have reached the upstream and then failed; the error for
    the client (never retried: the upstream may be generating)."""
    now = state.clock()
    if isinstance(exc, aiohttp.ClientError):  # aiohttp's own read timeouts included
        request_failed(upstream, state.metrics, now, "transport", str(exc))
        return bad_gateway(f"upstream {upstream.url} failed: {exc}")
    request_failed(upstream, state.metrics, now, "first_byte_timeout",
                   f"no response headers within {limit_s} s")
    return ApiError(504, f"upstream {upstream.url} sent no response headers within "
                    f"{limit_s} s", type_="server_error", code="gateway_timeout")


def _count_answer(state: RouteState, upstream: Upstream, status: int) -> None:
    """An answer is a success for the upstream's health unless it is a 5xx."""
    upstream.set_reachable(True)
    if status >= 500:
        request_failed(upstream, state.metrics, state.clock(), "http_5xx", f"HTTP {status}")
    else:
        request_succeeded(upstream, state.clock())


async def fetch_models(state: RouteState, http: HttpRequest) -> Response:
    """GET /v1/models from the first upstream that answers (those in rotation first)."""
    authorize(state, http)
    headers = forwarded_headers(http)
    timeout = aiohttp.ClientTimeout(total=state.config.connect_timeout_s + 5.0)
    now = state.clock()
    for upstream in sorted(state.upstreams, key=lambda u: not u.routable(now)):
        try:
            async with state.session.get(f"{upstream.url}/v1/models", headers=headers,
                                         timeout=timeout) as response:
                if response.status < 500:
                    return with_upstream_headers(Response(await response.read(),
                                                          response.status), response)
        except CONNECT_ERRORS as exc:
            upstream.set_reachable(False, str(exc))
        except TRANSPORT_ERRORS:
            continue
    raise bad_gateway("no upstream answered GET /v1/models")
